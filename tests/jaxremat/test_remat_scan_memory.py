"""remat_scan's default rendering beside ``method="checkpoint"`` and a hand-written scan: compiled temp bytes.

Compile-only (XLA's buffer plan of ``jit(value_and_grad(loss))``, nothing runs), one test per shape
family of ``scripts/bench_remat_scan.py`` at small widths, N = 2, under ``full`` (where the fixed cost
shows at N >= 2), three programs each (XLA:CPU compiles one in about a second). With
``JAXREMAT_SLOW_TESTS=1``: ``none`` and ``sqrt`` too (at N = 2 ``every_k(2)`` is ``none``'s program),
and the project's GPT block at gpt-tiny. The stated bound (docs/memory-model.md, section 7): the
default is at most one layer's largest parameter, one layer's residuals and one carry above
``checkpoint`` and above the hand-written ``lax.scan(jax.checkpoint(block))`` (``full``) or
``lax.scan(block)`` (``none``).
"""

import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_remat_scan as bench  # noqa: E402

SMALL = {"mlp": (64, 256, 32), "wide": (128, 512, 8), "batch1": (64, 256, 1), "params>>acts": (128, 512, 1)}
"""The bench's families at small widths: name -> (D, F, B)."""
SCHEDULES = ("none", "full", "sqrt")
HAND = {"none": "scan", "full": "scan+ckpt"}
SLOW = pytest.mark.jaxremat_slow


def _temps(block_fn, loss_of, params, x, argnums, schedules=SCHEDULES) -> dict:
    fns = bench.stacks(block_fn)
    keys = [(m, s) for m in ("reverse_loop", "checkpoint") for s in schedules] + [HAND[s] for s in schedules if s in HAND]
    return {k: bench.temp_bytes(loss_of(fns[k]), params, x, argnums) for k in keys}


def _assert_within_bound(t: dict, bound: dict, schedules=SCHEDULES) -> None:
    slack = sum(bound.values())
    for s in schedules:
        refs = [t[("checkpoint", s)]] + ([t[HAND[s]]] if s in HAND else [])
        for ref in refs:
            assert t[("reverse_loop", s)] <= ref + slack, (s, t, bound)
    if "none" in schedules:
        assert t[("reverse_loop", "full")] <= t[("reverse_loop", "none")], t  # remat still saves


def _mlp_family(family: str, schedules) -> None:
    d, f, b = SMALL[family]
    params, x = bench.stack_args(2, d, f, b)
    loss_of = lambda stack: (lambda p, x: jnp.sum(stack(p, x) ** 2))  # noqa: E731
    bound = bench.fixed_bound_bytes(bench.block, params, x, family)
    assert bound["weight"] == d * f * 4 and bound["carry"] == b * d * 4
    assert bound["residuals"] == 2 * b * f * 4  # tanh's output and 1 - tanh: what jax.vjp keeps
    _assert_within_bound(_temps(bench.block, loss_of, params, x, (0, 1), schedules), bound, schedules)


@pytest.mark.parametrize("family", list(SMALL))
def test_default_temp_bytes_within_fixed_bound_per_mlp_family(family):
    _mlp_family(family, ("full",))


@SLOW
@pytest.mark.parametrize("family", list(SMALL))
def test_default_temp_bytes_within_fixed_bound_per_mlp_family_every_schedule(family):
    _mlp_family(family, SCHEDULES)


@SLOW
def test_default_temp_bytes_within_fixed_bound_gpt_tiny():
    block_fn, loss_of, params, tokens, argnums = bench.family_case("gpt-tiny", 2)
    bound = bench.fixed_bound_bytes(block_fn, params, tokens, "gpt-tiny")
    assert bound["weight"] > 0 and bound["residuals"] > bound["carry"] > 0
    t = _temps(block_fn, loss_of, params, tokens, argnums)
    _assert_within_bound(t, bound)
    # the project's block: the default at or below checkpoint for every schedule here
    for s in SCHEDULES:
        assert t[("reverse_loop", s)] <= t[("checkpoint", s)], (s, t)
