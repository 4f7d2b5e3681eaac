"""The GPU measurement pass of the quick suite: device peak bytes per schedule in both frameworks.

``python -m parity.cases.gpu_pass --out gpu-report`` (or ``scripts/gpu_pass.sh``) runs, for every schedule
of the quick suite (``gpt-small``, float32), one loss+gradient step and reads the device's own
counters:

* JAX: ``jax.Device.memory_stats()["peak_bytes_in_use"]``, a high-water mark since the process
  started that JAX cannot reset, so each case runs in a fresh subprocess;
* PyTorch: ``torch.cuda.max_memory_allocated`` after ``torch.cuda.reset_peak_memory_stats()``,
  in-process, the peak reset between cases.

Each framework measures through its :meth:`parity.runners.framework.Framework.device_peak` (the
runners' one path, :func:`parity.runners.jax_memory.measure_jax`, :func:`parity.runners.torch_memory.measure_torch`),
which also gives each case's saved bytes; a framework whose high-water mark cannot be reset runs
each case in a fresh process (:attr:`parity.runners.framework.FrameworkInfo.fresh_process_per_device_case`).
Each number is written with its source (:func:`peak_source`). Without a GPU the pass exits 2 and
says so; it never reports a silent 0 (``torch.cuda.max_memory_allocated`` returns 0 on CPU).
``gpu_pass.json`` and ``gpu_pass.md`` are written atomically, the JSON strict (:mod:`parity.report.files`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from jaxremat.spec import DEFAULT_SCHEDULES
from jaxremat.spec.plan import parse_plan

from parity.cases.record import base_case
from parity.inputs.corpus import token_batch
from parity.inputs.presets import get_preset
from parity.report.environment import environment_info
from parity.report.files import atomic_write, json_text
from parity.report.format import md_table
from parity.runners.framework import FRAMEWORK_NAMES, FRAMEWORKS, get_framework

CASE_TIMEOUT_S = 240
"""Seconds one fresh-process case may take."""
GPU_PASS_MODEL = "gpt-small"
"""The preset every case of the pass runs (:meth:`parity.runners.framework.Framework.device_peak`)."""


def peak_source(framework: str, backend: str) -> str:
    """Where a peak number comes from for ``framework`` on ``backend`` (``"gpu"``/``"cuda"``/``"cpu"``).

    A GPU backend always selects the device counters; anything else the CPU measurements
    (:class:`parity.runners.framework.FrameworkInfo` ``device_peak_source`` / ``cpu_peak_source``).

    Raises:
        ValueError: unknown framework.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORK_NAMES)}, got {framework!r}")
    info = FRAMEWORKS[framework]
    return info.device_peak_source if backend in ("gpu", "cuda") else info.cpu_peak_source


def _row(framework: str, plan: str) -> dict:
    """A case record (:func:`parity.cases.record.base_case`) of the pass's model, status ``"measured"``."""
    preset = get_preset(GPU_PASS_MODEL)
    return {**base_case(framework, FRAMEWORKS[framework].measured_mode, parse_plan(plan).name, preset.name,
                        preset.config), "status": "measured"}


def _measure(framework: str, plan: str) -> dict:
    preset = get_preset(GPU_PASS_MODEL)
    tokens = token_batch(preset.batch_size, preset.seq_len)
    return get_framework(framework).device_peak(preset.config, tokens, parse_plan(plan))


def _case(framework: str, plan: str) -> dict:
    """One case: the framework's :meth:`parity.runners.framework.Framework.device_peak`; an error row when it raises."""
    try:
        return {**_row(framework, plan), **_measure(framework, plan)}
    except Exception as exc:  # recorded, and the pass goes on
        return {**_row(framework, plan), "status": "error", "error": f"{type(exc).__name__}: {exc}"}


def _fresh_process_case(framework: str, plan: str) -> dict:
    """One case in a fresh process (``--case FRAMEWORK:PLAN``): the device's high-water mark starts at zero."""
    res = subprocess.run([sys.executable, "-m", "parity.cases.gpu_pass", "--case", f"{framework}:{plan}"],
                         capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
    if res.returncode:
        return {**_row(framework, plan), "status": "error", "error": res.stderr[-2000:]}
    return {**_row(framework, plan), **json.loads(res.stdout.strip().splitlines()[-1])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.cases.gpu_pass", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("gpu-report"))
    p.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES))
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: FRAMEWORK:PLAN in a fresh process
    args = p.parse_args(argv)
    if args.case:
        framework, plan = args.case.split(":", 1)
        print(json.dumps(_measure(framework, plan)))
        return 0
    # the in-process frameworks are asked here; a fresh-process one would start its device in this process
    in_process = [f for f in FRAMEWORK_NAMES if not FRAMEWORKS[f].fresh_process_per_device_case]
    if not any(get_framework(f).gpu_available() for f in in_process):
        print("gpu_pass: no CUDA GPU here; the device measurements need one (CPU numbers: python -m parity run)",
              file=sys.stderr)
        return 2
    plans = [s for s in args.schedules.split(",") if s]
    rows = []
    for fw in FRAMEWORK_NAMES:
        run = _fresh_process_case if FRAMEWORKS[fw].fresh_process_per_device_case else _case
        rows += [run(fw, plan) for plan in plans]

    args.out.mkdir(parents=True, exist_ok=True)
    env = environment_info(tuple(in_process), on_gpu=True)  # the fresh-process cases ran in subprocesses
    atomic_write(args.out / "gpu_pass.json", json_text({"model": GPU_PASS_MODEL, "cases": rows, "environment": env,
                                                        "nonfinite_encoding": "string"}, indent=1))
    table = md_table(("framework", "plan", "step peak bytes", "peak bytes", "source"),
                     [[r["framework"], r["plan"], str(r.get("step_peak_bytes", "error")), str(r.get("peak_bytes", "-")),
                       (r.get("error") or r.get("source", ""))[:200]] for r in rows])
    atomic_write(args.out / "gpu_pass.md", table + "\n")
    print(table)
    return 1 if any(r["status"] == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
