"""The JAX framework's run_plan (parity.runners.jax_runner): the harness's JAX door, in jit and eager modes."""

import numpy as np
import pytest

from jaxremat.memory import gpu_available
from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.plan import parse_plan
from parity.inputs.train import AdamWConfig
from parity.runners import jax_runner
from parity.runners.framework import RunOptions, get_framework
from parity.runners.result import Memory, RunResult

# n_layer 4: sqrt is segments(2) = one checkpointed 2-layer segment + a plain tail (bitwise under jit)
CFG = TransformerConfig(vocab_size=32, n_layer=4, d_model=8, n_head=2, d_ff=16, max_seq_len=4)
HP = AdamWConfig(steps=2)
TOKENS = np.random.default_rng(0).integers(0, 32, (2, 5))
none, sqrt = parse_plan("none"), parse_plan("sqrt")


def run_plan(cfg, params, tokens, plan, *, mode, hparams, **options):
    return get_framework("jax").run_plan(mode, cfg, params, tokens, plan, RunOptions(hparams=hparams, **options))


def _bitwise(a: dict, b: dict) -> bool:
    return all(np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in a)


def test_run_plan_jit_float32_fields_and_parity():
    params = init_params(CFG)
    res = run_plan(CFG, params, TOKENS, sqrt, mode="jit", hparams=HP, timing_repeats=2)
    assert isinstance(res, RunResult) and isinstance(res.memory, Memory) and res.mode == "jit"
    assert res.loss.shape == () and res.loss.dtype == np.float32
    assert set(res.grads) == set(params) == set(res.trained)
    # the unrolled reverse loop is bitwise at the default config under jit, only close at this
    # toy shape (XLA rounds its bias-gradient reductions differently; see test_reverse_loop.py)
    rl = res.reverse_loop_grads
    assert set(rl) == set(params)
    assert all(np.abs(rl[k] - res.grads[k]).max() <= 1e-6 * np.abs(res.grads[k]).max() for k in rl)
    assert not _bitwise(res.trained, params)  # the optimizer moved the weights
    mem = res.memory
    assert 0 < mem.saved_bytes < sum(r["bytes"] for r in mem.residuals)
    assert mem.saved_bytes == sum(r["bytes"] for r in mem.residuals if not r["is_argument"] and r["memory"] == "device")
    assert mem.offloaded_bytes == 0  # no policy offloads
    assert (mem.device_peak is None) == (not gpu_available())  # the allocator's peak only on a GPU
    assert mem.peak_bytes > 0 and "memory_analysis" in mem.peak_source and mem.peak_breakdown["temp_bytes"] > 0
    param_bytes = sum(v.nbytes for v in params.values())
    assert mem.peak_activation_bytes == mem.peak_bytes - 2 * param_bytes  # less parameters and gradients
    assert res.step_time_s > 0 and len(res.step_times_s) == 2 and res.dots_compiled > 0
    # cached: a second call compiles nothing new
    hits = jax_runner.programs.cache_info().hits
    run_plan(CFG, params, TOKENS, sqrt, mode="jit", hparams=HP, timing_repeats=1)
    assert jax_runner.programs.cache_info().hits > hits


@pytest.mark.jaxremat_slow
def test_run_plan_float64_runs_in_float64_and_eager_mode():
    cfg = CFG.replace(dtype="float64")
    params = init_params(cfg)
    res = run_plan(cfg, params, TOKENS, none, mode="eager", hparams=AdamWConfig(steps=1),
                                  timing_repeats=1, with_reverse_loop=False)
    assert res.mode == "eager" and res.loss.dtype == np.float64
    assert all(v.dtype == np.float64 for v in res.grads.values())
    assert all(v.dtype == np.float64 for v in res.trained.values())


def test_run_plan_rejects_bad_arguments():
    params = init_params(CFG)
    with pytest.raises(ValueError, match="mode"):
        run_plan(CFG, params, TOKENS, none, mode="fast", hparams=HP)
    with pytest.raises(ValueError, match="timing_repeats"):
        run_plan(CFG, params, TOKENS, none, mode="jit", hparams=HP, timing_repeats=0)
    with pytest.raises(ValueError, match="integer"):
        run_plan(CFG, params, TOKENS.astype(float), none, mode="jit", hparams=HP)


def test_run_plan_without_training_leaves_trained_and_time_unset():
    params = init_params(CFG)
    res = run_plan(CFG, params, TOKENS, none, mode="jit", hparams=HP, timing_repeats=1,
                                  with_training=False)
    assert res.trained is None and res.step_time_s is None and res.step_times_s is None
    assert res.memory.saved_bytes > 0 and res.reverse_loop_grads is None
