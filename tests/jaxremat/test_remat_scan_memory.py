"""remat_scan's default rendering against ``method="checkpoint"`` and a hand-written scan: compiled temp bytes.

Compile-only (XLA's buffer plan of ``jit(value_and_grad(loss))``; nothing runs), one test per shape
family of ``scripts/bench_remat_scan.py`` at its own widths and N = 2 (at 1/16 of the widths the
buffer plan differs: ``none`` measured 16 KB above ``checkpoint`` at D 32, F 128, B 64):
``mlp`` (activations above parameters), ``wide``, ``batch1`` and ``params>>acts``, and the project's
GPT block (gpt-tiny). The default run compiles ``none`` and ``full`` per family; every schedule and
the GPT block run with ``JAXREMAT_SLOW_TESTS=1``. Measured facts (XLA:CPU, jax 0.10.2; docs/memory-model.md, section 7):

* ``none``, ``every_k(2)``, ``sqrt``: the default (``reverse_loop``) is at or below ``checkpoint``,
  and its ``none`` at or below a hand-written ``lax.scan(block)``;
* ``full``: at most one layer's recomputed residual above ``checkpoint`` and a hand-written
  ``lax.scan(jax.checkpoint(block))`` (the (B, F) tanh output here: the recompute runs in a cond of
  its own, which keeps its values bitwise equal to ``none``'s; XLA fuses the checkpointed recompute
  into the pullback instead), never the layer's weights as before.
"""

import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_remat_scan as bench  # noqa: E402

SLACK_BYTES = 1024  # loop tuples and scalars: measured at most 896 bytes (batch1, sqrt at N=2)
FAMILIES = bench.FAMILIES
"""name -> (D, F, B)."""


QUICK_SCHEDULES = ("none", "full")
"""The default run's schedules (the fixed cost showed under ``full``); every schedule runs with JAXREMAT_SLOW_TESTS=1."""


def _temps(block_fn, loss_of, params, x, argnums, schedules=bench.SCHEDULES) -> dict:
    fns = bench.stacks(block_fn)
    keys = [(m, s) for m in ("reverse_loop", "checkpoint") for s in schedules]
    return {k: bench.temp_bytes(loss_of(fns[k]), params, x, argnums) for k in keys + ["scan", "scan+ckpt"]}


def _assert_default_not_above(t: dict, residual_bytes: int) -> None:
    for s in ("none", "every_k(2)", "sqrt"):
        if ("reverse_loop", s) in t:
            assert t[("reverse_loop", s)] <= t[("checkpoint", s)] + SLACK_BYTES, (s, t)
    assert t[("reverse_loop", "none")] <= t["scan"] + SLACK_BYTES, t
    for ref in (t[("checkpoint", "full")], t["scan+ckpt"]):
        assert t[("reverse_loop", "full")] <= ref + residual_bytes + SLACK_BYTES, t
    # the fixed cost removed: full below none, and below checkpoint's full plus one layer's weights
    assert t[("reverse_loop", "full")] < t[("reverse_loop", "none")], t


def _mlp_family_holds(family: str, schedules) -> None:
    d, f, b = FAMILIES[family]
    params, x = bench.stack_args(2, d, f, b)
    loss_of = lambda stack: (lambda p, x: jnp.sum(stack(p, x) ** 2))  # noqa: E731
    t = _temps(bench.block, loss_of, params, x, (0, 1), schedules)
    _assert_default_not_above(t, residual_bytes=b * f * 4)
    weight_bytes = d * f * 4
    assert t[("reverse_loop", "full")] < t[("checkpoint", "full")] + weight_bytes, t


@pytest.mark.parametrize("family", list(FAMILIES))
def test_default_temp_bytes_not_above_checkpoint_per_mlp_family(family):
    _mlp_family_holds(family, QUICK_SCHEDULES)


@pytest.mark.jaxremat_slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_default_temp_bytes_not_above_checkpoint_per_mlp_family_every_schedule(family):
    _mlp_family_holds(family, bench.SCHEDULES)


@pytest.mark.jaxremat_slow
def test_default_temp_bytes_not_above_checkpoint_gpt_tiny():
    block_fn, loss_of, params, tokens, argnums = bench.family_case("gpt-tiny", 4)  # the preset as it is
    cfg_b, cfg_t, d_ff = 2, 16, 64  # gpt-tiny: B 2, T 16, d_ff 64
    _assert_default_not_above(_temps(block_fn, loss_of, params, tokens, argnums), residual_bytes=cfg_b * cfg_t * d_ff * 4)
