"""Benchmark: compiled memory of ``remat_scan`` on user stacks of several shapes, beside what a user writes.

For each shape family (a user's MLP block ``x + tanh(x @ W1 + b1) @ W2`` at some width D, hidden
width F and batch B) and depth N, it compiles ``jax.jit(jax.value_and_grad(loss))`` (loss: the sum
of squares of the stack's output; gradients of the parameters and the input) and prints XLA's
temp bytes (``Compiled.memory_analysis().temp_size_in_bytes``, MB) of:

* ``reverse_loop`` / ``checkpoint``: ``remat_scan(..., method=...)`` per schedule
  (``none``, ``full``, ``every_k(2)``, ``sqrt``);
* ``scan+ckpt``: a hand-written ``lax.scan(jax.checkpoint(block))`` (per-layer remat; beside ``full``);
* ``scan``: a hand-written ``lax.scan(block)`` (beside ``none``);
* ``unrolled``: a Python loop over the layers without remat (beside ``none``);

The families: ``mlp`` (D 512, F 2048, B 256; activations above parameters), ``wide`` (D 1024,
F 4096, B 64), ``batch1`` (D 512, F 2048, B 1) and ``params>>acts`` (D 1024, F 4096, B 4; a layer's
parameters, 32 MB, against 80 KB of activations), and the project's GPT presets ``gpt-tiny`` and
``gpt-small`` (``parity.inputs.presets``; the transformer block at depth N, loss the cross entropy,
gradients of the parameters). Nothing runs: the numbers are XLA's buffer plan,
deterministic for a given jax/jaxlib and CPU; nothing is timed.

Usage::

    python scripts/bench_remat_scan.py                    # every family, N = 1, 2, 4, 8
    python scripts/bench_remat_scan.py --families mlp --depths 2,8
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
from jax import lax

from jaxremat.render import remat_scan

FAMILIES = {"mlp": (512, 2048, 256), "wide": (1024, 4096, 64), "batch1": (512, 2048, 1),
            "params>>acts": (1024, 4096, 4)}
"""name -> (D, F, B)."""
GPT_FAMILIES = ("gpt-tiny", "gpt-small")
"""The project's GPT presets (parity.inputs.presets), at depth N in place of the preset's own."""
SCHEDULES = ("none", "full", "every_k(2)", "sqrt")


def block(p, x, _):
    """The user's layer: ``x + tanh(x @ W1 + b1) @ W2``; ``x`` (B, D)."""
    return x + jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"]


def stack_args(n: int, d: int, f: int, b: int):
    """Abstract stacked parameters (leading axis ``n``) and input, float32."""
    sds = jax.ShapeDtypeStruct
    return {"w1": sds((n, d, f), jnp.float32), "b1": sds((n, f), jnp.float32),
            "w2": sds((n, f, d), jnp.float32)}, sds((b, d), jnp.float32)


def temp_bytes(loss, params, x, argnums=(0, 1)) -> int:
    """XLA's compiled temp bytes of ``jit(value_and_grad(loss, argnums))`` at abstract ``params``, ``x``."""
    compiled = jax.jit(jax.value_and_grad(loss, argnums=argnums)).lower(params, x).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def stacks(block_fn):
    """``name -> stack(p, x)`` for every rendering of the table: remat_scan's per (method, schedule), hand-written."""
    def hand(kind):
        def stack(p, x):
            if kind == "unrolled":  # per-layer parameters: a list of layer pytrees, as a user's loop has them
                for layer in p:
                    x = block_fn(layer, x, None)
                return x
            body = block_fn if kind == "scan" else jax.checkpoint(block_fn, prevent_cse=False)
            return lax.scan(lambda c, layer: (body(layer, c, None), None), x, p)[0]
        return stack
    out = {(m, s): (lambda p, x, m=m, s=s: remat_scan(block_fn, p, x, s, method=m))
           for m in ("reverse_loop", "checkpoint") for s in SCHEDULES}
    return out | {k: hand(k) for k in ("scan", "scan+ckpt", "unrolled")}


def _per_layer(tree, n: int) -> list:
    return [jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), tree) for _ in range(n)]


def family_case(fam: str, n: int, unrolled: bool = False):
    """``(block_fn, loss_of(stack), params, x, argnums)`` of a family at depth ``n`` (abstract arrays);
    ``unrolled``: the block parameters as a list of ``n`` per-layer pytrees instead of one stacked pytree."""
    if fam in FAMILIES:
        params, x = stack_args(n, *FAMILIES[fam])
        params = _per_layer(params, n) if unrolled else params
        return block, (lambda stack: (lambda p, x: jnp.sum(stack(p, x) ** 2))), params, x, (0, 1)
    from jaxremat.model import block_forward, block_params_of, cross_entropy, embed, head
    from jaxremat.models import init_params
    from parity.inputs.presets import get_preset
    preset = get_preset(fam)
    cfg = preset.config.replace(n_layer=n)
    full = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in init_params(cfg, seed=0).items()}
    blocks = block_params_of(full)
    params = {"rest": {k: v for k, v in full.items() if k not in blocks},
              "blocks": _per_layer(blocks, n) if unrolled else blocks}
    tokens = jax.ShapeDtypeStruct((preset.batch_size, preset.seq_len + 1), jnp.int32)

    def loss_of(stack):
        def loss(p, t):
            x = stack(p["blocks"], embed(p["rest"], t[:, :-1], cfg))
            return cross_entropy(head(p["rest"], x, cfg), t[:, 1:])
        return loss

    return (lambda lp, c, _: block_forward(lp, c, cfg)), loss_of, params, tokens, 0


def rows(families: list[str], depths: list[int]) -> list[dict]:
    """One row per (family, N, schedule): temp MB of each rendering (None where it does not apply)."""
    out = []
    for fam in families:
        for n in depths:
            block_fn, loss_of, params, x, argnums = family_case(fam, n)
            fns = stacks(block_fn)
            mb = lambda key, p=params: temp_bytes(loss_of(fns[key]), p, x, argnums) / 1e6  # noqa: E731
            base = {k: mb(k) for k in ("scan", "scan+ckpt")}
            base["unrolled"] = mb("unrolled", family_case(fam, n, unrolled=True)[2])
            for s in SCHEDULES:
                row = {"family": fam, "N": n, "schedule": s,
                       "reverse_loop": mb(("reverse_loop", s)), "checkpoint": mb(("checkpoint", s)),
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
    ap.add_argument("--families", type=lambda t: t.split(","), default=[*FAMILIES, *GPT_FAMILIES])
    ap.add_argument("--depths", type=_ints, default=[1, 2, 4, 8])
    args = ap.parse_args(argv)
    unknown = [f for f in args.families if f not in FAMILIES and f not in GPT_FAMILIES]
    if unknown:
        print(f"unknown family {unknown[0]!r}; choose among {', '.join((*FAMILIES, *GPT_FAMILIES))}",
              file=sys.stderr)
        return 2
    print(f"{'family':<13} {'N':>2} {'schedule':<11}{'rev.loop':>10}{'checkpt':>10}{'scan+ckpt':>10}"
          f"{'scan':>10}{'unrolled':>10}   (compiled temp, MB)")
    rows(args.families, args.depths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
