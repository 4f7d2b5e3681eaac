"""The JAX worker of the distributed suite: ``python -m parity.distributed.jax_worker --devices 4 ...``.

Run as its own process because JAX reads its host-device count once, when it starts: the worker
sets ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (added to any flags already set) BEFORE
importing JAX. The flag only shapes the CPU backend; on a GPU machine JAX uses the real devices.
Each mesh is checked by :func:`parity.distributed.jax_checks.check_mesh`; the worker writes
``jax_rows.json`` (the meshes' :class:`parity.distributed.jax_checks.MeshReport` s) and one
safetensors file of ``none``'s gradients per mesh into ``--out``. With ``--processes P`` (> 1) each
mesh runs a second time spread over P processes (:func:`parity.distributed.jax_multiprocess.run_processes`,
files under ``--out/jax_<mesh>_processesP``), checked within itself and against the one-process run;
its section follows the mesh's.

Exit codes: 0 the rows were written (pass or fail is in them); 2 bad input (one line on stderr): a
``--devices`` below 1, a ``--model`` outside the GPT family (:func:`distributed_preset`), a bad plan
in ``--schedules`` (:func:`check_plans`) and an ``--out`` that is a file or cannot be written
(:func:`check_out_dir`) are refused before JAX is imported; a mesh that does not fit the devices or
the model before any mesh runs.
"""

from __future__ import annotations

# Deferred imports: JAX (and every project module that loads it) must be imported only after XLA_FLAGS
# is set from --devices, so they are imported inside main().

import argparse
import json
import os
import sys

from jaxremat.spec.plan import parse_plan
from parity.cli.checks import check_seed, unique_items
from parity.cli.util import OneLineParser, ascii_int
from parity.distributed.jax_multiprocess import (ProcessesError, check_out_dir, collective_probe, die_with_parent,
                                                distributed_preset, run_processes)
from parity.distributed.result import DistributedRow, grads_file_name
from parity.inputs.pretrained import preset_inputs
from parity.inputs.train import AdamWConfig

ROWS_FILE = "jax_rows.json"

DEFAULT_MESHES = ("data=2", "fsdp=4", "data=2,model=2")
DEFAULT_PLANS = ("none", "full", "every_k(2)", "sqrt", "every_k(2)+save_qkv_proj")

MAX_DEVICES = 256
"""The most devices ``--devices`` takes (each simulated CPU device is a thread pool of its own)."""


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m parity.distributed.jax_worker",
                      description="Run remat plans on JAX meshes and write jax_rows.json.")
    p.add_argument("--devices", type=ascii_int, default=4, help="host devices to simulate on CPU (default 4)")
    p.add_argument("--meshes", default=";".join(DEFAULT_MESHES), help="';'-separated mesh specs")
    p.add_argument("--schedules", default=",".join(DEFAULT_PLANS),
                   help="','-separated plans; none runs first whether listed or not")
    p.add_argument("--model", default="gpt-small", help="model preset (default gpt-small)")
    p.add_argument("--processes", type=ascii_int, default=1,
                   help="also run each mesh spread over this many processes (jax.distributed over 127.0.0.1, "
                   "gloo CPU collectives) and check it against the one-process run (default 1: one process only)")
    p.add_argument("--seed", type=ascii_int, default=0)
    p.add_argument("--out", required=True, help="output directory")
    return p


def check_plans(plans, n_layer: int) -> tuple[str, ...]:
    """The plan names of ``--schedules`` (a ','-separated string or a sequence), each checked at ``n_layer`` blocks.

    Each name is parsed by :func:`jaxremat.spec.plan.parse_plan` and its segments built for
    ``n_layer`` (``RematPlan.segments_for``); ``none`` need not be listed (the worker runs it first).
    The list itself is checked as every comma-separated option is (:func:`parity.cli.checks.unique_items`).

    Raises:
        ValueError: an empty list or item, a plan listed twice (two spellings of one plan count
            twice), or a bad plan (parse_plan's message: the valid schedule and policy names).
    """
    def name(item: str) -> str:
        try:
            plan = parse_plan(item)
            plan.segments_for(n_layer)
        except ValueError as exc:
            raise ValueError(f"--schedules: {exc}") from None
        return plan.name

    return unique_items("--schedules", plans if isinstance(plans, str) else ",".join(plans), canonical=name)


def check_devices(devices: int) -> int:
    """``--devices`` as given, if 1 .. :data:`MAX_DEVICES`.

    Raises:
        ValueError: fewer than 1 or more than :data:`MAX_DEVICES` devices.
    """
    if devices < 1:
        raise ValueError(f"--devices must be >= 1, got {devices}")
    if devices > MAX_DEVICES:
        raise ValueError(f"--devices {devices}: at most {MAX_DEVICES} (each simulated CPU device is a thread pool of "
                         "its own); pass a smaller count")
    return devices


def check_meshes(option: str, text: str) -> list:
    """The :class:`jaxremat.sharding.MeshSpec` s of a ';'-separated mesh list, each given once.

    Imports JAX (:mod:`jaxremat.sharding`); its backend does not start.

    Raises:
        ValueError: an empty list or entry, a bad spec (:func:`jaxremat.sharding.parse_mesh`'s message), or a mesh
            given twice (two spellings of one mesh count twice).
    """
    from jaxremat.sharding import parse_mesh

    items = [m.strip() for m in text.split(";")]
    if any(not m for m in items):
        raise ValueError(f"{option} {text!r} is empty or has an empty entry; give meshes such as 'data=2' or "
                         "'data=2;data=2,model=2'")
    specs = []
    for m in items:
        ms = parse_mesh(m)
        if ms.text in [s.text for s in specs]:
            raise ValueError(f"{option}: mesh {ms.text} is given twice; give each mesh once")
        specs.append(ms)
    return specs


def check_processes(mesh: str, processes: int) -> None:
    """Refuse a ``--processes`` that does not split mesh ``mesh``'s devices evenly (each process needs its share).

    Raises:
        ValueError: ``processes`` > 1 does not divide the mesh's device count; the message says which do.
    """
    from jaxremat.sharding import parse_mesh

    size = parse_mesh(mesh).size
    if processes > 1 and size % processes:
        fits = [p for p in range(2, size + 1) if size % p == 0]
        raise ValueError(f"--processes {processes} does not divide mesh {mesh}'s {size} devices (each process takes "
                         f"an equal share); pass --processes {' or '.join(map(str, fits)) or 1} or another --mesh")


def processes_dir_name(mesh: str, processes: int) -> str:
    """Directory of a mesh's multi-process runs, e.g. ``jax_fsdp-4_processes-2`` (the style of
    :func:`parity.distributed.result.grads_file_name`: ``-`` keeps an axis name from its size)."""
    return "jax_" + mesh.replace("=", "-").replace(",", "_") + f"_processes-{processes}"


def _check_processes_mesh(model, cfg, params, tokens, mesh, plans, hparams, args, out, one):
    """Mesh ``mesh`` over ``args.processes`` processes, checked within itself and against ``one`` (its one-process report)."""
    from jaxremat import sharding as shd
    from parity.distributed.jax_checks import MeshReport, check_mesh

    ms = shd.parse_mesh(mesh)
    one.probe = collective_probe(shd.make_mesh(ms))
    try:
        runs = run_processes(model, ms.text, plans, args.processes, out / processes_dir_name(ms.text, args.processes),
                             seed=args.seed)
    except ProcessesError as exc:  # recorded as the mesh's rows; the other meshes go on
        rows = [DistributedRow("jax", ms.text, shd.layout_of(ms), ms.size, args.processes, name, "error",
                               error=str(exc)) for name in dict.fromkeys(["none", *plans])]
        return MeshReport(ms.text, shd.layout_of(ms), rows, None, None, {}, {}, processes=args.processes)
    return check_mesh(cfg, params, tokens, ms.text, plans, hparams, runs=runs, processes=args.processes,
                      one_process=one)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    die_with_parent()  # started by the suite: a killed suite leaves no worker behind
    try:  # bad input answers in one line before JAX loads
        check_devices(args.devices)
        check_seed(args.seed)
        if args.processes < 1:
            raise ValueError(f"--processes must be >= 1, got {args.processes}")
        preset = distributed_preset(args.model)
        plans = check_plans(args.schedules, preset.config.n_layer)
        out = check_out_dir(args.out)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    flag = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), flag) if f)
    from parity.distributed.jax_checks import check_mesh

    try:
        cfg, params, tokens = preset_inputs(preset, "float32", args.seed)
        meshes = [ms.text for ms in check_meshes("--meshes", args.meshes)]
        from jaxremat import sharding as shd

        for m in meshes:  # every mesh checked before any work starts
            shd.check_divides(m, cfg, tokens.shape[0])
            shd.make_mesh(m)
            check_processes(m, args.processes)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    hparams = preset.hparams or AdamWConfig()
    reports = []
    for m in meshes:
        reports.append(check_mesh(cfg, params, tokens, m, plans, hparams, out / grads_file_name("jax", m)))
        if args.processes > 1:
            reports.append(_check_processes_mesh(preset.name, cfg, params, tokens, m, plans, hparams, args, out,
                                                 reports[-1]))
    (out / ROWS_FILE).write_text(json.dumps({"model": preset.name, "devices": args.devices,
                                             "meshes": [r.to_json() for r in reports]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
