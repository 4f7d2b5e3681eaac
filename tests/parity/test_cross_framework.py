"""JAX and PyTorch agree on the same weights and real tokens, within the dtype's tolerance."""

import pytest

from jaxremat.spec import AdamWConfig, TransformerConfig, every_k, init_params
from parity import jax_runner, torch_runner
from parity.compare import max_rel_err, tolerance_for
from parity.data import token_batch


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_frameworks_agree_within_tolerance_table(dtype):
    cfg = TransformerConfig(n_layer=3, d_model=32, n_head=4, d_ff=64, max_seq_len=16, dtype=dtype)
    params, tokens = init_params(cfg, seed=3), token_batch(2, 16, seed=3)
    hp = AdamWConfig(steps=1)
    j = jax_runner.run_schedule(cfg, params, tokens, every_k(2), mode="jit", hparams=hp, timing_repeats=1,
                                with_reverse_loop=False)
    t = torch_runner.run_schedule(cfg, params, tokens, every_k(2), hparams=hp, timing_repeats=1,
                                  with_reverse_loop=False)
    tol = tolerance_for(dtype).max_rel_err
    assert max_rel_err({"loss": j["loss"]}, {"loss": t["loss"]}) <= tol
    err = max_rel_err(j["grads"], t["grads"])
    assert err <= tol
    # the comparison is not vacuous: the gradients are nonzero and differ from the weights' scale
    assert all(abs(g).max() > 0 for g in t["grads"].values())
    # a wrong weight conversion (transposed projection) is caught far above the tolerance
    swapped = dict(params)
    w = params["h.mlp.c_fc.weight"]
    swapped["h.mlp.c_fc.weight"] = w[:, ::-1, :].copy()
    t_bad = torch_runner.run_schedule(cfg, swapped, tokens, every_k(2), hparams=hp, timing_repeats=1,
                                      with_reverse_loop=False)
    assert max_rel_err(j["grads"], t_bad["grads"]) > 100 * tol
