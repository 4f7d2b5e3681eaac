"""Starting each framework's distributed half: the JAX worker process, the PyTorch ranks.

The distributed suite (:mod:`parity.distributed.suite`) reaches each framework through its
:meth:`parity.runners.framework.Framework.run_distributed`, which calls the launcher here:
:func:`run_jax_worker` starts :mod:`parity.distributed.jax_worker` in a fresh process (JAX takes its
host-device count from ``XLA_FLAGS`` at start), :func:`run_torch_ranks` starts the PyTorch ranks of
:mod:`parity.distributed.torch_worker`. Both return the mesh sections of the report, rows as JSON dicts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from parity.distributed.jax_worker import ROWS_FILE
from parity.distributed.torch_worker import run_torch_distributed

TORCH_WORLD_SIZE = 2
"""Ranks of every PyTorch mesh (``ddp=2``, ``fsdp2=2``)."""


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
    return json.loads((Path(out_dir) / ROWS_FILE).read_text())


def run_torch_ranks(model: str, plans: tuple[str, ...], out_dir: Path, *, seed: int = 0, hparams=None) -> list[dict]:
    """Run the PyTorch meshes (``ddp=W``, ``fsdp2=W``, W = :data:`TORCH_WORLD_SIZE`) and return their sections:
    ``[{"mesh", "layout", "rows"}]``, rows as JSON dicts (:class:`parity.distributed.result.DistributedRow`)."""
    rows = run_torch_distributed(model, TORCH_WORLD_SIZE, plans, str(out_dir), seed=seed, hparams=hparams)
    out = []
    for mesh in dict.fromkeys(r.mesh for r in rows):
        mine = [r for r in rows if r.mesh == mesh]
        out.append({"mesh": mesh, "layout": mine[0].layout, "rows": [r.to_json() for r in mine]})
    return out
