"""The distributed suite (``python -m parity run --suite distributed``): both frameworks past one device.

:func:`run_distributed` starts the JAX worker (:mod:`parity.distributed.jax_worker`, its own process:
JAX takes its host-device count from ``XLA_FLAGS`` at start), then, when the
PyTorch worker module (:data:`TORCH_WORKER`) imports, the PyTorch ranks (its ``run_torch_distributed``), and compares each PyTorch mesh's ``none`` gradients with the JAX mesh
of the same layout (else JAX data parallel) within :data:`parity.checks.compare.TOLERANCES`
(:func:`parity.checks.compare.cross_check`). The report object carries the usual keys
(``cases`` empty) plus ``distributed``: one section per mesh (docs/report-schema.md).
"""

from __future__ import annotations

# Deferred imports: the PyTorch worker loads torch; it is imported only when the suite runs torch.

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

from safetensors.numpy import load_file

from parity.checks.compare import cross_check, tolerance_for
from parity.checks.loss_terms import loss_term_scale
from parity.distributed.jax_worker import DEFAULT_MESHES, DEFAULT_PLANS, ROWS_FILE
from parity.distributed.result import DistributedRow
from parity.inputs.pretrained import preset_inputs
from parity.inputs.train import AdamWConfig
from parity.report.suite_report import SCHEMA_VERSION, SUITE_MARKER

TORCH_WORKER = "parity.distributed.torch_worker"
TORCH_WORLD_SIZE = 2


class WorkerError(RuntimeError):
    """A worker process failed; the message holds its last stderr line."""


def run_jax_worker(model: str, devices: int, meshes: tuple[str, ...], plans: tuple[str, ...], out_dir: Path,
                   seed: int = 0, processes: int = 1) -> dict:
    """Run the JAX worker in a fresh process and return its ``jax_rows.json`` object.

    ``processes`` > 1 also runs each mesh spread over that many processes (the worker's ``--processes``).

    Raises:
        ValueError: the worker refused its input (exit 2: a mesh that does not divide the devices or the model).
        WorkerError: the worker failed otherwise.
    """
    cmd = [sys.executable, "-m", "parity.distributed.jax_worker", "--devices", str(devices), "--model", model,
           "--meshes", ";".join(meshes), "--schedules", ",".join(plans), "--seed", str(seed), "--processes", str(processes),
           "--out", str(out_dir)]
    # the worker dies with this process (jax_multiprocess.die_with_parent), and its own processes with it
    env = dict(os.environ, PARITY_LAUNCHER_PID=str(os.getpid()))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode == 2:
        raise ValueError(last)
    if proc.returncode != 0:
        raise WorkerError(f"JAX worker exited {proc.returncode}: {last}")
    return json.loads((out_dir / ROWS_FILE).read_text())


def torch_worker():
    """The PyTorch worker module, or None with the reason when it cannot be imported."""
    try:
        return importlib.import_module(TORCH_WORKER), None
    except ImportError as exc:
        return None, (f"PyTorch distributed half not run: {TORCH_WORKER} cannot be imported ({exc}); the JAX "
                      "meshes ran alone")


def _cross(jax_rows: list[dict], torch_rows: list[DistributedRow], cfg, params, tokens) -> list[dict]:
    """One cross-framework row per PyTorch ``none`` row: against the JAX ``none`` of the same layout (else data parallel)."""
    scale = loss_term_scale(cfg, params, tokens)
    by_layout = {}
    for r in jax_rows:
        if r["schedule"] == "none" and r["status"] != "error" and r["grads_file"]:
            by_layout.setdefault(r["layout"], r)
    out = []
    for t in torch_rows:
        if t.schedule != "none" or t.grads_file is None:
            continue
        j = by_layout.get(t.layout) or by_layout.get("data_parallel")
        tol, tol_loss = tolerance_for(cfg.dtype, "grads"), tolerance_for(cfg.dtype, "loss")
        row = {"schedule": "none", "dtype": cfg.dtype, "jax_mesh": j and j["mesh"], "torch_mesh": t.mesh,
               "variant": f"jax {j['mesh'] if j else '-'} vs torch {t.mesh}",
               "tolerance": tol.bound, "tolerance_reason": tol.reason, "tolerance_loss": tol_loss.bound,
               "tolerance_loss_reason": tol_loss.reason, "max_rel_err_grads": None, "ok": False, "error": None}
        if j is None:
            row["error"] = "no JAX mesh ran none"
        else:
            row.update(cross_check(j["loss"], t.loss, load_file(j["grads_file"]), load_file(t.grads_file), scale,
                                   cfg.dtype))
        out.append(row)
    return out


def run_distributed(preset, out_dir: Path, *, devices: int = 4, meshes: tuple[str, ...] = DEFAULT_MESHES,
                    plans: tuple[str, ...] = DEFAULT_PLANS, frameworks: tuple[str, ...] = ("jax", "torch"),
                    seed: int = 0, hparams=None, note=print, processes: int = 1) -> dict:
    """Run the distributed suite and return the report object (module docstring).

    Args:
        preset: the model preset (a :class:`parity.inputs.presets.ModelPreset`).
        out_dir: where the workers write their rows and gradient files (``out_dir/distributed``).
        devices: JAX host devices (CPU) the worker starts with.
        meshes: JAX mesh specs.
        plans: plan names (``none`` first).
        frameworks: subset of ``("jax", "torch")``.
        seed: weights and tokens seed.
        hparams: AdamW settings recorded in the report.
        note: called with a one-line message (the PyTorch half missing).
        processes: > 1 also runs each JAX mesh spread over that many processes
            (:mod:`parity.distributed.jax_multiprocess`), in a section of its own after the mesh's.

    Raises:
        ValueError: a mesh does not divide the devices or the model (one line).
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
              "distributed": {"devices": devices, "processes": processes, "meshes": [], "torch_status": None}}
    jax_rows: list[dict] = []
    if "jax" in frameworks:
        jax_out = run_jax_worker(preset.name, devices, meshes, plans, work, seed, processes)
        for m in jax_out["meshes"]:
            report["distributed"]["meshes"].append({"framework": "jax", **m})
            jax_rows += m["rows"]
    if "torch" in frameworks:
        module, why = torch_worker()
        if module is None:
            report["distributed"]["torch_status"] = why
            note(why)
        else:
            rows = module.run_torch_distributed(preset.name, TORCH_WORLD_SIZE, plans, str(work), seed=seed, hparams=hparams)
            for mesh in dict.fromkeys(r.mesh for r in rows):
                mine = [r for r in rows if r.mesh == mesh]
                report["distributed"]["meshes"].append({"framework": "torch", "mesh": mesh, "layout": mine[0].layout,
                                                        "rows": [r.to_json() for r in mine]})
            report["distributed"]["torch_status"] = "ran"
            if jax_rows:
                report["cross_framework"] = _cross(jax_rows, rows, cfg, params, tokens)
    return report


def distributed_passed(report: dict) -> bool:
    """True when every distributed row passed (rows without ``distributed`` pass trivially)."""
    meshes = (report.get("distributed") or {}).get("meshes", [])
    return all(r["status"] == "pass" for m in meshes for r in m["rows"])
