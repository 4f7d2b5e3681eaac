"""The GPU measurement pass of the quick suite: device peak bytes per schedule in both frameworks.

``python -m parity.cases.gpu_pass --out gpu-report`` (or ``scripts/gpu_pass.sh``) runs, for every schedule
of the quick suite (``gpt-small``, float32), one loss+gradient step and reads the device's own
counters:

* JAX: ``jax.Device.memory_stats()["peak_bytes_in_use"]``, a high-water mark since the process
  started that JAX cannot reset, so each case runs in a fresh subprocess;
* PyTorch: ``torch.cuda.max_memory_allocated`` after ``torch.cuda.reset_peak_memory_stats()``,
  in-process, the peak reset between cases.

Both frameworks measure through the runners' one path (:func:`parity.runners.jax_memory.measure_jax`,
:func:`parity.runners.torch_memory.measure_torch`), which also gives each case's saved bytes.
Each number is written with its source (:func:`peak_source`). Without a GPU the pass exits 2 and
says so; it never reports a silent 0 (``torch.cuda.max_memory_allocated`` returns 0 on CPU).
``gpu_pass.json`` and ``gpu_pass.md`` are written atomically, the JSON strict (:mod:`parity.report.files`).
"""

from __future__ import annotations

# Deferred imports: each case loads JAX or PyTorch in its own process; the parent loads neither.

import argparse
import json
import subprocess
import sys
from pathlib import Path
from jaxremat.models import init_params
from jaxremat.spec import DEFAULT_SCHEDULES
from jaxremat.spec import parse_schedule
from parity.inputs.corpus import token_batch
from parity.inputs.presets import get_preset
from parity.report.environment import environment_info
from parity.report.files import atomic_write, json_text
import numpy as np

SOURCES = {
    ("jax", "gpu"): "jax.Device.memory_stats()['peak_bytes_in_use'] (fresh process per case)",
    ("torch", "cuda"): "torch.cuda.max_memory_allocated (peak reset between cases)",
    ("jax", "cpu"): "XLA compiled memory_analysis (cpu)",
    ("torch", "cpu"): "torchref.live_bytes / MemTracker (cpu)",
}


def peak_source(framework: str, backend: str) -> str:
    """Where a peak number comes from for ``framework`` on ``backend`` (``"gpu"``/``"cuda"``/``"cpu"``).

    A GPU backend always selects the device counters; anything else the CPU measurements.

    Raises:
        ValueError: unknown framework.
    """
    if framework not in ("jax", "torch"):
        raise ValueError(f"framework must be 'jax' or 'torch', got {framework!r}")
    gpu = backend in ("gpu", "cuda")
    return SOURCES[(framework, ("gpu" if framework == "jax" else "cuda") if gpu else "cpu")]


def _jax_case(schedule: str) -> dict:
    """One JAX case in this process (called in a subprocess): device peak of one loss+grad step.

    Measured by :func:`parity.runners.jax_memory.measure_jax`, whose device step runs first, before
    anything else touches the device (the allocator's high-water mark cannot be reset).

    Raises:
        RuntimeError: JAX's default backend is not a GPU.
    """
    import jax
    import jax.numpy as jnp

    from jaxremat.model import loss_fn

    from parity.runners.jax_memory import measure_jax

    preset = get_preset("gpt-small")
    cfg, sched = preset.config, parse_schedule(schedule)
    params = {k: jnp.asarray(v) for k, v in init_params(cfg).items()}
    tokens = jnp.asarray(token_batch(preset.batch_size, preset.seq_len), dtype=jnp.int32)

    def loss(p):
        return loss_fn(p, tokens, cfg, sched)

    step = jax.jit(jax.value_and_grad(loss))
    memory = measure_jax(loss, params, device_step=lambda: step(params))
    if memory.device_peak is None:
        raise RuntimeError(f"JAX runs on {jax.default_backend()!r}, not a GPU: install a CUDA jaxlib")
    peak, before = int(memory.device_peak["peak_bytes"]), int(memory.device_peak["bytes_in_use_before"])
    return {"framework": "jax", "schedule": schedule, "peak_bytes": peak, "bytes_before": before,
            "step_peak_bytes": peak - before, "saved_bytes": memory.saved_bytes,
            "offloaded_bytes": memory.offloaded_bytes, "source": peak_source("jax", jax.default_backend())}


def _torch_cases(schedules) -> list[dict]:
    """Every PyTorch case in this process, measured by :func:`parity.runners.torch_memory.measure_torch`
    (a CUDA model: the peak is ``torch.cuda.max_memory_allocated`` after a reset, per case)."""
    import torch

    from torchref.model import GPT
    from torchref.render import model_loss

    from parity.runners.torch_memory import measure_torch

    preset = get_preset("gpt-small")
    cfg = preset.config
    tokens = torch.from_numpy(np.asarray(token_batch(preset.batch_size, preset.seq_len), dtype=np.int64)).cuda()
    out = []
    for schedule in schedules:
        model, sched = GPT.from_params(cfg, init_params(cfg)).cuda(), parse_schedule(schedule)
        memory = measure_torch(
            lambda sac, on_input: model_loss(model, tokens, sched, policy=sac, on_checkpoint_input=on_input),
            lambda: model_loss(model, tokens, sched).backward(),
            exclude=[*model.parameters(), *model.buffers()], tracked=(model,))
        out.append({"framework": "torch", "schedule": schedule, "peak_bytes": memory.peak_bytes,
                    "bytes_before": int(memory.peak_breakdown["allocated_before"]),
                    "step_peak_bytes": memory.peak_activation_bytes, "saved_bytes": memory.saved_bytes,
                    "offloaded_bytes": memory.offloaded_bytes, "source": peak_source("torch", "cuda")})
        del model
    return out


def main(argv=None) -> int:

    p = argparse.ArgumentParser(prog="python -m parity.cases.gpu_pass", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("gpu-report"))
    p.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES))
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: one JAX case in a subprocess
    args = p.parse_args(argv)
    if args.case:
        print(json.dumps(_jax_case(args.case)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_pass: no CUDA GPU here; the device measurements need one (CPU numbers: python -m parity run)",
              file=sys.stderr)
        return 2
    schedules = [s for s in args.schedules.split(",") if s]
    rows = []
    for s in schedules:
        res = subprocess.run([sys.executable, "-m", "parity.cases.gpu_pass", "--case", s], capture_output=True, text=True,
                             timeout=240)
        if res.returncode:
            rows.append({"framework": "jax", "schedule": s, "error": res.stderr[-2000:]})
        else:
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    rows += _torch_cases(schedules)

    args.out.mkdir(parents=True, exist_ok=True)
    env = environment_info(("torch",), "cuda")  # the JAX cases ran in subprocesses
    atomic_write(args.out / "gpu_pass.json", json_text({"model": "gpt-small", "cases": rows, "environment": env,
                                                        "nonfinite_encoding": "string"}, indent=1))
    lines = ["| framework | schedule | step peak bytes | peak bytes | source |", "|---|---|---|---|---|"]
    lines += [f"| {r['framework']} | {r['schedule']} | {r.get('step_peak_bytes', 'error')} | {r.get('peak_bytes', '-')} | "
              f"{r.get('source', r.get('error', ''))[:200]} |" for r in rows]
    atomic_write(args.out / "gpu_pass.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
