"""``python -m parity run --suite distributed``: the options, the out directory, the run, the report.

Exit codes as for the other suites: 0 every check passed, 1 a check failed or a case errored, 2 bad
input (a mesh that does not divide the devices or the model, an option another suite owns).
"""

from __future__ import annotations

# Deferred imports: jaxremat.sharding loads JAX; it is imported when the meshes are checked, so --help and
# option errors stay fast (the workers run in their own processes).

import math
import time

from parity.cli import checks as cc
from parity.distributed.jax_worker import (DEFAULT_MESHES, DEFAULT_PLANS, MAX_DEVICES, check_devices, check_meshes,
                                          check_plans, check_processes, distributed_preset)
from parity.distributed.launch import WorkerError
from parity.distributed.suite import run_distributed
from parity.cli.command import checked, claimed, fail
from parity.report.environment import environment_info
from parity.report.suite_report import REPORT_FILES
from parity.runners.framework import FRAMEWORK_NAMES, FRAMEWORKS

DEFAULT_DEVICES = 4


def _check_meshes_fit(specs, devices: int) -> None:
    """Refuse, in one line naming every one, the meshes whose device count does not divide ``devices``.

    Raises:
        ValueError: some mesh of ``specs`` (:class:`jaxremat.sharding.MeshSpec`) needs a device count
            that does not divide ``devices``; the message names each with its size and the fix.
    """
    misfits = [ms for ms in specs if devices % ms.size]
    if not misfits:
        return
    named = [f"{ms.text} ({ms.size} devices)" for ms in misfits]
    named = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    fits_all = math.lcm(*(ms.size for ms in specs))
    fix = f"pass --devices {fits_all} (fits every mesh) or" if fits_all <= MAX_DEVICES else "pass"
    what = "mesh" if len(misfits) == 1 else f"{len(misfits)} meshes"
    raise ValueError(f"{what} {named} {'does' if len(misfits) == 1 else 'do'} not divide --devices {devices}; "
                     f"{fix} a --mesh whose mesh sizes divide {devices}")


def _options(args):
    """``(preset, devices, meshes, plans, frameworks, processes)`` of the options; raises ValueError (one line)."""
    if args.checkpoint is not None:
        raise ValueError("--suite distributed runs a --model preset; drop --checkpoint")
    if args.dtype != "float32":
        raise ValueError("--suite distributed runs float32; drop --dtype")
    if (args.batch_size, args.seq_len) != (None, None):
        raise ValueError("--suite distributed runs each preset at its own shape; leave out --batch-size and --seq-len")
    if args.repeats is not None:
        raise ValueError("--suite distributed times no steps (it checks bits and per-device memory); drop --repeats")
    if args.model is not None and not args.model.strip():
        raise ValueError("--model is empty; give a preset (gpt-small, gpt-tiny) or leave it out for gpt-small")
    cc.check_seed(args.seed)
    args.out = cc.out_path("--out", args.out)
    preset = distributed_preset(args.model or "gpt-small")
    devices = check_devices(DEFAULT_DEVICES if args.devices is None else args.devices)
    from jaxremat.sharding import check_divides  # imports JAX: only once --suite distributed is chosen

    cfg = preset.config
    specs = check_meshes("--mesh", ";".join(DEFAULT_MESHES) if args.mesh is None else args.mesh)
    processes = 1 if args.processes is None else args.processes
    if processes < 1:
        raise ValueError(f"--processes must be >= 1, got {processes}")
    # one line for a mesh that does not divide the model or the processes, before any work; before the
    # device count, whose fix (--devices N) would not help such a mesh
    for ms in specs:
        check_divides(ms, cfg, preset.batch_size)
        check_processes(ms.text, processes)
    _check_meshes_fit(specs, devices)
    canonical = [ms.text for ms in specs]
    # a bad plan is bad input (exit 2), found before any worker starts
    plans = check_plans(DEFAULT_PLANS if args.schedules is None else args.schedules, cfg.n_layer)
    frameworks = cc.frameworks_option(args.frameworks)
    if processes > 1 and not any(FRAMEWORKS[f].multi_process_meshes for f in frameworks):
        spread = ",".join(f for f in FRAMEWORK_NAMES if FRAMEWORKS[f].multi_process_meshes)
        raise ValueError(f"--processes spreads the {spread} meshes over processes; add {spread} to --frameworks or "
                         "drop --processes")
    return preset, devices, tuple(canonical), plans, frameworks, processes


def cmd_distributed(args, console) -> int:
    """Run the distributed suite and write report.json / report.md into ``--out``."""
    preset, devices, meshes, plans, frameworks, processes = checked(console, _options, args)
    # the previous run's gradient files (named in its report.json) are kept with its report
    with claimed(console, args.out, args.overwrite, (*REPORT_FILES, "distributed/")) as claim:
        t0 = time.perf_counter()
        try:
            report = run_distributed(preset, args.out, devices=devices, meshes=meshes, plans=plans,
                                     frameworks=frameworks, seed=args.seed, processes=processes,
                                     hparams=preset.hparams, note=lambda m: cc.note(console, m))
        except KeyboardInterrupt:  # the workers die with this process (PR_SET_PDEATHSIG)
            claim.interrupted(f"interrupted: no report was written (the suite writes it at the end); "
                              f"{args.out / 'distributed'} holds the workers' partial files")
        except ValueError as exc:
            fail(console, exc)
        except WorkerError as exc:
            cc.error(console, exc)
            return 1
        report["wall_time_s"] = time.perf_counter() - t0
        report["complete"] = True
        report["environment"] = environment_info(frameworks)
        return cc.finish_report(console, report, args.out, "the report's mesh tables", wide=args.wide)
