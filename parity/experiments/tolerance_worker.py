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
plan it runs each framework in its measured mode (JAX under ``jit``, PyTorch eager) through
:meth:`parity.runners.framework.Framework.run_plan`, the suite's path, without its training, memory and
timing measurements (:func:`loss_and_grads`), applies :func:`parity.checks.compare.cross_check`, and
checks every plan byte for byte against ``none`` inside each framework under the same setting. Each
framework's kernels are recorded (:meth:`parity.runners.framework.Framework.backend_info`: ATen's
instruction set and threads, XLA's flags and the vector registers its code uses).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from jaxremat.spec.plan import parse_plan

from parity.checks.compare import compare_bitwise, cross_check
from parity.inputs.presets import get_preset
from parity.inputs.pretrained import preset_inputs
from parity.inputs.train import AdamWConfig
from parity.runners.framework import FRAMEWORK_NAMES, FRAMEWORKS, RunOptions, get_framework, loss_term_scale
from parity.runners.result import RunResult

VARIANTS = ("float32", "float64", "bfloat16")
LOSS_AND_GRADS = RunOptions(hparams=AdamWConfig(steps=1), timing_repeats=1, with_reverse_loop=False,
                            with_training=False, with_memory=False)
"""The suite's run of a plan without its training, memory and timing (only the loss and gradients are compared)."""


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


def loss_and_grads(framework: str, cfg, params, tokens, plan, mode: str | None = None) -> RunResult:
    """The loss and gradients of :meth:`parity.runners.framework.Framework.run_plan`, the suite's path, in
    ``mode`` (default: the framework's measured mode), without training, memory or timing."""
    mode = mode or FRAMEWORKS[framework].measured_mode
    return get_framework(framework).run_plan(mode, cfg, params, tokens, parse_plan(plan), LOSS_AND_GRADS)


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


def _ynn_fusions(cfg, plan, tokens) -> int:
    """How many YNNPACK fusions XLA made of the compiled loss+grad programs (0: dots run on Eigen), over the
    frameworks that compile one (:meth:`parity.runners.framework.Framework.compiled_program`)."""
    texts = [get_framework(fw).compiled_program(cfg, tuple(np.asarray(tokens).shape), parse_plan(plan))
             for fw in FRAMEWORK_NAMES]
    return sum(t.count('"kind":"__ynn_fusion"') for t in texts if t is not None)


def run_variant(preset, variant: str, plans, eager: bool) -> dict:
    """Cross-framework errors and within-framework bitwise checks of one variant (see module doc)."""
    cfg, params, tokens, dtype = variant_inputs(preset, variant)
    scale = loss_term_scale(cfg, params, tokens)
    a_fw, b_fw = FRAMEWORK_NAMES
    out = {"variant": variant, "loss_term_scale": scale, "schedules": []}
    refs = {}
    for name in plans:
        t0 = time.perf_counter()
        runs = {fw: loss_and_grads(fw, cfg, params, tokens, name) for fw in FRAMEWORK_NAMES}
        row = {"schedule": name, **{f"loss_{fw}": float(r.loss) for fw, r in runs.items()},
               **{f"{fw}_digest": digest(r) for fw, r in runs.items()},
               **cross_check(runs[a_fw].loss, runs[b_fw].loss, runs[a_fw].grads, runs[b_fw].grads, scale, dtype)}
        if parse_plan(name).name == "none":
            refs = runs
            row["ynn_fusions"] = _ynn_fusions(cfg, name, tokens)
            other = [m for m in FRAMEWORKS[a_fw].modes if m != FRAMEWORKS[a_fw].measured_mode]
            if eager and variant == "float32" and other:  # op by op costs seconds per step: float32 only
                e = loss_and_grads(a_fw, cfg, params, tokens, name, mode=other[0])
                row["eager"] = {f"loss_{a_fw}": float(e.loss), f"{a_fw}_digest": digest(e),
                                **cross_check(e.loss, runs[b_fw].loss, e.grads, runs[b_fw].grads, scale, dtype)}
        else:
            row.update({f"{fw}_vs_none": _bitwise(runs[fw], refs[fw]) for fw in FRAMEWORK_NAMES})
        row["wall_s"] = time.perf_counter() - t0
        out["schedules"].append(row)
    return out


def main(spec: dict) -> dict:
    """Run ``spec`` in this process (its environment already set); the result object."""
    backends = {}
    for fw in FRAMEWORK_NAMES:  # thread counts first, before any kernel runs
        backends.update(get_framework(fw).backend_info(threads=int(spec["threads"])))
    preset = get_preset(spec["model"])
    result = {"spec": spec, **backends, "cpus": sorted(os.sched_getaffinity(0)), "variants": []}
    for variant, plans in spec["variants"].items():
        result["variants"].append(run_variant(preset, variant, plans, bool(spec.get("eager"))))
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
