"""The distributed suite (``python -m parity run --suite distributed``): both frameworks past one device.

:func:`run_distributed` runs each framework's meshes through its
:meth:`parity.runners.framework.Framework.run_distributed` (JAX: the worker process of
:mod:`parity.distributed.jax_worker`, which takes its host-device count from ``XLA_FLAGS`` at start;
PyTorch: the ranks of :mod:`parity.distributed.torch_worker`; both started by
:mod:`parity.distributed.launch`), and compares each PyTorch mesh's ``none`` gradients with the JAX
mesh of the same layout (else JAX data parallel) within :data:`parity.checks.compare.TOLERANCES`
(:func:`parity.checks.compare.cross_row`). The report object carries the usual keys (``cases``
empty) plus ``distributed``: one section per mesh, its rows case records (docs/report-schema.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from safetensors.numpy import load_file

import numpy as np

from parity.cases.record import base_case
from parity.checks.compare import cross_row
from parity.distributed.jax_worker import DEFAULT_MESHES, DEFAULT_PLANS
from parity.inputs.pretrained import preset_inputs
from parity.inputs.train import AdamWConfig
from parity.report.suite_report import SCHEMA_VERSION, SUITE_MARKER
from parity.runners.framework import FRAMEWORK_NAMES, FRAMEWORKS, get_framework, loss_term_scale
from parity.runners.result import RunResult

def _cross(a_rows: list[dict], b_rows: list[dict], cfg, params, tokens) -> list[dict]:
    """One cross-framework row per ``none`` row of the second framework (PyTorch): against the first's (JAX)
    ``none`` of the same layout, else of the data-parallel one, by :func:`parity.checks.compare.cross_row`."""
    scale = loss_term_scale(cfg, params, tokens)
    a_fw, b_fw = FRAMEWORK_NAMES
    by_layout = {}
    for r in a_rows:
        if r["plan"] == "none" and r["status"] != "error" and r["grads_file"]:
            by_layout.setdefault(r["layout"], r)
    out = []
    for t in b_rows:
        if t["plan"] != "none" or t["grads_file"] is None:
            continue
        j = by_layout.get(t["layout"]) or by_layout.get("data_parallel")
        out.append(cross_row("none", cfg.dtype, None if j is None else _run_of(j), _run_of(t), scale,
                             failure=f"no {FRAMEWORKS[a_fw].label} mesh ran none",
                             variant=f"{a_fw} {j['mesh'] if j else '-'} vs {b_fw} {t['mesh']}",
                             **{f"{a_fw}_mesh": j and j["mesh"], f"{b_fw}_mesh": t["mesh"]}))
    return out


def _run_of(row: dict) -> RunResult:
    """A row's loss and its gradient file, as a run (what :func:`parity.checks.compare.cross_row` compares)."""
    return RunResult(loss=np.asarray(row["loss"]), grads=load_file(row["grads_file"]), trained=None, mode=row["mode"])


def _records(framework: str, rows: list[dict], preset, cfg) -> list[dict]:
    """The rows as case records: the base fields (:func:`parity.cases.record.base_case`) first, then the row's."""
    mode = FRAMEWORKS[framework].measured_mode
    return [{**base_case(framework, mode, r["plan"], preset.name, cfg), **r} for r in rows]


def run_distributed(preset, out_dir: Path, *, devices: int = 4, meshes: tuple[str, ...] = DEFAULT_MESHES,
                    plans: tuple[str, ...] = DEFAULT_PLANS, frameworks: tuple[str, ...] = FRAMEWORK_NAMES,
                    seed: int = 0, hparams=None, note=print, processes: int = 1) -> dict:
    """Run the distributed suite and return the report object (module docstring).

    Args:
        preset: the model preset (a :class:`parity.inputs.presets.ModelPreset`).
        out_dir: where the workers write their rows and gradient files (``out_dir/distributed``).
        devices: JAX host devices (CPU) the worker starts with.
        meshes: JAX mesh specs.
        plans: plan names (``none`` first).
        frameworks: names of :data:`parity.runners.framework.FRAMEWORKS`.
        seed: weights and tokens seed.
        hparams: AdamW settings recorded in the report.
        note: called with a one-line message (a framework's half missing).
        processes: > 1 also runs each JAX mesh spread over that many processes
            (:mod:`parity.distributed.jax_multiprocess`), in a section of its own after the mesh's.

    Raises:
        ValueError: a mesh does not divide the devices or the model (one line).
        parity.distributed.launch.WorkerError: a worker failed.
    """
    work = Path(out_dir) / "distributed"
    work.mkdir(parents=True, exist_ok=True)
    (work / SUITE_MARKER).write_text("written by python -m parity run --suite distributed; --overwrite removes "
                                     "this folder\n")
    cfg, params, tokens = preset_inputs(preset, "float32", seed)
    report = {"schema": SCHEMA_VERSION, "suite": "distributed", "model": preset.name,
              "config": dataclasses.asdict(cfg), "batch_size": preset.batch_size, "seq_len": preset.seq_len,
              "hparams": dataclasses.asdict(hparams or AdamWConfig()), "seed": seed,
              "cases": [], "cross_framework": [],
              "distributed": {"devices": devices, "processes": processes, "meshes": [], "not_run": {}}}
    rows: dict[str, list[dict]] = {}
    for fw in (f for f in FRAMEWORK_NAMES if f in frameworks):
        try:
            framework = get_framework(fw)
        except ImportError as exc:  # the other framework's meshes still run
            why = (f"{FRAMEWORKS[fw].label} distributed half not run: {FRAMEWORKS[fw].module} cannot be imported "
                   f"({exc}); the other meshes ran alone")
            report["distributed"]["not_run"][fw] = why
            note(why)
            continue
        for m in framework.run_distributed(preset, work, devices=devices, meshes=meshes, plans=plans, seed=seed,
                                           processes=processes, hparams=hparams):
            m = {"framework": fw, **m, "rows": _records(fw, m["rows"], preset, cfg)}
            report["distributed"]["meshes"].append(m)
            rows.setdefault(fw, []).extend(m["rows"])
    if len(rows) == len(FRAMEWORK_NAMES):
        report["cross_framework"] = _cross(*(rows[f] for f in FRAMEWORK_NAMES), cfg, params, tokens)
    return report


def distributed_passed(report: dict) -> bool:
    """True when every distributed row passed (rows without ``distributed`` pass trivially)."""
    meshes = (report.get("distributed") or {}).get("meshes", [])
    return all(r["status"] == "pass" for m in meshes for r in m["rows"])
