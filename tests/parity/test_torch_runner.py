"""The PyTorch framework's run_plan (parity.runners.torch_runner): the harness's PyTorch door."""

import warnings

import numpy as np
import pytest

from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.plan import parse_plan
from parity.inputs.train import AdamWConfig
from parity.runners.framework import RunOptions, get_framework
from parity.runners.result import Memory, RunResult

CFG = TransformerConfig(vocab_size=64, n_layer=3, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
TOKENS = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, CFG.max_seq_len + 1))
HPARAMS = AdamWConfig(steps=2)
none, full = parse_plan("none"), parse_plan("full")


def run_plan(cfg, params, tokens, plan, *, hparams, **options):
    return get_framework("torch").run_plan("eager", cfg, params, tokens, plan, RunOptions(hparams=hparams, **options))


@pytest.fixture(scope="module")
def results():
    params = init_params(CFG)
    return params, {s.name: run_plan(CFG, params, TOKENS, s, hparams=HPARAMS, timing_repeats=1) for s in (none, full)}


def test_run_plan_returns_a_typed_result(results):
    params, runs = results
    for run in runs.values():
        assert isinstance(run, RunResult) and isinstance(run.memory, Memory)
        assert run.mode == "eager"
        assert isinstance(run.loss, np.ndarray) and run.loss.shape == () and run.loss.dtype == np.float32
        assert set(run.grads) == set(params) == set(run.trained)
        assert all(run.grads[k].shape == v.shape and run.grads[k].dtype == v.dtype for k, v in params.items())
        mem = run.memory
        assert isinstance(mem.saved_bytes, int) and mem.saved_bytes == sum(r["bytes"] for r in mem.residuals)
        assert mem.offloaded_bytes == 0 and mem.saved_names == ()  # no policy: nothing cached
        assert isinstance(mem.peak_bytes, int) and mem.peak_bytes > 0
        assert mem.peak_source == "torch MemTracker (cpu)" and mem.peak_breakdown["PARAM"] > 0
        not_activation = sum(mem.peak_breakdown.get(k, 0) for k in ("PARAM", "BUFFER", "GRAD", "OPT"))
        assert mem.peak_activation_bytes == mem.peak_bytes - not_activation > 0
        assert run.step_time_s > 0 and len(run.step_times_s) == 1 and run.dots_compiled is None


def test_trained_differs_from_initial(results):
    params, runs = results
    for run in runs.values():
        assert all(not np.array_equal(run.trained[k], params[k]) for k in params)


def test_remat_matches_none_and_reverse_loop(results):
    _, runs = results
    assert runs["none"].reverse_loop_grads is None  # no checkpointed segment
    ref, ckpt = runs["none"], runs["full"]
    for key in ("grads", "trained", "reverse_loop_grads"):
        got = getattr(ckpt, key)
        want = getattr(ref, "grads" if key == "reverse_loop_grads" else key)
        assert all(np.array_equal(got[k].view(np.uint32), want[k].view(np.uint32)) for k in got), key
    assert ckpt.memory.saved_bytes < ref.memory.saved_bytes


def test_run_plan_with_dropout_is_reproducible():
    cfg = CFG.replace(dropout=0.2)
    params = init_params(cfg)
    a, b = (run_plan(cfg, params, TOKENS, s, hparams=AdamWConfig(steps=1), timing_repeats=1, seed=7) for s in (none, full))
    assert np.array_equal(a.loss, b.loss)
    assert all(np.array_equal(a.grads[k], b.grads[k]) for k in params)
    assert all(np.array_equal(b.reverse_loop_grads[k], b.grads[k]) for k in params)


def test_run_plan_rejects_float_tokens_and_accepts_read_only_arrays():
    params = init_params(CFG)
    with pytest.raises(ValueError, match="integer"):
        run_plan(CFG, params, TOKENS.astype(np.float32), none, hparams=HPARAMS)
    frozen = {k: v.copy() for k, v in params.items()}
    for v in frozen.values():
        v.flags.writeable = False  # as np.asarray of a jax.Array gives
    tokens = TOKENS.copy()
    tokens.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = run_plan(CFG, frozen, tokens, none, hparams=AdamWConfig(steps=1), timing_repeats=1, with_reverse_loop=False)
    assert run.reverse_loop_grads is None
