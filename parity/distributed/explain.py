"""Show the mechanism behind a plan that is not bitwise against ``none``, on one device or on a mesh.

One device (default): ``python -m parity.distributed.explain --model gpt-tiny --batch 1 --plan full``
runs ``none`` and the plan at a mesh's per-device batch (``data=2`` gives gpt-tiny's B=2 one
sequence per device) on a single CPU device and prints whether the gradients are bitwise (max ULP)
and the number of ``while`` loops and ``conditional`` ops in each optimized HLO (the recomputed
layer of a checkpointed segment runs as a conditional branch inside the backward loop;
docs/framework-differences.md, section 2; the ``local-shape-one-layer-segments`` exception).

On a mesh: ``python -m parity.distributed.explain --mesh fsdp=4 --no-carry-sharding`` runs both
on the mesh (simulated CPU devices) with the residual stream left to XLA's sharding propagation,
and prints, beside the bitwise verdict, how many matmuls all-reduce a partial-sum activation
(:func:`parity.distributed.jax_mesh.activation_all_reduces`) in the forward pass, in the recompute
and in the gradient: a matmul that splits its contraction over devices in the forward pass but not
when recomputed sums in another order (docs/sharding.md). Without ``--no-carry-sharding`` the
harness's default, the stream pinned at every block boundary, is shown.

Over several processes: ``python -m parity.distributed.explain --mesh fsdp=4 --processes 2`` runs
the collective probe (:func:`parity.distributed.jax_multiprocess.collective_probe`: a ``psum`` over
each mesh axis) on the mesh in this process and spread over 2 processes (``jax.distributed``, gloo
CPU collectives) and prints, per axis, the order in which each chunk of the result summed its
operands (the ``collective-summation-order`` exception; docs/sharding.md, "Several processes").

``--disable-pass NAME`` reruns with an XLA pass off (``XLA_FLAGS=--xla_disable_hlo_passes=NAME``,
set before JAX starts).
"""

from __future__ import annotations

# Deferred imports: XLA_FLAGS must be set from --disable-pass and --mesh before JAX is imported, inside main().

import os
import sys
import tempfile

import numpy as np

from jaxremat.spec.plan import parse_plan
from parity.checks.compare import compare_bitwise
from parity.cli.util import OneLineParser, ascii_int
from parity.distributed.jax_multiprocess import ProcessesError, collective_probe, distributed_preset, run_processes
from parity.distributed.jax_worker import check_processes
from parity.inputs.pretrained import preset_inputs
from parity.inputs.train import AdamWConfig


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m parity.distributed.explain", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt-small")
    p.add_argument("--batch", type=ascii_int, default=1, help="sequences per device, one-device mode (default 1)")
    p.add_argument("--plan", default="full")
    p.add_argument("--mesh", default=None, help="run on this mesh (e.g. fsdp=4) instead of one device")
    p.add_argument("--no-carry-sharding", action="store_true",
                   help="on a mesh: do not pin the residual stream at block boundaries")
    p.add_argument("--disable-pass", default=None, help="an XLA pass to disable, e.g. while-loop-simplifier")
    p.add_argument("--processes", type=ascii_int, default=1,
                   help="with --mesh: compare the collective probe in one process and over this many processes")
    args = p.parse_args(argv)
    from jaxremat import sharding as shd  # imports JAX; its backend starts later, after XLA_FLAGS is set

    try:
        plans = [parse_plan("none"), parse_plan(args.plan)]
        ms = shd.parse_mesh(args.mesh) if args.mesh is not None else None
        preset = distributed_preset(args.model)
        if not 1 <= args.batch <= preset.batch_size:
            raise ValueError(f"--batch must be in 1..{preset.batch_size} (the sequences of {preset.name}'s batch), "
                             f"got {args.batch}")
        if args.processes < 1:
            raise ValueError(f"--processes must be >= 1, got {args.processes}")
    except (ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    flags = [os.environ.get("XLA_FLAGS", "")]
    if args.disable_pass:
        flags.append(f"--xla_disable_hlo_passes={args.disable_pass}")
    if ms is not None:
        flags.append(f"--xla_force_host_platform_device_count={ms.size}")
    os.environ["XLA_FLAGS"] = " ".join(f for f in flags if f)
    cfg, params, tokens = preset_inputs(preset, "float32", 0)
    if ms is not None:
        try:
            shd.check_divides(ms, cfg, tokens.shape[0])
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    if args.processes > 1:
        if ms is None:
            print("error: --processes needs a --mesh (e.g. --mesh fsdp=4)", file=sys.stderr)
            return 2
        return _explain_processes(args.model, ms, args.processes)
    from parity.distributed import jax_mesh as jm

    if ms is None:
        tokens = np.asarray(tokens)[: args.batch]
        grads = [jm.single_device_grads(cfg, params, tokens, q)[1] for q in plans]
        hlos = [jm.single_compiled_hlo(cfg, q, tokens.shape) for q in plans]
        where = f"B={args.batch} one device"
    else:
        mesh = shd.make_mesh(ms)
        runs = [jm.run_plan(cfg, params, tokens, q, ms.text, mesh, AdamWConfig(steps=1),
                            carry_sharding=not args.no_carry_sharding) for q in plans]
        grads, hlos = [r.grads for r in runs], [r.hlo for r in runs]
        pinned = "left to sharding propagation" if args.no_carry_sharding else "pinned at block boundaries"
        where = f"B={tokens.shape[0]} on mesh {ms.text}, residual stream {pinned}"
    b = compare_bitwise(grads[1], grads[0])
    print(f"{args.model} {where}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"{plans[1].name} vs none: bitwise {b.equal}, max ULP {b.max_ulp}, max abs diff {b.max_abs_diff:.3e}, "
          f"{len(b.mismatched)} tensors differ")
    shape = (tokens.shape[0], tokens.shape[1] - 1, cfg.d_model)
    for q, h in zip(plans, hlos):
        line = f"{q.name}: {h.count(' while(')} while loops, {h.count(' conditional(')} conditionals in the optimized HLO"
        if ms is not None:
            ar = jm.activation_all_reduces(h, shape)
            line += (f"; matmuls all-reducing a {list(shape)} activation: forward {ar['forward']}, "
                     f"recompute {ar['recompute']}, gradient {ar['gradient']}")
        print(line)
    return 0


def _orders(probe: dict) -> list[str]:
    out = []
    for axis, p in probe.items():
        chunks = ", ".join("?" if o is None else "+".join(f"x{i}" for i in o) for o in p["orders"])
        out.append(f"  {axis}: {p['device_order']:.1%} of elements in device order; chunk orders {chunks}")
    return out


def _explain_processes(model: str, ms, processes: int) -> int:
    """The collective probe of mesh ``ms`` here (one process) and over ``processes`` processes."""
    from jaxremat import sharding as shd

    try:
        check_processes(ms.text, processes)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    here = collective_probe(shd.make_mesh(ms))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            there = run_processes(model, ms.text, (), processes, tmp)["probe"]
        except ProcessesError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(f"psum of 1024 float32 per device on mesh {ms.text}; x<i> = the operand of the axis's device i, "
          "each chunk summed left to right in the order shown")
    print("one process:")
    print("\n".join(_orders(here)))
    print(f"{processes} processes (jax.distributed over 127.0.0.1, gloo CPU collectives):")
    print("\n".join(_orders(there)))
    same = all(here[a]["bits"] == there[a]["bits"] for a in here)
    print(f"probe bitwise equal: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
