"""The PyTorch half of ``--suite distributed``: remat plans on DDP and FSDP2 ranks, checked bit for bit.

:func:`run_torch_distributed` starts ``world_size`` ranks with ``torch.multiprocessing``
(``spawn``), a ``gloo`` process group on the loopback address (NCCL when every rank has a CUDA
device), and returns one :class:`parity.distributed.result.DistributedRow` per (mesh, plan):

* mesh ``"ddp=W"`` (layout ``data_parallel``): :func:`torchref.distributed.replicate_model`,
  i.e. ``DistributedDataParallel`` -- PyTorch's data-parallel engine, whose all-reduce average is
  the reference arithmetic the FSDP2 case is compared with;
* mesh ``"fsdp2=W"`` (layout ``fully_sharded``): :func:`torchref.distributed.fully_shard_model`.

Each rank loads the weights and tokens of the single-device harness
(:func:`parity.inputs.pretrained.preset_inputs`, same preset, dtype and seed) and takes rows
``[r*B/W, (r+1)*B/W)`` of the batch. Per plan: one loss+gradient step (gradients gathered whole,
``DTensor.full_tensor()``), ``hparams.steps`` AdamW steps (trained weights gathered whole; the last
step's per-rank memory measured, :mod:`parity.distributed.torch_memory`). Rank 0 checks:

* within the mesh: loss (every rank's local loss), gradients and trained weights bitwise against
  ``none`` on the same mesh (``none`` against a second ``none`` run: determinism), the ULP
  distance when not;
* against one process: the gradients bitwise against the MEAN of the per-shard single-device
  gradients (each shard's batch through a plain :class:`torchref.model.GPT`, summed in rank
  order, divided by W). The full-batch gradient is measured too (``torch_references.json``): it
  differs by summation order (the loss's mean over B*T tokens is one sum in one process and W
  partial means averaged across ranks).

Files written to ``out_dir``: ``torch_rows.json`` (the rows), ``torch_references.json`` (the
reference measurements) and ``torch_<mesh>_none_grads.safetensors`` per mesh
(:func:`parity.distributed.result.grads_file_name`; ``none``'s gradients, canonical names of
:meth:`torchref.model.GPT.to_params`, full arrays).

Example::

    from parity.distributed.torch_worker import run_torch_distributed
    rows = run_torch_distributed("gpt-tiny", 2, ("none", "full", "sqrt"), "/tmp/dist")
    assert all(r.status == "pass" for r in rows)
"""

from __future__ import annotations

# Deferred imports: torch (and parity.distributed.torch_rank, which loads it) load only in the
# spawned ranks and when ranks start, so that the CLI and the JAX side import this module for free.

import dataclasses
import datetime
import json
import os
import socket
import sys
from pathlib import Path

import numpy as np

from jaxremat.spec.plan import parse_plan

from parity.checks.compare import compare_bitwise
from parity.distributed.result import DistributedRow
from parity.inputs.presets import get_preset
from parity.inputs.train import AdamWConfig

MESHES = (("ddp", "data_parallel"), ("fsdp2", "fully_sharded"))
"""(mesh name prefix, layout) of the two PyTorch meshes, in run order."""
ROWS_FILE = "torch_rows.json"
REFERENCES_FILE = "torch_references.json"
COLLECTIVE_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_request(preset_name: str, world_size: int, schedules: tuple[str, ...]) -> tuple[str, ...]:
    """Validate a request before any rank starts; returns the plans with ``none`` first.

    Raises:
        ValueError: unknown preset, a preset that is not a GPT on random weights, ``world_size < 2``,
            a batch not divisible by ``world_size``, or a plan that does not parse or does not fit
            the model's depth.
    """
    preset = get_preset(preset_name)
    if preset.config.arch != "gpt" or preset.checkpoint is not None:
        raise ValueError(f"the distributed PyTorch cases run the GPT presets on random weights; {preset_name!r} is not one")
    if not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int >= 2 (ranks), got {world_size!r}")
    if preset.batch_size % world_size:
        raise ValueError(f"batch {preset.batch_size} of {preset_name} does not divide over {world_size} ranks; "
                         f"choose a world size dividing {preset.batch_size}")
    plans = tuple(dict.fromkeys(("none", *schedules)))
    for plan in plans:
        parse_plan(plan).schedule.segments_for(preset.config.n_layer)  # ValueError naming the problem
    return plans


def run_torch_distributed(preset_name: str, world_size: int, schedules: tuple[str, ...], out_dir: str, *,
                          dtype: str = "float32", seed: int = 0, hparams: AdamWConfig | None = None) -> list[DistributedRow]:
    """Run every plan on the ``ddp=W`` and ``fsdp2=W`` meshes across ``world_size`` ranks.

    Args:
        preset_name: a GPT preset of :mod:`parity.inputs.presets` (``gpt-tiny``, ``gpt-small``).
        world_size: ranks W (processes, one device each); must divide the preset's batch.
        schedules: plans (``"full"``, ``"sqrt+save_dots"``); ``none`` is added first if missing.
        out_dir: directory for the rows, reference measurements and ``none``'s gradients (created).
        dtype: parameter dtype (``"float32"`` or ``"float64"``).
        seed: seed of the weights and tokens (the single-device harness's ``--seed``).
        hparams: AdamW settings of the trained-weights check (None: the preset's, else the defaults).

    Returns:
        Rows, mesh by mesh (``ddp=W`` first), ``none`` first within each; ``devices`` and
        ``processes`` are both W.

    Raises:
        ValueError: see :func:`check_request`.
        torch.multiprocessing.ProcessRaisedException: a rank failed (its traceback is in the message).
    """
    import torch.multiprocessing as mp  # deferred: torch loads only when ranks start

    plans = check_request(preset_name, world_size, tuple(schedules))
    hparams = hparams or get_preset(preset_name).hparams or AdamWConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / ROWS_FILE).unlink(missing_ok=True)
    args = (world_size, _free_port(), preset_name, plans, str(out), dtype, seed, dataclasses.asdict(hparams))
    mp.start_processes(_rank_main, args=args, nprocs=world_size, start_method="spawn", join=True)
    return [DistributedRow.from_json(r) for r in json.loads((out / ROWS_FILE).read_text())]


def _rank_main(rank: int, world: int, port: int, preset_name: str, plans: tuple[str, ...], out_dir: str,
               dtype: str, seed: int, hparams: dict) -> None:
    """One rank: join the process group, run every mesh and plan, rank 0 writes the results."""
    import torch
    import torch.distributed as dist

    from parity.distributed.torch_rank import RankRun

    on_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if on_cuda:
        torch.cuda.set_device(rank)
    # W ranks share the machine's cores: one intra-op thread each (more oversubscribes and the
    # ranks spin against each other in every collective). Rank 0's single-process references
    # run with the same one thread.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world)) if on_cuda else torch.set_num_threads(1)
    dist.init_process_group("nccl" if on_cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        run = RankRun(rank, world, preset_name, dtype, seed, AdamWConfig(**hparams), on_cuda)
        rows = [row for prefix, layout in MESHES for row in run.run_mesh(f"{prefix}={world}", layout, plans, out_dir)]
        if rank == 0:
            (Path(out_dir) / REFERENCES_FILE).write_text(json.dumps(run.reference_summary(), indent=2))
            (Path(out_dir) / ROWS_FILE).write_text(json.dumps([r.to_json() for r in rows], indent=2))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def bitwise(test: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> tuple[bool, int, float]:
    """``(equal, max ULP, max abs)`` of two canonical dicts (:func:`parity.checks.compare.compare_bitwise`)."""
    r = compare_bitwise(test, ref)
    return r.equal, r.max_ulp, r.max_abs_diff


def main(argv=None) -> int:
    """``python -m parity.distributed.torch_worker``: no command line of its own; one line saying what to run, exit 2."""
    print("parity.distributed.torch_worker has no command line (its ranks are started by run_torch_distributed); "
          "run python -m parity run --suite distributed --frameworks torch", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
