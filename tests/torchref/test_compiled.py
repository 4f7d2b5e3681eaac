"""torchref.compiled: torch.compile's activation-memory budget, measured like the eager plans.

Two compiles of gpt-tiny (budget 1.0 and 0.05, ~4 s each on 2 cores) are shared by the module.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from jaxremat.models.params import init_params
from jaxremat.spec import parse_schedule
from jaxremat.spec.plan import parse_plan
from parity.runners.framework import get_framework
from parity.checks.compare import compare_bitwise
from parity.inputs.presets import get_preset
from torchref.memory import SavedActivationRecorder
from torchref.model import GPT
from torchref.render import model_loss

PRESET = get_preset("gpt-tiny")
CFG = PRESET.config

# torch.compile's modules (torch._dynamo, torch._inductor: ~1.3 s of imports), imported by ``_compiled_modules`` when
# the module's first test runs, not at import: every xdist worker imports (collects) every test module.
main = BACKENDS = compiled_problem = measure_compiled = check_compiled_grads = compile_backend = None
max_ulp_distance = None


@pytest.fixture(scope="module", autouse=True)
def _compiled_modules():
    global main, BACKENDS, compiled_problem, measure_compiled, check_compiled_grads, compile_backend, max_ulp_distance
    import torch._inductor.config  # noqa: F401  (torch._inductor.config.patch below)
    from parity.experiments.compiled_budget import main
    from torchref.compiled import BACKENDS, compiled_problem, measure_compiled
    from torchref.compiled_random import check_compiled_grads, compile_backend, max_ulp_distance


@pytest.fixture(scope="module")
def inputs():
    params = init_params(CFG)
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (PRESET.batch_size, PRESET.seq_len + 1))
    return params, tokens


@pytest.fixture(scope="module")
def results(inputs):
    params, tokens = inputs
    # without the random-op check (a second compile each; test_cli_prints_one_row_per_budget runs it)
    return {b: measure_compiled(CFG, params, tokens, b, repeats=1, random_op_dropout=0.0) for b in (1.0, 0.05)}


def test_a_smaller_budget_keeps_fewer_bytes(results):
    full, small = results[1.0], results[0.05]
    assert small.saved_bytes < full.saved_bytes / 4, (small.saved_bytes, full.saved_bytes)
    assert small.saved_tensors < full.saved_tensors
    # one graph per budget: the budget was in effect for the only compile
    assert full.compiles == small.compiles == 1


def test_budget_one_keeps_about_what_eager_keeps(results):
    # the default partitioner saves eager's activations less what it recomputes for free (views,
    # pointwise ops it fuses): within 5 % of eager none, never more
    full = results[1.0]
    assert 0.95 * full.eager_saved_bytes <= full.saved_bytes <= full.eager_saved_bytes


def test_recompute_flops(results):
    # FlopCounterMode counts matmuls (mm, bmm, addmm, ...) only; at budget 1.0 the min-cut partitioner
    # never recomputes a matmul (they are banned from recompute), so the compiled step's FLOPs are
    # eager none's exactly; at 0.05 it must recompute matmuls to fit (it saves under a quarter)
    assert results[1.0].recompute_flops == 0
    assert results[1.0].flops == results[1.0].eager_flops > 0
    assert results[0.05].recompute_flops > 0


def test_loss_matches_eager_none(inputs, results):
    params, tokens = inputs
    model = GPT.from_params(CFG, params)
    eager = float(model_loss(model, torch.from_numpy(tokens), parse_schedule("none")).detach())
    for r in results.values():
        assert r.loss == pytest.approx(eager, rel=1e-6, abs=0)
        assert r.max_rel_err < 1e-4, r.max_rel_err  # gradients too, relative to each array's scale
        assert r.max_ulp != 0 or r.grads_bitwise_equal


def test_peak_counters_agree(results):
    # live_bytes and MemTracker count the same step (torchref/live_bytes.py's claim, on a compiled step)
    for r in results.values():
        assert r.peak_bytes == r.memtracker_peak_bytes
        assert r.peak_activation_bytes == r.memtracker_activation_bytes
        assert r.peak_activation_bytes >= r.saved_bytes
        assert len(r.step_times_s) == 1 and r.step_time_s == r.step_times_s[0] > 0
        assert r.compile_s > 0


def test_dynamo_skips_frames_under_a_dispatch_mode_and_the_frame_saves_what_is_measured(inputs, results):
    # why measure_compiled calls the backend's compiled function directly: under FlopCounterMode
    # (a TorchDispatchMode, like LiveBytesTracker and MemTracker) dynamo will not run the frame
    params, tokens = inputs
    model = GPT.from_params(CFG, params)
    tok = torch.from_numpy(tokens)
    schedule = parse_schedule("none")
    torch._dynamo.reset()
    with torch._functorch.config.patch(activation_memory_budget=0.05):
        fn = torch.compile(lambda t: model_loss(model, t, schedule), backend=BACKENDS[0], fullgraph=True)
        fn(tok)
        recorder = SavedActivationRecorder(exclude=[*model.parameters(), *model.buffers()])
        with recorder:
            loss = fn(tok)
        del loss
        with pytest.raises(RuntimeError, match="no compiled frames"):
            with FlopCounterMode(display=False):
                fn(tok)
    assert recorder.total_bytes == results[0.05].saved_bytes


def test_points_have_their_gradients_checked_with_random_ops_included(results):
    for b, r in results.items():
        assert r.grads_ok and r.grads_rel_bound == 1e-4 and r.max_rel_err <= 1e-6
        assert r.random_ops == "save" and r.random_ops_in_graph == r.random_ops_recomputed == 0  # dropout 0
        assert compiled_problem(r) is None and r.random_op_check is None


def test_torch_budget_with_dropout_redraws_masks_and_is_shown_failing(inputs):
    # torch's own partition at budget 0.5 recomputes every dropout in the backward, with new masks
    params, tokens = inputs
    check = check_compiled_grads(CFG.replace(dropout=0.1), params, tokens, 0.5, random_ops="recompute")
    assert check.random_ops_in_graph == check.random_ops_recomputed == 13
    assert not check.grads_ok and check.max_rel_err > 0.5
    point = {"grads_ok": True, "random_op_check": dataclasses.asdict(check)}
    assert compiled_problem(point).startswith("gradients wrong with dropout 0.1: max rel err 0.")
    assert "redraws 13 of its 13 random ops" in compiled_problem(point)


def test_user_compiled_gpt_with_dropout_under_a_budget_matches_eager_with_random_ops_saved(inputs):
    params, tokens = inputs
    model = GPT.from_params(CFG.replace(dropout=0.1), params)
    tok = torch.from_numpy(tokens)
    none = parse_schedule("none")

    def grads(loss_fn):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        loss_fn(tok).backward()
        return [p.grad.clone() for p in model.parameters()]

    eager = grads(lambda t: model_loss(model, t, none))
    backend, partition = compile_backend("aot_eager_decomp_partition", random_ops="save")
    torch._dynamo.reset()
    with torch._functorch.config.patch(activation_memory_budget=0.5), \
            torch._inductor.config.patch(fallback_random=True):  # masks drawn as eager draws them
        compiled = grads(torch.compile(lambda t: model_loss(model, t, none), backend=backend))
    for a, b in zip(compiled, eager):
        assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max())
    assert partition.random_ops == 13 and partition.recomputed == 0  # embedding + 3 per layer, all saved


def test_max_ulp_is_compare_bitwise():
    rng = np.random.default_rng(1)
    ref = {"a": rng.standard_normal(50).astype(np.float32), "b": np.array([1e-12, -2.0], np.float32)}
    test = {"a": np.nextafter(ref["a"], np.float32(np.inf)), "b": np.array([-1e-12, -2.0], np.float32)}
    for t in (ref, test):
        want = compare_bitwise(t, ref)
        equal, ulp, abs_diff, _ = max_ulp_distance(t, ref)
        assert (equal, ulp, abs_diff) == (want.equal, want.max_ulp, want.max_abs_diff)
    assert max_ulp_distance(test, ref)[1] > 10**9  # a sign flip near zero: why the result also gives max_rel_err


@pytest.mark.parametrize("budget", [0, 0.0, -0.1, 1.5, float("nan"), "0.5", True])
def test_bad_budget(inputs, budget):
    params, tokens = inputs
    with pytest.raises(ValueError, match=r"budget must be a number in \(0, 1\]"):
        measure_compiled(CFG, params, tokens, budget)


def test_bad_backend_and_tokens(inputs):
    params, tokens = inputs
    with pytest.raises(ValueError, match="aot_eager_decomp_partition.*inductor"):
        measure_compiled(CFG, params, tokens, 0.5, backend="eager")
    with pytest.raises(ValueError, match="vocab_size"):  # checked eagerly: the compiled graph skips it
        measure_compiled(CFG, params, tokens + CFG.vocab_size, 0.5)
    with pytest.raises(ValueError, match="repeats"):
        measure_compiled(CFG, params, tokens, 0.5, repeats=0)
    with pytest.raises(ValueError, match=r"random_ops must be one of \('save', 'recompute'\), got 'redraw'"):
        measure_compiled(CFG, params, tokens, 0.5, random_ops="redraw")
    with pytest.raises(ValueError, match=r"random_op_dropout must be in \[0, 1\)"):
        measure_compiled(CFG, params, tokens, 0.5, random_op_dropout=1.0)


def test_cli_prints_one_row_per_budget(capsys):
    # with its random-op check: the same budget on the model with dropout 0.1, random ops saved
    assert main(["--budgets", "0.5", "--layers", "1", "--repeats", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0.5 |")]
    assert len(rows) == 1
    assert "| 0 of 0 | dropout 0.1: ok (" in rows[0] and "; 0 of 4 redrawn) |" in rows[0]  # embedding + 3 in the layer
    assert rows[0].endswith("|  |")  # no problem
    with pytest.raises(SystemExit):
        main(["--budgets", "half"])
    with pytest.raises(SystemExit):
        main(["--threads", "0"])


def test_eager_rows_are_the_depth_sweeps_measurement(inputs, results):
    # the compiled rows use the counters of the PyTorch framework's measure_plan (live_bytes + fixed
    # tensors); eager none counted by measure_compiled must be that function's number to the byte
    _, tokens = inputs
    sweep = get_framework("torch").measure_plan(CFG, tokens, parse_plan("none"), 1)
    full = results[1.0]
    assert full.eager_saved_bytes == sweep["saved_bytes"]
    assert full.eager_peak_activation_bytes == sweep["peak_activation_bytes"]
    fixed = full.peak_bytes - full.peak_activation_bytes
    assert full.eager_peak_activation_bytes + fixed == sweep["peak_bytes"]
