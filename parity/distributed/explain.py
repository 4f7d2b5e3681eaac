"""Show the ``local-shape-one-layer-segments`` exception on ONE device, without any mesh.

``python -m parity.distributed.explain --model gpt-tiny --batch 1 --plan full`` runs ``none`` and the
plan at a mesh's per-device batch (``data=2`` gives gpt-tiny's B=2 one sequence per device) on a
single CPU device and prints whether the gradients are bitwise (max ULP) and the number of
``while`` loops and ``conditional`` ops in each optimized HLO (the recomputed layer of a checkpointed
segment runs as a conditional branch inside the backward loop; docs/framework-differences.md,
section 2). ``--disable-pass NAME`` reruns with an XLA pass off
(``XLA_FLAGS=--xla_disable_hlo_passes=NAME``, set before JAX starts).
"""

from __future__ import annotations

# Deferred imports: XLA_FLAGS must be set from --disable-pass before JAX is imported, inside main().

import argparse
import os
import sys

from parity.inputs.pretrained import preset_inputs
import numpy as np
from jaxremat.spec.plan import parse_plan
from parity.checks.compare import compare_bitwise
from parity.inputs.presets import get_preset

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.distributed.explain", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt-small")
    p.add_argument("--batch", type=int, default=1, help="sequences per device (default 1)")
    p.add_argument("--plan", default="full")
    p.add_argument("--disable-pass", default=None, help="an XLA pass to disable, e.g. while-loop-simplifier")
    args = p.parse_args(argv)
    if args.disable_pass:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_disable_hlo_passes={args.disable_pass}").strip()

    from parity.distributed import jax_mesh as jm

    cfg, params, tokens = preset_inputs(get_preset(args.model), "float32", 0)
    tokens = np.asarray(tokens)[: args.batch]
    plans = [parse_plan("none"), parse_plan(args.plan)]
    grads = [jm.single_device_grads(cfg, params, tokens, q)[1] for q in plans]
    hlos = [jm.single_compiled_hlo(cfg, q, tokens.shape) for q in plans]
    b = compare_bitwise(grads[1], grads[0])
    print(f"{args.model} B={args.batch} one device, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"{plans[1].name} vs none: bitwise {b.equal}, max ULP {b.max_ulp}, max abs diff {b.max_abs_diff:.3e}, "
          f"{len(b.mismatched)} tensors differ")
    for q, h in zip(plans, hlos):
        print(f"{q.name}: {h.count(' while(')} while loops, {h.count(' conditional(')} conditionals in the optimized HLO")
    return 0


if __name__ == "__main__":
    sys.exit(main())
