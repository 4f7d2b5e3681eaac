"""Sweep: every plan against ``none`` under ``jax.jit``, bit for bit, over widths, depths, dropout and dtypes.

For each GPT stack (d_model D, N layers, 2 heads where D allows, d_ff 2D, batch 2 x T 16, vocab
256) it compiles ``jax.jit(jax.value_and_grad(loss_fn))`` under ``none`` and under each plan of
the depth (``full``, ``every_k(2)``, ``segments(2)``, ``nested(sqrt,sqrt)``, segment plans with a
one-block segment under ``save_dots``, ``attention_only`` + ``mlp_only``, and ``save_qkv_proj`` +
``save_dots_no_batch``), and prints one row per plan: the number of gradient tensors that differ
and the largest ULP distance (0 and 0 when bitwise). The default rendering,
``remat_scan(method="reverse_loop")``, is what runs. Exit status 1 when any row differs.

The property test (tests/jaxremat/test_bitwise_jit.py) draws a few random cases per run; this is
the wider grid behind docs/framework-differences.md, section 2. About 10 s per row on 2 cores.

Usage::

    python scripts/bitwise_sweep.py                                   # D 4,8,16,32,48,64,128; N 1,3,5
    python scripts/bitwise_sweep.py --widths 32 --depths 4 --dropout 0.1 --compute bfloat16
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxremat.model import loss_fn
from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec import parse_schedule
from parity.checks.compare import ulp_distance


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


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=_ints, default=[4, 8, 16, 32, 48, 64, 128], help="d_model values")
    ap.add_argument("--depths", type=_ints, default=[1, 3, 5], help="N values")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--compute", choices=("float32", "bfloat16"), default="float32",
                    help="compute dtype (parameters stay float32)")
    args = ap.parse_args(argv)
    compute = None if args.compute == "float32" else args.compute
    print(f"{'D':>4} {'N':>2} {'plan':<48} {'loss':<8} {'grads differing':>15} {'max ULP':>12}")
    failed = 0
    for d in args.widths:
        for n in args.depths:
            cfg = TransformerConfig(vocab_size=256, n_layer=n, d_model=d, n_head=2 if d % 2 == 0 else 1, d_ff=2 * d,
                                    max_seq_len=16, dropout=args.dropout, compute_dtype=compute)
            ref_loss, ref = value_and_grad(cfg, "none")
            for plan in plans(n):
                loss, grads = value_and_grad(cfg, plan)
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
