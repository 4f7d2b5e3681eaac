"""Measure a ``jax.custom_vjp`` op under remat: rule runs, saved bytes, compiled temp, bits vs none.

The block is ``h + dense_gelu(h, w)`` (as in tests/jaxremat/test_custom_vjp.py), a stack of N
layers of (B, D) float32 activations, differentiated with ``jax.grad``. Per rendering
(``method``), ``custom_vjp_residuals`` choice, ``optimize_remat`` flag of the rule and schedule it
prints, side by side in one run:

* runs of the rule's primal and ``fwd`` in the program (:func:`jaxremat.custom_vjp.count_named_runs`);
* saved activation bytes (:func:`jaxremat.memory.saved_activation_bytes`, jaxpr level);
* XLA's compiled temp bytes (:func:`jaxremat.memory.compiled_memory`);
* the gradient's distance from ``none``'s under ``jit``: the largest ULP distance, and the largest
  ``max |g - g_none| / max |g_none|`` over the layers.

Nothing is timed. A combination :func:`jaxremat.render.remat_scan` refuses (``"save"`` through
``jax.checkpoint`` under JAX's ``jax_remat3`` flag, a policy in the reverse loop under that flag on JAX
0.10) is printed as a ``refused [i]`` row, its message ``[i]`` below the table, and the others still
run. Usage::

    python scripts/custom_vjp_remat.py                  # N=4, B=128, D=128
    python scripts/custom_vjp_remat.py --batch 2 --width 8
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxremat.custom_vjp import count_named_runs
from jaxremat.memory import compiled_memory, saved_activation_bytes
from jaxremat.render import remat_scan

SCHEDULES = ("none", "full", "every_k(2)", "sqrt")


def dense_gelu_op(optimize_remat: bool):
    """``gelu(x @ w)`` as a ``custom_vjp`` keeping ``(x, w, x @ w)``; its primal and fwd are tagged."""
    @jax.custom_vjp
    def dense_gelu(x, w):
        return jax.nn.gelu(checkpoint_name(x @ w, "primal"))

    def fwd(x, w):
        h = checkpoint_name(x @ w, "fwd")
        return jax.nn.gelu(h), (x, w, h)

    def bwd(res, g):
        x, w, h = res
        dh = jax.vjp(jax.nn.gelu, h)[1](g)[0]
        return dh @ w.T, x.T @ dh

    dense_gelu.defvjp(fwd, bwd, optimize_remat=optimize_remat)
    return dense_gelu


def measure(method: str, choice: str, optimize_remat: bool, schedule: str, w, x) -> dict:
    op = dense_gelu_op(optimize_remat)

    def loss(w, x):
        out = remat_scan(lambda p, h, _: h + op(h, p), w, x, schedule, method=method, custom_vjp_residuals=choice)
        return jnp.sum(out ** 2)

    runs = count_named_runs(jax.grad(loss), w, x)
    grad = jax.jit(jax.grad(loss))
    return {"primal": runs.get("primal", 0), "fwd": runs.get("fwd", 0),
            "saved_bytes": saved_activation_bytes(loss, w, x),
            "temp_bytes": compiled_memory(grad, w, x)["temp_bytes"], "grad": np.asarray(grad(w, x))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--width", type=int, default=128)
    args = ap.parse_args(argv)
    for name in ("layers", "batch", "width"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    w = jax.random.normal(jax.random.key(0), (args.layers, args.width, args.width)) * 0.3
    x = jax.random.normal(jax.random.key(1), (args.batch, args.width))
    unit = args.batch * args.width * 4
    print(f"N={args.layers} B={args.batch} D={args.width} float32; one (B, D) activation = {unit} bytes")
    print(f"{'method':<13}{'choice':<10}{'opt_remat':<10}{'schedule':<11}{'primal':>7}{'fwd':>5}"
          f"{'saved B':>10}{'temp B':>10}{'ULP vs none':>12}{'rel vs none':>12}")
    refused: dict[str, int] = {}
    for method in ("reverse_loop", "checkpoint"):
        ref = None
        for choice, opt in (("recompute", False), ("recompute", True), ("save", False)):
            for schedule in SCHEDULES:
                try:
                    r = measure(method, choice, opt, schedule, w, x)
                except ValueError as exc:  # a combination remat_scan refuses under jax_remat3: the row says so
                    if "jax_remat3" not in str(exc):
                        raise
                    refused.setdefault(str(exc), len(refused) + 1)
                    print(f"{method:<13}{choice:<10}{str(opt):<10}{schedule:<11}refused [{refused[str(exc)]}]")
                    continue
                ref = r["grad"] if ref is None else ref
                ulp = int(np.abs(r["grad"].view(np.int32).astype(np.int64) - ref.view(np.int32)).max())
                rel = max(float(np.abs(g - g0).max() / np.abs(g0).max()) for g, g0 in zip(r["grad"], ref))
                print(f"{method:<13}{choice:<10}{str(opt):<10}{schedule:<11}{r['primal']:>7}{r['fwd']:>5}"
                      f"{r['saved_bytes']:>10}{r['temp_bytes']:>10}{ulp:>12}{rel:>12.1e}")
    for message, i in refused.items():
        print(f"[{i}] {message}")


if __name__ == "__main__":
    main()
