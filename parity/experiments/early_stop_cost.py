"""``python -m parity.experiments.early_stop_cost``: what turning checkpoint early stop off costs, per plan.

The measurement is :func:`torchref.early_stop_cost.measure` (peak bytes, backward ops and FLOPs,
interleaved step times, with early stop off and on); this command runs it on the GPT for each plan
and prints one JSON line per plan. The numbers docs/framework-differences.md section 10 quotes come
from it.
"""

from __future__ import annotations

import argparse
import json

from jaxremat.models import TransformerConfig
from torchref.early_stop_cost import measure

from parity.cli.util import split_list


def main(argv: list[str] | None = None) -> int:
    """Parse the options, measure each plan, print one JSON line per plan; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m parity.experiments.early_stop_cost",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--plans", default="full,every_k(2),sqrt,full+save_dots,nested(sqrt,sqrt)",
                        help="comma-separated plans at the top level (nested(...) keeps its commas)")
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per setting (interleaved)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=64, help="d_model (d_ff = 4 d_model, 4 heads)")
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args(argv)
    cfg = TransformerConfig(d_model=args.d_model, d_ff=4 * args.d_model, max_seq_len=args.seq_len)
    for plan in split_list(args.plans):
        print(json.dumps(measure(plan, cfg, args.batch, args.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
