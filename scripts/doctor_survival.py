"""The measurement behind ``remat-not-surviving``: compiled saving over traced saving, per form and size.

For each remat form (surviving ones: ``jax.checkpoint`` of a ``lax.scan`` body, ``nnx.remat`` +
``nnx.scan``, :func:`jaxremat.remat_scan`; failing ones: a checkpoint per layer of a Python loop,
a checkpointed loop of trip count one, one checkpoint around a whole stack) and each size
``L,B,D`` given, run :func:`jaxremat.doctor` and print, per region, the traced saving its policy
promises (bytes ``everything_saveable`` keeps more, all calls), the compiled saving (temp bytes of
the program with the region at ``everything_saveable`` less the program's), their ratio, and the
kinds flagged. docs/doctor.md quotes the result; :data:`jaxremat.doctor.checks.MIN_REALIZED_FRACTION`
sits between the two groups.

    python scripts/doctor_survival.py 2,16,64 4,16,64 3,256,128 6,64,256
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax
from jax.ad_checkpoint import checkpoint_name

import jaxremat

cp = jax.checkpoint_policies


def forms(L: int, B: int, D: int) -> dict:
    ws = jnp.ones((L, D, D)) / D

    def block(w, h, _=None):
        return h + jnp.tanh(checkpoint_name(jnp.tanh(checkpoint_name(h @ w, "mlp")) @ w, "out"))

    def scan_body(policy):
        return lambda ws, x: lax.scan(jax.checkpoint(lambda h, w: (block(w, h), None), policy=policy), x, ws)[0].sum()

    def python_loop(policy):
        def loss(ws, x):
            for i in range(L):
                x = jax.checkpoint(block, policy=policy)(ws[i], x)
            return x.sum()
        return loss

    def whole_stack(ws, x):
        return jax.checkpoint(lambda ws, x: lax.scan(lambda h, w: (block(w, h), None), x, ws)[0])(ws, x).sum()

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.a, self.b = nnx.Linear(D, D, rngs=rngs), nnx.Linear(D, D, rngs=rngs)

        def __call__(self, h):
            return h + self.b(jnp.tanh(checkpoint_name(self.a(h), "mlp")))

    stack = nnx.eval_shape(lambda: nnx.vmap(Block)(nnx.Rngs(0).split(L)))

    def nnx_scan(policy):
        layer = nnx.remat(lambda blk, h: blk(h), policy=policy)
        return lambda s, x: nnx.scan(layer, in_axes=(0, nnx.Carry), out_axes=nnx.Carry)(s, x).sum()

    def renderer(schedule, **kw):
        return lambda ws, x: jaxremat.remat_scan(block, ws, x, schedule, **kw).sum()

    return {
        "scan body, nothing_saveable": (scan_body(None), ws),
        "scan body, save 'mlp'": (scan_body(cp.save_only_these_names("mlp")), ws),
        "scan body, dots_saveable": (scan_body(cp.dots_saveable), ws),
        "nnx.remat + nnx.scan": (nnx_scan(None), stack),
        "nnx.remat + nnx.scan, save 'mlp'": (nnx_scan(cp.save_only_these_names("mlp")), stack),
        "remat_scan checkpoint full": (renderer("full", method="checkpoint"), ws),
        "remat_scan reverse_loop full+save_dots": (renderer("full", policy="save_dots"), ws),
        "FAILS python loop": (python_loop(None), ws),
        "FAILS python loop, save 'mlp'": (python_loop(cp.save_only_these_names("mlp")), ws),
        "FAILS remat_scan checkpoint segments(2)": (renderer("segments(2)", method="checkpoint"), ws),
        "FAILS one checkpoint around the stack": (whole_stack, ws),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", default=["4,16,64"], metavar="L,B,D",
                    help="layers, batch and width of each stack measured (default: 4,16,64)")
    for size in ap.parse_args(argv).sizes:
        try:
            L, B, D = (int(v) for v in size.split(","))
        except ValueError:
            ap.error(f"size {size!r}: write three integers L,B,D, e.g. 4,16,64")
        x = jax.ShapeDtypeStruct((B, D), jnp.float32)
        print(f"L={L} B={B} D={D} (backend {jax.default_backend()})")
        for name, (fn, params) in forms(L, B, D).items():
            for r in jaxremat.doctor(fn, params, x).regions:
                ratio = (r.compiled_saving_bytes or 0) / max(1, r.promised_saving_bytes)
                print(f"  {name:42s} calls {r.calls:3d}  traced {r.promised_saving_bytes:>10,d} B  compiled "
                      f"{r.compiled_saving_bytes!s:>10} B  ratio {ratio:5.2f}")


if __name__ == "__main__":
    main()
