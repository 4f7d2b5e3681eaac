"""``python -m parity.experiments.compiled_budget``: ``torch.compile`` with an activation memory budget, per budget.

One Markdown table row per budget of :func:`torchref.compiled.measure_compiled` on a GPT (saved and peak
bytes, recompute FLOPs, the gradients against eager ``none``, random ops redrawn, step and compile
seconds); the measurements docs/torch-compile-budget.md quotes come from it.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from jaxremat.models import TransformerConfig, init_params
from torchref.compiled import BACKENDS, measure_compiled
from torchref.compiled_random import RANDOM_OPS, check_text, compiled_problem


def _parse_budgets(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"budgets must be comma-separated numbers, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m parity.experiments.compiled_budget``: one table row per budget (bytes, FLOPs, seconds)."""
    parser = argparse.ArgumentParser(prog="python -m parity.experiments.compiled_budget",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=_parse_budgets, default=[1.0, 0.5, 0.2, 0.1, 0.05])
    parser.add_argument("--backend", default="aot_eager_decomp_partition", choices=BACKENDS)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dropout", type=float, default=0.0, help="the model's dropout rate (default 0)")
    parser.add_argument("--random-ops", default="save", choices=RANDOM_OPS,
                        help="save: random ops are never recomputed (default); recompute: torch's own partition")
    parser.add_argument("--random-op-dropout", type=float, default=0.1,
                        help="for a model without dropout: the dropout rate of the gradient check with random ops "
                        "(0: no such check)")
    parser.add_argument("--shapes", action="store_true", help="after the table: the saved shapes per budget")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads(N) first (1 gives steady step times on a shared machine)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    cfg = TransformerConfig(vocab_size=256, n_layer=args.layers, d_model=args.d_model, n_head=args.heads,
                            d_ff=2 * args.d_model, max_seq_len=args.seq, dropout=args.dropout)
    params = init_params(cfg)
    tokens = np.random.default_rng(args.seed).integers(0, cfg.vocab_size, (args.batch, args.seq + 1))
    print(f"# {cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, d_ff {cfg.d_ff}, "
          f"B={args.batch}, T={args.seq}, dropout {cfg.dropout:g}, backend {args.backend}, random ops "
          f"{args.random_ops}, torch {torch.__version__}"
          f", {torch.get_num_threads()} intra-op threads")
    print("| budget | saved bytes | saved tensors | peak bytes | peak activation bytes | MemTracker peak "
          "| recompute FLOPs | bitwise | max ULP | max rel err | random ops redrawn | dropout check "
          "| step s (median) | compile s | graphs | problem |")
    print("|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---|---:|---:|---:|---|")
    first, shapes = True, {}
    for b in args.budgets:
        r = measure_compiled(cfg, params, tokens, b, backend=args.backend, repeats=args.repeats,
                             random_ops=args.random_ops, random_op_dropout=args.random_op_dropout)
        if first:
            print(f"| eager none | {r.eager_saved_bytes} | | {r.eager_peak_activation_bytes + r.peak_bytes - r.peak_activation_bytes} "
                  f"| {r.eager_peak_activation_bytes} | | 0 | | | | | | {r.eager_step_time_s:.4f} | | | |")
            first = False
        print(f"| {r.budget:g} | {r.saved_bytes} | {r.saved_tensors} | {r.peak_bytes} | {r.peak_activation_bytes} "
              f"| {r.memtracker_peak_bytes} | {r.recompute_flops} | {'yes' if r.grads_bitwise_equal else 'no'} "
              f"| {r.max_ulp} | {r.max_rel_err:.1e} | {r.random_ops_recomputed} of {r.random_ops_in_graph} "
              f"| {check_text(r.random_op_check)} | {r.step_time_s:.4f} | {r.compile_s:.2f} | {r.compiles} "
              f"| {compiled_problem(r) or ''} |", flush=True)
        shapes[b] = r.saved_shapes
    if args.shapes:
        print()
        for b, saved in shapes.items():
            counts: dict[tuple[int, ...], int] = {}
            for shape in saved:
                counts[shape] = counts.get(shape, 0) + 1
            print(f"budget {b:g}: " + ", ".join(f"{n} x {list(sh)}" for sh, n in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
