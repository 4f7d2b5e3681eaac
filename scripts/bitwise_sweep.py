"""Sweep: every plan against ``none`` under ``jax.jit``, bit for bit, over widths, depths, dropout and dtypes.

For each stack of width D and depth N it compiles the loss and gradients under ``none`` and under
each plan of the depth (``full``, ``every_k(2)``, ``segments(2)``, ``nested(sqrt,sqrt)``, segment
plans with a one-block segment under ``save_dots``, ``attention_only`` + ``mlp_only``, and
``save_qkv_proj`` + ``save_dots_no_batch``; ``every_k(2)+save_dots`` and ``full+save_dots`` for the
non-GPT stacks), and prints one row per plan: the number of gradient tensors that differ and the
largest ULP distance (0 and 0 when bitwise). Exit status 1 when any row differs. The stacks
(``--stack``):

* ``gpt`` (default): the project's GPT stack (2 heads where D allows, d_ff 2D, batch 2 x T 16,
  vocab 256), ``jax.jit(jax.value_and_grad(loss_fn))``;
* ``nnx``: a Flax NNX block of your own, ``nnx.LayerNorm`` -> ``nnx.Linear(D, 2D)`` -> GELU ->
  ``nnx.Dropout`` -> ``nnx.Linear(2D, D)`` + residual, run by ``jaxremat.flax.remat_stack`` on an
  input the loss closes over (a constant of the program), ``nnx.jit(nnx.value_and_grad)``;
* ``mlp``: a plain-JAX block (LayerNorm by hand, GELU, dropout from per-layer keys passed as ``xs``)
  run by ``remat_scan``; ``--vmap params`` maps ``jax.grad`` over 3 stacked parameter sets
  (an ensemble), ``--vmap input`` over 3 inputs and dropout keys.

The default rendering, ``remat_scan(method="reverse_loop")``, is what runs. The property test
(tests/jaxremat/test_bitwise_jit.py) draws a few random cases per run and
tests/jaxremat/test_bitwise_edges.py pins the NNX, vmap and bfloat16 cases; this is the wider grid
behind docs/framework-differences.md, section 2. About 10 s per row on 2 cores.

Usage::

    python scripts/bitwise_sweep.py                                   # D 4,8,16,32,48,64,128; N 1,3,5
    python scripts/bitwise_sweep.py --widths 32 --depths 4 --dropout 0.1 --compute bfloat16
    python scripts/bitwise_sweep.py --stack nnx --widths 4,12,48 --depths 1,2,3,7 --dropout 0.1
    python scripts/bitwise_sweep.py --stack mlp --vmap params --widths 12 --depths 3
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxremat.model import loss_fn
from jaxremat.models import TransformerConfig, init_params
from jaxremat.render import remat_scan
from jaxremat.spec import parse_schedule
from parity.checks.compare import ulp_distance

OWN_PLANS = ("full", "every_k(2)", "segments(2)", "nested(sqrt,sqrt)", "full+save_dots", "every_k(2)+save_dots")


def plans(n: int) -> list[str]:
    """The plans swept at depth ``n`` (each valid for ``n`` layers)."""
    out = ["full", "every_k(2)", "nested(sqrt,sqrt)"] + (["segments(2)"] if n >= 2 else [])
    out.append(f"plan(1+save_dots,{n - 1}:store)" if n > 1 else "plan(1+save_dots)")
    if n >= 3:
        out.append(f"plan(1+attention_only,1+mlp_only,{n - 2}:store)")
    if n >= 2:
        out.append(f"plan(1+save_qkv_proj,{n - 1}+save_dots_no_batch)")
    return out


def value_and_grad(cfg: TransformerConfig, plan: str) -> tuple[np.ndarray, dict]:
    """Loss and gradients under ``plan``, compiled with ``jax.jit`` (B=2, T=cfg.max_seq_len)."""
    params = {k: jnp.asarray(v) for k, v in init_params(cfg, seed=1).items()}
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.max_seq_len + 1)), jnp.int32)
    key = jax.random.key(0) if cfg.dropout else None
    schedule = parse_schedule(plan)
    loss, grads = jax.jit(jax.value_and_grad(lambda p, t, k: loss_fn(p, t, cfg, schedule, k)))(params, tokens, key)
    return np.asarray(loss), {k: np.asarray(v) for k, v in grads.items()}



def _nnx_value_and_grad(n: int, d: int, dropout: float, compute, plan: str) -> tuple[np.ndarray, dict]:
    """Loss and gradients of a Flax NNX stack under ``plan`` (``nnx.jit``; the input closed over)."""
    from flax import nnx  # Deferred imports: flax only for --stack nnx

    from jaxremat.flax import remat_stack

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln = nnx.LayerNorm(d, rngs=rngs)
            self.up = nnx.Linear(d, 2 * d, dtype=compute, rngs=rngs)
            self.down = nnx.Linear(2 * d, d, dtype=compute, rngs=rngs)
            self.drop = nnx.Dropout(dropout, rngs=rngs)

        def __call__(self, x):
            return x + self.down(self.drop(nnx.gelu(self.up(self.ln(x))))).astype(x.dtype)

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return Block(rngs)

    x = jax.random.normal(jax.random.key(1), (3, d))
    loss, grads = nnx.jit(nnx.value_and_grad(lambda m: remat_stack(m, x, plan).sum()))(make(nnx.Rngs(0)))
    flat = jax.tree_util.tree_leaves_with_path(nnx.state(grads))
    return np.asarray(loss), {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def _mlp_value_and_grad(n: int, d: int, dropout: float, compute, plan: str, vmap: str) -> tuple[np.ndarray, dict]:
    """Loss and gradients of a plain-JAX stack under ``plan``, ``jax.vmap`` ped per ``vmap``."""
    dtype = compute or jnp.float32

    def block(w, x, key):
        m = x.mean(-1, keepdims=True)
        h = ((x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)).astype(dtype)
        a = jax.nn.gelu(h @ w["up"].astype(dtype))
        if dropout:
            a = jnp.where(jax.random.bernoulli(key, 1 - dropout, a.shape), a / (1 - dropout), 0)
        return x + (a @ w["down"].astype(dtype)).astype(x.dtype) + w["b"]

    k = jax.random.split(jax.random.key(0), 5)
    ws = {"up": jax.random.normal(k[0], (n, d, 2 * d)) / np.sqrt(d),
          "down": jax.random.normal(k[1], (n, 2 * d, d)) / np.sqrt(2 * d), "b": jax.random.normal(k[2], (n, d)) * 0.1}
    x, keys = jax.random.normal(k[3], (3, d)), jax.random.split(k[4], n)
    fn = jax.value_and_grad(lambda w, h, ks: remat_scan(block, w, h, plan, xs=ks).sum(), argnums=(0, 1))
    if vmap == "params":
        fn, ws = jax.vmap(fn, in_axes=(0, None, None)), jax.tree.map(lambda a: jnp.stack([a, a * 0.9, a * 1.1]), ws)
    elif vmap == "input":
        fn, x = jax.vmap(fn, in_axes=(None, 0, 0)), jnp.stack([x, 0.5 * x + 1, -x])
        keys = jnp.stack([keys, jax.random.split(k[2], n), jax.random.split(k[1], n)])
    loss, (gw, gx) = jax.jit(fn)(ws, x, keys)
    return np.asarray(loss), {**{key: np.asarray(v) for key, v in gw.items()}, "x": np.asarray(gx)}


def _runner(stack: str, n: int, d: int, dropout: float, compute, vmap: str):
    """``(plans at depth n, plan -> (loss, grads))`` for one stack."""
    if stack == "nnx":
        return [p for p in OWN_PLANS if n >= 2 or "segments" not in p], (
            lambda plan: _nnx_value_and_grad(n, d, dropout, compute, plan))
    if stack == "mlp":
        return [p for p in OWN_PLANS if n >= 2 or "segments" not in p], (
            lambda plan: _mlp_value_and_grad(n, d, dropout, compute, plan, vmap))
    cfg = TransformerConfig(vocab_size=256, n_layer=n, d_model=d, n_head=2 if d % 2 == 0 else 1, d_ff=2 * d,
                            max_seq_len=16, dropout=dropout, compute_dtype=compute)
    return plans(n), lambda plan: value_and_grad(cfg, plan)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=_ints, default=[4, 8, 16, 32, 48, 64, 128], help="d_model values")
    ap.add_argument("--depths", type=_ints, default=[1, 3, 5], help="N values")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--compute", choices=("float32", "bfloat16"), default="float32",
                    help="compute dtype (parameters stay float32)")
    ap.add_argument("--stack", choices=("gpt", "nnx", "mlp"), default="gpt", help="the stack swept (see above)")
    ap.add_argument("--vmap", choices=("none", "params", "input"), default="none", help="--stack mlp: what jax.vmap maps")
    args = ap.parse_args(argv)
    if args.vmap != "none" and args.stack != "mlp":
        ap.error("--vmap applies to --stack mlp; add --stack mlp")
    compute = None if args.compute == "float32" else args.compute
    print(f"{'D':>4} {'N':>2} {'plan':<48} {'loss':<8} {'grads differing':>15} {'max ULP':>12}")
    failed = 0
    for d in args.widths:
        for n in args.depths:
            swept, run = _runner(args.stack, n, d, args.dropout, compute, args.vmap)
            ref_loss, ref = run("none")
            for plan in swept:
                loss, grads = run(plan)
                bad = {k: ulp_distance(grads[k], ref[k]) for k in grads
                       if grads[k].tobytes() != ref[k].tobytes()}
                same_loss = loss.tobytes() == ref_loss.tobytes()
                failed += bool(bad) or not same_loss
                print(f"{d:>4} {n:>2} {plan:<48} {'bitwise' if same_loss else 'differs':<8} {len(bad):>15} "
                      f"{max(bad.values(), default=0):>12}", flush=True)
    print(f"{failed} row(s) not bitwise" if failed else "every row bitwise")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
