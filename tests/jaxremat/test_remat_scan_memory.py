"""remat_scan's default rendering beside ``method="checkpoint"`` and a hand-written scan: compiled temp bytes.

Compile-only (XLA's buffer plan of ``jit(value_and_grad(loss))``, nothing runs), one test per shape
family of ``scripts/bench_remat_scan.py`` at small widths, under ``full`` at N = 1 and N = 2 (where the
default once kept a fixed cost above both: a weight-sized buffer, docs/memory-model.md, section 7),
three programs each (XLA:CPU compiles one in well under a second at these widths). With
``JAXREMAT_SLOW_TESTS=1``: ``none`` and ``sqrt`` too (at N = 2 ``every_k(2)`` is ``none``'s program),
and the project's GPT block at gpt-tiny's width. The claim: the default is at or below ``checkpoint``
and the hand-written ``lax.scan(jax.checkpoint(block))`` (``full``) or ``lax.scan(block)`` (``none``).
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


def _assert_at_or_below(t: dict, schedules=SCHEDULES, n: int = 2) -> None:
    for s in schedules:
        refs = {"checkpoint": t[("checkpoint", s)]} | ({HAND[s]: t[HAND[s]]} if s in HAND else {})
        for name, ref in refs.items():
            assert t[("reverse_loop", s)] <= ref, (s, name, t)
    if "none" in schedules and n > 1:  # one layer: full's recompute is merged with the forward pass
        assert t[("reverse_loop", "full")] <= t[("reverse_loop", "none")], t  # remat still saves


def _mlp_family(family: str, n: int, schedules) -> dict:
    d, f, b = SMALL[family]
    params, x = bench.stack_args(n, d, f, b)
    loss_of = lambda stack: (lambda p, x: jnp.sum(stack(p, x) ** 2))  # noqa: E731
    t = _temps(bench.block, loss_of, params, x, (0, 1), schedules)
    _assert_at_or_below(t, schedules, n)
    return t


@pytest.mark.parametrize("family", list(SMALL))
def test_default_temp_bytes_at_or_below_checkpoint_full_per_mlp_family(family):
    d, f, b = SMALL[family]
    one, two = _mlp_family(family, 1, ("full",)), _mlp_family(family, 2, ("full",))
    # one layer: the default is the checkpoint rendering (jaxremat.render, "One layer")
    assert one[("reverse_loop", "full")] == one[("checkpoint", "full")], one
    # two layers: below checkpoint; where a weight outweighs a layer's residuals 2*B*F (wide, batch1,
    # params>>acts) by more than half a weight (one weight-sized buffer fewer, less the residuals the
    # isolated recompute writes out; docs/memory-model.md, section 7)
    saved = two[("checkpoint", "full")] - two[("reverse_loop", "full")]
    assert saved > 0, two
    if d * f > 2 * b * f:
        assert saved > d * f * 4 // 2, (saved, two)


@SLOW
@pytest.mark.parametrize("family", list(SMALL))
def test_default_temp_bytes_at_or_below_checkpoint_per_mlp_family_every_schedule(family):
    for n in (1, 2, 4):
        _mlp_family(family, n, SCHEDULES)


@SLOW
@pytest.mark.parametrize("n", [1, 2])
def test_default_temp_bytes_at_or_below_checkpoint_gpt_tiny(n):
    block_fn, loss_of, params, tokens, argnums = bench.family_case("gpt-tiny", n)
    _assert_at_or_below(_temps(block_fn, loss_of, params, tokens, argnums), n=n)
