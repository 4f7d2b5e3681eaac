"""Benchmark: compiled memory of ``remat_scan`` on user stacks of several shapes, beside what a user writes.

For each shape family (a user's MLP block ``x + tanh(x @ W1 + b1) @ W2`` at some width D, hidden
width F and batch B) and depth N, it compiles ``jax.jit(jax.value_and_grad(loss))`` (loss: the sum
of squares of the stack's output; gradients of the parameters and the input) and prints XLA's
temp bytes (``Compiled.memory_analysis().temp_size_in_bytes``, MB) of:

* ``reverse_loop`` / ``checkpoint``: ``remat_scan(..., method=...)`` per schedule
  (``none``, ``full``, ``every_k(2)``, ``sqrt``);
* ``scan+ckpt``: a hand-written ``lax.scan(jax.checkpoint(block))`` (per-layer remat; beside ``full``);
* ``scan``: a hand-written ``lax.scan(block)`` (beside ``none``);
* ``unrolled``: a Python loop over the layers without remat (beside ``none``).

The families: ``mlp`` (D 512, F 2048, B 256; activations above parameters), ``wide`` (D 1024,
F 4096, B 64), ``batch1`` (D 512, F 2048, B 1) and ``params>>acts`` (D 1024, F 4096, B 4; a layer's
parameters, 32 MB, against 80 KB of activations). Nothing runs: the numbers are XLA's buffer plan,
deterministic for a given jax/jaxlib and CPU; nothing is timed.

Usage::

    python scripts/bench_remat_scan.py                    # every family, N = 2, 4, 8
    python scripts/bench_remat_scan.py --families mlp --depths 2,8
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxremat.render import remat_scan

FAMILIES = {"mlp": (512, 2048, 256), "wide": (1024, 4096, 64), "batch1": (512, 2048, 1),
            "params>>acts": (1024, 4096, 4)}
"""name -> (D, F, B)."""
SCHEDULES = ("none", "full", "every_k(2)", "sqrt")


def block(p, x, _):
    """The user's layer: ``x + tanh(x @ W1 + b1) @ W2``; ``x`` (B, D)."""
    return x + jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"]


def stack_args(n: int, d: int, f: int, b: int):
    """Abstract stacked parameters (leading axis ``n``) and input, float32."""
    sds = jax.ShapeDtypeStruct
    return {"w1": sds((n, d, f), jnp.float32), "b1": sds((n, f), jnp.float32),
            "w2": sds((n, f, d), jnp.float32)}, sds((b, d), jnp.float32)


def _temp_mb(loss, params, x) -> float:
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(params, x).compile()
    return compiled.memory_analysis().temp_size_in_bytes / 1e6


def _hand_written(kind: str):
    def loss(p, x):
        if kind == "unrolled":
            n = jax.tree_util.tree_leaves(p)[0].shape[0]
            for i in range(n):
                x = block(jax.tree_util.tree_map(lambda a: a[i], p), x, None)
        else:
            body = block if kind == "scan" else jax.checkpoint(block, prevent_cse=False)
            x = lax.scan(lambda c, layer: (body(layer, c, None), None), x, p)[0]
        return jnp.sum(x ** 2)
    return loss


def _remat(schedule: str, method: str):
    return lambda p, x: jnp.sum(remat_scan(block, p, x, schedule, method=method) ** 2)


def rows(families: list[str], depths: list[int]) -> list[dict]:
    """One row per (family, N, schedule): temp MB of each rendering (None where it does not apply)."""
    out = []
    for fam in families:
        d, f, b = FAMILIES[fam]
        for n in depths:
            params, x = stack_args(n, d, f, b)
            base = {k: _temp_mb(_hand_written(k), params, x) for k in ("scan", "scan+ckpt", "unrolled")}
            for s in SCHEDULES:
                row = {"family": fam, "N": n, "schedule": s,
                       "reverse_loop": _temp_mb(_remat(s, "reverse_loop"), params, x),
                       "checkpoint": _temp_mb(_remat(s, "checkpoint"), params, x),
                       "scan+ckpt": base["scan+ckpt"] if s == "full" else None,
                       "scan": base["scan"] if s == "none" else None,
                       "unrolled": base["unrolled"] if s == "none" else None}
                out.append(row)
                print(_line(row), flush=True)
    return out


def _line(row: dict) -> str:
    cell = lambda v: f"{v:>10.2f}" if v is not None else f"{'':>10}"  # noqa: E731
    return (f"{row['family']:<13} {row['N']:>2} {row['schedule']:<11}"
            + "".join(cell(row[k]) for k in ("reverse_loop", "checkpoint", "scan+ckpt", "scan", "unrolled")))


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", type=lambda t: t.split(","), default=list(FAMILIES))
    ap.add_argument("--depths", type=_ints, default=[2, 4, 8])
    args = ap.parse_args(argv)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        print(f"unknown family {unknown[0]!r}; choose among {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    print(f"{'family':<13} {'N':>2} {'schedule':<11}{'rev.loop':>10}{'checkpt':>10}{'scan+ckpt':>10}"
          f"{'scan':>10}{'unrolled':>10}   (compiled temp, MB)")
    rows(args.families, args.depths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
