"""Measure bfloat16 remat bits under ``jit``: an unrolled stack versus the same stack scanned.

``python -m parity.experiments.bf16_unrolled`` builds a two-block LayerNorm+MLP stack (d_model 64, d_ff 256,
batch 4 x 64, float32 parameters, bfloat16 compute), differentiates ``mean(y**2)`` with and
without ``jax.checkpoint`` around each block, with the blocks in a Python loop (unrolled) and in a
``lax.scan`` (as :func:`jaxremat.render.remat_scan` runs them), under ``jit`` and op by op, and
prints one JSON line per case: bitwise or not, the ULP distance, the largest absolute and relative
difference, and the number of ``convert`` instructions of the optimized HLO of each program.

Run it with ``XLA_FLAGS=--xla_allow_excess_precision=false`` to see the mechanism: XLA:CPU
computes bfloat16 elementwise ops in float32 and, with excess precision allowed (the default),
drops the rounding back to bfloat16 between ops it fuses. Remat changes what is fused with what
in an unrolled program, so the roundings land elsewhere; with the flag off every intermediate is
rounded as written and the unrolled remat program is bitwise again (docs/framework-differences.md).
"""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np

from parity.checks.compare import compare_bitwise

D, F, N, B, T = 64, 256, 2, 4, 64


def _setup():
    rng = np.random.default_rng(0)
    f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)  # noqa: E731
    ws = [{"g": 1 + 0.02 * f(D), "b": 0.02 * f(D), "w1": 0.02 * f(D, F), "w2": 0.02 * f(F, D)} for _ in range(N)]
    return ws, f(B, T, D)


def _block(p, x):
    p = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), p)
    m = x.mean(-1, keepdims=True)
    v = jnp.square(x - m).mean(-1, keepdims=True)
    h = (x - m) * jax.lax.rsqrt(v + 1e-5) * p["g"] + p["b"]
    return x + jax.nn.gelu(h @ p["w1"], approximate=True) @ p["w2"]


def loss(ws, x, remat: bool, scan: bool):
    """``mean(y**2)`` of the stack in float32; blocks in bfloat16, checkpointed when ``remat``."""
    x = x.astype(jnp.bfloat16)
    f = jax.checkpoint(_block) if remat else _block
    if scan:
        stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *ws)
        x = jax.lax.scan(lambda c, p: (f(p, c), None), x, stacked)[0]
    else:
        for p in ws:
            x = f(p, x)
    return jnp.mean(jnp.square(x.astype(jnp.float32)))


def _flat(grads) -> dict[str, np.ndarray]:
    return {f"{i}.{k}": np.asarray(v) for i, d in enumerate(grads) for k, v in d.items()}


def measure() -> list[dict]:
    """One dict per (layout, mode): bitwise, max_ulp, max_abs_diff, max_rel_err, converts per program."""
    ws, x = _setup()
    grad = jax.grad(loss)
    jitted = jax.jit(grad, static_argnums=(2, 3))
    rows = []
    for scan in (False, True):
        for mode in ("jit", "eager"):
            res, converts = {}, {}
            for remat in (False, True):
                if mode == "jit":
                    res[remat] = _flat(jitted(ws, x, remat, scan))
                    hlo = jitted.lower(ws, x, remat, scan).compile().as_text()
                    converts[remat] = len(re.findall(r" convert\(", hlo))
                else:
                    with jax.disable_jit():
                        res[remat] = _flat(grad(ws, x, remat, scan))
            r = compare_bitwise(res[True], res[False])
            rel = max(float(np.max(np.abs(res[True][k] - res[False][k])) / np.max(np.abs(res[False][k])))
                      for k in res[False])
            rows.append({"layout": "scan" if scan else "unrolled", "mode": mode, "bitwise": r.equal,
                         "max_ulp": r.max_ulp, "max_abs_diff": r.max_abs_diff, "max_rel_err": rel,
                         "mismatched": len(r.mismatched),
                         "converts_none": converts.get(False), "converts_remat": converts.get(True)})
    return rows


if __name__ == "__main__":
    for row in measure():
        print(json.dumps(row))
