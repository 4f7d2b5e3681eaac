"""``python -m parity.experiments.xla_remat_program``: what XLA:CPU compiles for ``none`` and for remat plans.

Remat measured faster than ``none`` on XLA:CPU (issue 37: 0.91-0.97x at the default size). This
command compiles ``jit(value_and_grad(loss_fn))`` of the GPT for each plan and prints, from the
compiled program (``compiled.as_text()``, ``compiled.memory_analysis()``, ``compiled.cost_analysis()``):
fusions, ``while`` loops, ``dynamic-update-slice`` and ``dynamic-slice`` ops (the scanned stack's
residuals written into and read from their stacked buffers), ``copy`` ops and matrix products, each
counted once in the program's text (a loop body once, whatever its trip count), XLA's compiled temp
bytes, and its cost model's FLOPs and bytes accessed (which also count a loop body once: they compare
programs of one loop structure, not whole steps). docs/time.md reads them.
"""

from __future__ import annotations

import argparse
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxremat.model import loss_fn
from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.plan import parse_plan

from parity.cli.util import split_list

OPS = {"fusions": r"\bfusion\(", "while": r"\bwhile\(", "dynamic-update-slice": r"\bdynamic-update-slice\(",
       "dynamic-slice": r"\bdynamic-slice\(", "copy": r"\bcopy\(", "dot": r"\bdot\("}


def program_stats(cfg: TransformerConfig, batch: int, seq: int, plan: str) -> dict:
    """Op counts of the optimized HLO, temp bytes and XLA's cost analysis for one plan."""
    params = {k: jnp.asarray(v) for k, v in init_params(cfg).items()}
    tokens = jnp.zeros((batch, seq + 1), jnp.int32)
    parsed = parse_plan(plan)
    compiled = jax.jit(jax.value_and_grad(lambda p, t: loss_fn(p, t, cfg, parsed))).lower(params, tokens).compile()
    text = compiled.as_text()
    out = {name: len(re.findall(pattern, text)) for name, pattern in OPS.items()}
    out["temp_bytes"] = compiled.memory_analysis().temp_size_in_bytes
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    out["flops"] = cost.get("flops", float("nan"))
    out["bytes_accessed"] = cost.get("bytes accessed", float("nan"))
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse the options, compile each plan, print one Markdown table; returns 0."""
    ap = argparse.ArgumentParser(prog="python -m parity.experiments.xla_remat_program",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--plans", default="none,full,every_k(2),sqrt,full+attention_only")
    ap.add_argument("--d-model", type=int, default=256, help="d_model (d_ff = 4 d_model, 4 heads, 8 layers)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=3)
    args = ap.parse_args(argv)
    cfg = TransformerConfig(vocab_size=256, n_layer=8, d_model=args.d_model, n_head=4, d_ff=4 * args.d_model,
                            max_seq_len=args.seq_len)
    print(f"# jax {jax.__version__} on {jax.devices()[0].platform}; 8 layers, d_model {args.d_model}, "
          f"B={args.batch}, T={args.seq_len}")
    cols = [*OPS, "temp_bytes", "flops", "bytes_accessed"]  # the last two: XLA's cost model, loop bodies once
    print("\n| plan | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for plan in split_list(args.plans):
        s = program_stats(cfg, args.batch, args.seq_len, plan.strip())
        cells = [f"{s[c]:.3g}" if isinstance(s[c], float) else str(s[c]) for c in cols]
        print(f"| `{plan}` | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
