"""One JAX mesh spread over several processes: ``jax.distributed.initialize`` over the loopback address.

The path that spans hosts in a cluster, shown on one machine. :func:`run_processes` starts P
processes of this module (``python -m parity.distributed.jax_multiprocess --process-id I ...``),
each with ``mesh size / P`` local devices (CPU: forced host devices, ``XLA_FLAGS`` set before JAX
starts; a GPU machine uses its own), CPU collectives over gloo
(``jax.config.update("jax_cpu_collectives_implementation", "gloo")``) and one coordinator at
``127.0.0.1:PORT``. Every process builds the same global mesh over ``jax.devices()`` (the devices
of all processes, process 0's first), fills its own shards of the same weights and tokens
(:func:`parity.distributed.jax_mesh.global_array`) and runs every plan through the program of the
one-process harness (:func:`parity.distributed.jax_mesh.run_plan`); the results are gathered whole
as raw bits (:func:`parity.distributed.jax_mesh.host_copy`) and process 0 writes them into
``--out`` (:func:`write_runs`; :func:`load_runs` reads them back). The checks are made by the
caller (:func:`parity.distributed.jax_checks.check_mesh` with ``processes=P``): every plan
against ``none`` of the same processes byte for byte, and every plan against the same mesh in one
process.

:func:`collective_probe` measures the order in which the collectives sum: a ``psum`` over each mesh
axis of a fixed float32 array, whose per-element result names the order of its operands
(:func:`summation_orders`). Measured with jax/jaxlib 0.10.2 on 4 CPU devices (docs/sharding.md,
"Several processes"): in one process every element is ``((x0 + x1) + x2) + x3`` (device order);
over 2 processes with gloo the quarter of the vector that device c keeps is summed
``((x[c+2] + x[c+3]) + x[c+1]) + x[c]`` (indices mod 4: a ring reduce-scatter). With two operands
the order cannot change a float sum; with four it can.

Exit codes of a process: 0 its runs were written (by process 0) or taken part in; 2 bad input (one
line on stderr); other: the run failed (its traceback on stderr, in ``process-I.log``).
"""

from __future__ import annotations

# Deferred imports: JAX (and every project module that loads it) must be imported only after XLA_FLAGS
# is set from the local device count, so they are imported inside process_main().

import argparse
import ctypes
import dataclasses
import hashlib
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from jaxremat.models import get_model
from jaxremat.spec.grammar import split_top
from jaxremat.spec.plan import parse_plan
from parity.cli.checks import check_seed, out_path
from parity.cli.util import OneLineParser, ascii_int
from parity.distributed.result import DeviceMemory
from parity.inputs.model_preset import ModelPreset
from parity.inputs.presets import PRESETS, get_preset
from parity.inputs.pretrained import preset_inputs
from parity.inputs.train import AdamWConfig
from parity.report.suite_report import OutputDirError, writable_dir

RUNS_FILE = "runs.json"
"""Process 0's index of what it wrote: one entry per run, the probe, the devices."""

PROBE_LEN = 1024
"""Elements of each device's operand in :func:`collective_probe`."""

DEFAULT_TIMEOUT_S = 900
"""How long :func:`run_processes` waits for all processes (compile + run of every plan), in seconds."""


class ProcessesError(RuntimeError):
    """A process of :func:`run_processes` failed or timed out; the message names it and its last log line."""


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its launcher dies (``prctl(PR_SET_PDEATHSIG)``); a no-op elsewhere.

    Called by each process of :func:`run_processes` first thing in :func:`process_main` (after exec, not
    as a ``preexec_fn``, which would run Python between fork and exec in a threaded parent), so that a
    killed launcher leaves no process behind. When the launcher died before the call (the parent is no
    longer the PID in ``PARITY_LAUNCHER_PID``), the process exits at once.
    """
    launcher = os.environ.get("PARITY_LAUNCHER_PID")
    if not launcher:  # not started by run_processes (e.g. a test calling process_main): leave the process alone
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG = 1, SIGKILL = 9
    except (OSError, AttributeError):
        return
    if os.getppid() != int(launcher):
        sys.exit(f"the launcher (PID {launcher}) is gone; this process stops")


def distributed_preset(name: str) -> ModelPreset:
    """The ``--model`` preset ``name``, if the distributed suite runs it: a GPT-family preset on random weights.

    Raises:
        ValueError: an unknown name (the message lists the presets), or a preset of another family
            (``minilm-l6``, a BERT encoder) or with a checkpoint; the message lists the supported presets.
    """
    preset = get_preset(name)
    supported = [p.name for p in PRESETS.values() if p.config.arch == "gpt" and p.checkpoint is None]
    if preset.name not in supported:
        what = (f"arch {preset.config.arch}: {get_model(preset.config.arch).description}"
                if preset.config.arch != "gpt" else "a pretrained checkpoint")
        raise ValueError(f"--suite distributed supports the GPT family presets ({', '.join(supported)}); "
                         f"--model {preset.name} ({what}) is not supported there; pass --model {supported[0]}")
    return preset


def check_out_dir(text) -> Path:
    """``--out`` as a directory that exists (created here with its parents) and can be written.

    The same checks and messages as every command's ``--out`` (:func:`parity.cli.checks.out_path`,
    :func:`parity.report.suite_report.writable_dir`).

    Raises:
        ValueError: ``text`` is empty, names an existing file, or the directory cannot be created or written.
    """
    try:
        return writable_dir(out_path("--out", text))
    except OutputDirError as exc:
        raise ValueError(str(exc)) from None


def with_device_count(flags: str, count: int) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with the forced host-device count set to ``count`` (any old one dropped)."""
    kept = [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count=")]
    return " ".join(kept + [f"--xla_force_host_platform_device_count={count}"])


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for the coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_file_name(index: int) -> str:
    """File of run ``index`` (:func:`plan_runs` order): ``run-00.safetensors``."""
    return f"run-{index:02d}.safetensors"


def plan_runs(plans) -> list[str]:
    """The runs the processes make, in order: ``none`` twice (determinism), then every other plan once."""
    return ["none", "none"] + [p for p in plans if parse_plan(p).name != "none"]


def summation_orders(operands: np.ndarray, result: np.ndarray, chunks: int) -> list[list[int] | None]:
    """The order of operands each chunk of ``result`` was summed in, found by trying every order.

    Args:
        operands: ``(n, L)`` float array, one row per device of the reduced group (n <= 5).
        result: ``(L,)`` the reduction's result on one device.
        chunks: how many equal chunks of L to look at.

    Returns:
        Per chunk, the first order ``[i, j, k, ...]`` whose left-to-right sum ``((x_i + x_j) + x_k) ...``
        equals the chunk byte for byte, or None when no order does (or n > 5).
    """
    n, length = operands.shape
    out: list[list[int] | None] = []
    for c in range(chunks):
        sl = slice(c * length // chunks, (c + 1) * length // chunks)
        found = None
        for perm in itertools.permutations(range(n)) if n <= 5 else ():
            acc = operands[perm[0], sl]
            for q in perm[1:]:
                acc = acc + operands[q, sl]
            if acc.tobytes() == result[sl].tobytes():
                found = list(perm)
                break
        out.append(found)
    return out


def collective_probe(mesh) -> dict[str, dict]:
    """For each mesh axis of size > 1: the bits of a ``psum`` over it, and the order they were summed in.

    Each device holds :data:`PROBE_LEN` float32 normal values (seed 0, the same in every run); a
    ``shard_map`` program ``psum`` s them over the axis. Runs in one process and in several alike.

    Returns:
        axis name -> ``{"bits": sha256 hex of the result's bytes, "orders": summation_orders of device
        0's group in chunks of one per operand, "device_order": fraction of elements equal to the
        device-order sum ((x0 + x1) + x2) ...}``.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from parity.distributed.jax_mesh import global_array, host_copy

    names = tuple(mesh.axis_names)
    shape = tuple(mesh.devices.shape)
    out = {}
    for axis, size in zip(names, shape):
        if size == 1:
            continue
        x = np.random.default_rng(0).standard_normal((*shape, PROBE_LEN)).astype(np.float32)
        spec = P(*names, None)
        fn = jax.jit(jax.shard_map(lambda a, axis=axis: jax.lax.psum(a, axis), mesh=mesh, in_specs=spec,
                                   out_specs=spec))
        y = host_copy(fn(global_array(x, NamedSharding(mesh, spec))))
        group = [0] * len(shape)  # device 0's group: every index 0 except along the axis
        k = names.index(axis)
        operands = np.stack([x[tuple(group[:k] + [i] + group[k + 1:])] for i in range(size)])
        result = y[tuple(group)]
        device_order = operands[0]
        for row in operands[1:]:
            device_order = device_order + row
        out[axis] = {"bits": hashlib.sha256(y.tobytes()).hexdigest(),
                     "orders": summation_orders(operands, result, size),
                     "device_order": float(np.mean(result == device_order))}
    return out


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m parity.distributed.jax_multiprocess",
                      description="One process of a JAX mesh spread over several processes "
                      "(started by parity.distributed.jax_multiprocess.run_processes).")
    p.add_argument("--process-id", type=ascii_int, required=True)
    p.add_argument("--processes", type=ascii_int, required=True)
    p.add_argument("--coordinator", required=True, help="HOST:PORT of process 0's coordinator")
    p.add_argument("--local-devices", type=ascii_int, required=True, help="devices of this process (CPU: forced)")
    p.add_argument("--mesh", required=True)
    p.add_argument("--schedules", required=True, help="','-separated plans (none first); '' runs the probe alone")
    p.add_argument("--model", required=True)
    p.add_argument("--seed", type=ascii_int, default=0)
    p.add_argument("--out", required=True)
    return p


def write_runs(out: Path, runs: list[tuple[str, object]], probe: dict, devices: list[str]) -> None:
    """Process 0's files: ``run-NN.safetensors`` (``loss``, ``grads/NAME``, ``trained/NAME``), ``run-NN.hlo.txt``
    and :data:`RUNS_FILE` (per run: plan, file names, memory or error; the probe; the global devices)."""
    entries = []
    for i, (name, run) in enumerate(runs):
        if isinstance(run, Exception):
            entries.append({"plan": name, "error": f"{type(run).__name__}: {run}"})
            continue
        tensors = {"loss": np.ascontiguousarray(np.asarray(run.loss).reshape(1))}
        tensors.update({f"grads/{k}": np.ascontiguousarray(v) for k, v in run.grads.items()})
        tensors.update({f"trained/{k}": np.ascontiguousarray(v) for k, v in run.trained.items()})
        save_file(tensors, str(out / run_file_name(i)))
        hlo = run_file_name(i).replace(".safetensors", ".hlo.txt")
        (out / hlo).write_text(run.hlo)
        entries.append({"plan": name, "file": run_file_name(i), "hlo": hlo, "memory": dataclasses.asdict(run.memory)})
    (out / RUNS_FILE).write_text(json.dumps({"runs": entries, "probe": probe, "devices": devices}, indent=1))


def load_runs(out: Path) -> dict:
    """Read back :func:`write_runs`'s files.

    Returns:
        ``{"runs": [(plan name, MeshRun or error message str), ...] in plan_runs order, "probe": ...,
        "devices": [...]}``; the MeshRun holds the full arrays, the first step's loss (0-d) and the HLO text.

    Raises:
        ProcessesError: :data:`RUNS_FILE` is missing (process 0 did not finish).
    """
    from parity.distributed.jax_mesh import MeshRun

    index = Path(out) / RUNS_FILE
    if not index.exists():
        raise ProcessesError(f"{index} is missing: process 0 did not write its runs")
    data = json.loads(index.read_text())
    runs = []
    for e in data["runs"]:
        if "error" in e:
            runs.append((e["plan"], e["error"]))
            continue
        t = load_file(str(Path(out) / e["file"]))
        grads = {k[len("grads/"):]: v for k, v in t.items() if k.startswith("grads/")}
        trained = {k[len("trained/"):]: v for k, v in t.items() if k.startswith("trained/")}
        runs.append((e["plan"], MeshRun(t["loss"].reshape(()), grads, trained, DeviceMemory(**e["memory"]),
                                        (Path(out) / e["hlo"]).read_text())))
    return {"runs": runs, "probe": data["probe"], "devices": data["devices"]}


def process_main(argv=None) -> int:
    """One process: join the coordinator, run every plan on the global mesh, process 0 writes the runs."""
    args = _parser().parse_args(argv)
    die_with_parent()
    try:  # bad input answers in one line before JAX starts or joins the coordinator
        if args.processes < 2:
            raise ValueError(f"--processes must be >= 2, got {args.processes}")
        if not 0 <= args.process_id < args.processes:
            raise ValueError(f"--process-id must be in 0..{args.processes - 1}, got {args.process_id}")
        if args.local_devices < 1:
            raise ValueError(f"--local-devices must be >= 1, got {args.local_devices}")
        host, _, port = args.coordinator.rpartition(":")
        if not host or not re.fullmatch(r"[0-9]+", port, re.ASCII) or not 0 < int(port) < 65536:
            raise ValueError(f"--coordinator {args.coordinator!r} is not HOST:PORT with a port in 1..65535, "
                             "e.g. 127.0.0.1:12345")
        check_seed(args.seed)
        preset = distributed_preset(args.model)
        check_out_dir(args.out)
        names = plan_runs(split_top(args.schedules, ",")) if args.schedules.strip() else []
        os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), args.local_devices)
        from jaxremat import sharding as shd  # imports JAX (no backend yet: XLA_FLAGS is read when one starts)

        ms = shd.parse_mesh(args.mesh)
        if ms.size != args.processes * args.local_devices:
            raise ValueError(f"--mesh {ms.text} has {ms.size} devices, not --processes {args.processes} x "
                             f"--local-devices {args.local_devices}")
        cfg, params, tokens = preset_inputs(preset, "float32", args.seed)
        shd.check_divides(ms, cfg, tokens.shape[0])
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, num_processes=args.processes, process_id=args.process_id)
    from parity.distributed import jax_mesh as jm

    mesh = shd.make_mesh(ms)
    hparams = preset.hparams or AdamWConfig()
    runs: list[tuple[str, object]] = []
    for name in names:
        try:
            runs.append((name, jm.run_plan(cfg, params, tokens, parse_plan(name), ms.text, mesh, hparams)))
        except Exception as exc:  # recorded; the same program fails alike in every process
            runs.append((name, exc))
    probe = collective_probe(mesh)
    if jax.process_index() == 0:
        write_runs(Path(args.out), runs, probe, [str(d) for d in jax.devices()])
    jax.distributed.shutdown()
    return 0


def _last_line(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    real = [ln for ln in lines if not re.match(r"^\[Gloo\]|^WARNING|^W\d{4}|^I\d{4}", ln)]
    return (real or lines or ["(no output)"])[-1]


def run_processes(model: str, mesh: str, plans, processes: int, out_dir: Path, *, seed: int = 0,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
    """Run ``plans`` on mesh ``mesh`` spread over ``processes`` local processes; return :func:`load_runs`'s dict.

    Each process gets ``mesh size / processes`` devices; their logs are ``out_dir/process-I.log``.
    Empty ``plans`` runs :func:`collective_probe` alone (``runs`` empty).

    Raises:
        ValueError: ``processes`` < 2 or does not divide the mesh's device count.
        ProcessesError: a process exited non-zero or they did not finish within ``timeout_s`` seconds
            (the others are then stopped: a process left alone waits in a collective).
    """
    from jaxremat.sharding import parse_mesh  # the spec module: no device is touched

    size = parse_mesh(mesh).size
    if processes < 2 or size % processes:
        raise ValueError(f"--processes {processes}: must be >= 2 and divide mesh {mesh}'s {size} devices")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / RUNS_FILE).unlink(missing_ok=True)
    port = free_port()
    env = dict(os.environ, XLA_FLAGS=with_device_count(os.environ.get("XLA_FLAGS", ""), size // processes),
               PARITY_LAUNCHER_PID=str(os.getpid()))
    procs, logs = [], []
    for i in range(processes):
        log = out / f"process-{i}.log"
        cmd = [sys.executable, "-m", "parity.distributed.jax_multiprocess", "--process-id", str(i),
               "--processes", str(processes), "--coordinator", f"127.0.0.1:{port}",
               "--local-devices", str(size // processes), "--mesh", mesh, "--schedules", ",".join(plans),
               "--model", model, "--seed", str(seed), "--out", str(out)]
        with open(log, "w") as fh:
            procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env))
        logs.append(log)
    deadline = time.monotonic() + timeout_s
    failed = None
    while any(p.poll() is None for p in procs) and failed is None:
        failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        if time.monotonic() > deadline:
            failed = -1
        time.sleep(0.2)
    failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), failed)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    if failed == -1:
        raise ProcessesError(f"mesh {mesh} over {processes} processes did not finish in {timeout_s:.0f} s; "
                             f"see {logs[0]}")
    if failed is not None:
        raise ProcessesError(f"process {failed} of mesh {mesh} exited {procs[failed].returncode}: "
                             f"{_last_line(logs[failed])} (log: {logs[failed]})")
    return load_runs(out)


if __name__ == "__main__":
    sys.exit(process_main())
