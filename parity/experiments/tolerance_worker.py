"""One process of the tolerance sweep: cross-framework errors under the settings it was started with.

:mod:`parity.experiments.tolerance_sweep` starts this module as ``python -m parity.experiments.tolerance_worker SPEC`` in a
fresh process per setting, because the instruction-set variables (``XLA_FLAGS``,
``ATEN_CPU_CAPABILITY``, ``MKL_CBWR``) are read once, when the frameworks load, and the XLA:CPU
thread pool is sized from the process's CPU affinity at start-up. ``SPEC`` is a JSON object:
``model`` (preset name), ``variants`` (``{variant: [schedule names, none first]}``), ``threads``,
``eager`` (also JAX op by op, on ``none`` in float32) and ``cpus`` (optional: the CPUs the process
pins itself to before jax and torch load); the result is one JSON object on the last line of
standard output.

Per variant (``float32``, ``float64``, ``bfloat16`` = float32 parameters with bfloat16 compute) and
schedule it runs JAX under ``jit`` (:func:`parity.runners.jax_runner.run_schedule`, the suite's path) and
PyTorch (the loss and gradients block of :func:`parity.runners.torch_runner.run_schedule`, without its
training, memory and timing measurements), applies :func:`parity.checks.compare.cross_check`, and checks
every schedule byte for byte against ``none`` inside each framework under the same setting.
"""

from __future__ import annotations

# Deferred imports: each worker process loads only the framework its setting runs.

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from parity.runners.result import RunResult
from jaxremat.spec import parse_schedule
from jaxremat.spec.policies import parse_policy
from parity.checks.compare import compare_bitwise
from parity.checks.compare import cross_check
from parity.inputs.presets import get_preset
from parity.inputs.pretrained import preset_inputs
from parity.inputs.train import AdamWConfig
import contextlib

VARIANTS = ("float32", "float64", "bfloat16")


def variant_inputs(preset, variant: str, seed: int = 0):
    """``(cfg, params, tokens, tolerance dtype)`` of a sweep variant (dropout off: RNGs differ)."""

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    param_dtype = "float64" if variant == "float64" else "float32"
    cfg, params, tokens = preset_inputs(preset, param_dtype, seed)
    cfg = cfg.replace(dropout=0.0)
    if variant == "bfloat16":
        cfg = cfg.replace(compute_dtype="bfloat16")
    return cfg, params, tokens, variant


def torch_loss_and_grads(cfg, params, tokens, schedule, seed: int = 0) -> RunResult:
    """The loss and gradients of :func:`parity.runners.torch_runner.run_schedule`, computed the same way
    (a :class:`parity.runners.result.RunResult` without training, memory or timing)."""
    import torch

    from parity.runners.torch_runner import model_and_loss

    Model, loss_fn, _ = model_and_loss(cfg)
    tokens_t = torch.from_numpy(np.array(tokens, dtype=np.int64, order="C", copy=True))
    model = Model.from_params(cfg, params)
    torch.manual_seed(seed)
    loss = loss_fn(model, tokens_t, schedule, policy=parse_policy(None))
    loss.backward()
    return RunResult(loss=np.asarray(loss.detach().numpy(), dtype=cfg.dtype).copy(), grads=model.to_params(grads=True),
                     trained=None, mode="eager")


def jax_loss_and_grads(cfg, params, tokens, schedule, mode: str = "jit") -> RunResult:
    """The loss and gradients of :func:`parity.runners.jax_runner.run_schedule` (no training run)."""
    from parity.runners import jax_runner

    return jax_runner.run_schedule(cfg, params, tokens, schedule, mode=mode, hparams=AdamWConfig(steps=1),
                                   timing_repeats=1, with_reverse_loop=False, with_training=False)


def xla_vector_registers() -> dict | None:
    """Registers used by XLA's generated code for an elementwise probe: proof the ISA flag took effect.

    Compiles a small elementwise program with ``--xla_dump_to`` (added to this process's
    ``XLA_FLAGS`` before jax loads) and counts ``xmm``/``ymm``/``zmm`` operands in the object file
    with ``objdump``. None when objdump is missing or nothing was dumped.
    """
    import jax
    import jax.numpy as jnp

    def isa_probe(x):
        for _ in range(4):
            x = jnp.tanh(x) * 1.0001 + jnp.exp(-x * x)
        return x

    jax.jit(isa_probe)(jnp.ones((256, 256), jnp.float32)).block_until_ready()
    dump = os.environ.get("_PARITY_XLA_DUMP")
    objdump = shutil.which("objdump")
    objs = glob.glob(os.path.join(dump, "*isa_probe*.o")) if dump else []
    if not objs or not objdump:
        return None
    text = subprocess.run([objdump, "-d", objs[0]], capture_output=True, text=True, check=True).stdout
    return {reg: text.count(reg) for reg in ("xmm", "ymm", "zmm")}


def digest(res: RunResult) -> str:
    """Short hash of the loss and gradient bytes (names sorted): equal digests, equal bits."""
    h = hashlib.sha256(np.asarray(res.loss).tobytes())
    for name in sorted(res.grads):
        h.update(name.encode())
        h.update(np.ascontiguousarray(res.grads[name]).tobytes())
    return h.hexdigest()[:12]


def _bitwise(res: RunResult, ref: RunResult) -> dict:

    loss = compare_bitwise({"loss": res.loss}, {"loss": ref.loss})
    grads = compare_bitwise(res.grads, ref.grads)
    return {"equal": loss.equal and grads.equal, "max_ulp": max(loss.max_ulp, grads.max_ulp),
            "mismatched": sorted(loss.mismatched + grads.mismatched)}


def _ynn_fusions(cfg, schedule, tokens) -> int:
    """How many YNNPACK fusions XLA made of the jitted loss+grad program (0: dots run on Eigen)."""
    from parity.runners.jax_runner import compiled_value_and_grad

    tokens = np.asarray(tokens)
    compiled = compiled_value_and_grad(cfg, schedule, AdamWConfig(steps=1), tuple(tokens.shape), False,
                                        parse_policy(None))
    return compiled.as_text().count('"kind":"__ynn_fusion"')


def run_variant(preset, variant: str, schedules, eager: bool) -> dict:
    """Cross-framework errors and within-framework bitwise checks of one variant (see module doc)."""

    import jax

    from parity.checks.loss_terms import loss_term_scale

    cfg, params, tokens, dtype = variant_inputs(preset, variant)
    scale = loss_term_scale(cfg, params, tokens)
    x64 = jax.enable_x64(True) if cfg.dtype == "float64" else contextlib.nullcontext()
    out = {"variant": variant, "loss_term_scale": scale, "schedules": []}
    refs = {}
    for name in schedules:
        schedule = parse_schedule(name)
        t0 = time.perf_counter()
        j = jax_loss_and_grads(cfg, params, tokens, schedule)
        t = torch_loss_and_grads(cfg, params, tokens, schedule)
        row = {"schedule": name, "loss_jax": float(j.loss), "loss_torch": float(t.loss),
               "jax_digest": digest(j), "torch_digest": digest(t),
               **cross_check(j.loss, t.loss, j.grads, t.grads, scale, dtype)}
        if name == "none":
            refs = {"jax": j, "torch": t}
            with x64:
                row["ynn_fusions"] = _ynn_fusions(cfg, schedule, tokens)
            if eager and variant == "float32":  # op by op costs seconds per step: float32 only
                e = jax_loss_and_grads(cfg, params, tokens, schedule, mode="eager")
                row["eager"] = {"loss_jax": float(e.loss), "jax_digest": digest(e),
                                **cross_check(e.loss, t.loss, e.grads, t.grads, scale, dtype)}
        else:
            row["jax_vs_none"] = _bitwise(j, refs["jax"])
            row["torch_vs_none"] = _bitwise(t, refs["torch"])
        row["wall_s"] = time.perf_counter() - t0
        out["schedules"].append(row)
    return out


def main(spec: dict) -> dict:
    """Run ``spec`` in this process (its environment already set); the result object."""
    import torch

    torch.set_num_threads(int(spec["threads"]))
    preset = get_preset(spec["model"])
    result = {"spec": spec, "aten_capability": torch.backends.cpu.get_cpu_capability(),
              "torch_threads": torch.get_num_threads(), "cpus": sorted(os.sched_getaffinity(0)),
              "xla_flags": os.environ.get("XLA_FLAGS", ""), "mkl_cbwr": os.environ.get("MKL_CBWR"),
              "xla_vector_registers": xla_vector_registers(), "variants": []}
    for variant, schedules in spec["variants"].items():
        result["variants"].append(run_variant(preset, variant, schedules, bool(spec.get("eager"))))
    return result


if __name__ == "__main__":
    _spec = json.loads(sys.argv[1])
    if _spec.get("cpus"):  # before jax and torch load: XLA:CPU sizes its thread pool from the affinity
        os.sched_setaffinity(0, _spec["cpus"])
    dump = tempfile.mkdtemp(prefix="parity-xla-dump-")
    os.environ["_PARITY_XLA_DUMP"] = dump
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_dump_to={dump} --xla_dump_hlo_module_re=.*isa_probe.*").strip()
    try:
        res = main(_spec)
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    print(json.dumps(res))
