"""The parity suite: every schedule against ``none`` inside each framework, and across frameworks.

For each dtype and framework (JAX under ``jit`` and op by op, PyTorch eager) the suite runs the
no-remat reference, then every schedule, and checks byte for byte: the loss, every parameter
gradient, the weights after the optimizer steps, and the hand-rolled reverse segment loop's
gradients against the library schedule's. It then compares the frameworks on the same weights and
tokens against :data:`parity.compare.TOLERANCES`. A case that raises is recorded with
``status: "error"`` and the suite goes on.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from typing import Callable, Iterable

import numpy as np

from jaxremat.spec import AdamWConfig, Schedule, init_params, parse_schedule, peak_units, recomputed_blocks

from .compare import compare_bitwise, max_rel_err, tolerance_for
from .data import token_batch
from .models import ModelPreset

SCHEMA_VERSION = 1
FRAMEWORK_MODES = (("jax", "jit"), ("jax", "eager"), ("torch", "eager"))


@dataclasses.dataclass(frozen=True)
class SuiteConfig:
    """What one suite run covers.

    Attributes:
        name: suite name (``quick``).
        preset: model preset (config, batch size, sequence length).
        schedules: schedule names, ``none`` first (it is the reference and is added if missing).
        dtypes: dtypes to run (``float32``, ``float64``).
        frameworks: subset of ``("jax", "torch")``.
        hparams: optimizer settings of the trained-weights check.
        timing_repeats: timed training steps per case (median reported), after one warm-up.
        seed: seed of the weights and of the token windows.
    """

    name: str
    preset: ModelPreset
    schedules: tuple[str, ...]
    dtypes: tuple[str, ...] = ("float32",)
    frameworks: tuple[str, ...] = ("jax", "torch")
    hparams: AdamWConfig = AdamWConfig()
    timing_repeats: int = 5
    seed: int = 0

    def schedule_objects(self) -> list[tuple[str, Schedule]]:
        """``[(canonical name, schedule)]`` with ``none`` first; raises ValueError on a bad name."""
        parsed = [parse_schedule(s) for s in self.schedules]
        out, seen = [], set()
        for sched in [parse_schedule("none")] + parsed:
            if sched.name not in seen:
                seen.add(sched.name)
                out.append((sched.name, sched))
        for _, sched in out:  # resolve now so s > n_layer fails before any work starts
            sched.segments_for(self.preset.config.n_layer)
        return out


def _run_framework(framework: str, mode: str, cfg, params, tokens, schedule, suite: SuiteConfig, with_reverse_loop: bool):
    if framework == "jax":
        from . import jax_runner

        # Op by op, JAX dispatches every primitive from Python (about a second per step here): that
        # mode checks the loss and gradients; training and step time are measured under jit.
        return jax_runner.run_schedule(
            cfg, params, tokens, schedule, mode=mode, hparams=suite.hparams,
            timing_repeats=suite.timing_repeats, with_reverse_loop=with_reverse_loop, seed=suite.seed,
            with_training=mode != "eager",
        )
    from . import torch_runner

    return torch_runner.run_schedule(
        cfg, params, tokens, schedule, hparams=suite.hparams,
        timing_repeats=suite.timing_repeats, with_reverse_loop=with_reverse_loop, seed=suite.seed,
    )


def _base_case(framework, mode, name, schedule, cfg, suite) -> dict:
    n = cfg.n_layer
    return {
        "framework": framework, "model": suite.preset.name, "schedule": name, "n_layer": n,
        "dtype": cfg.dtype, "mode": mode, "status": "error", "error": None,
        "loss": None, "loss_bitwise_equal": None, "grads_bitwise_equal": None, "weights_bitwise_equal": None,
        "reverse_loop_bitwise_equal": None, "max_ulp": None, "max_abs_diff": None,
        "weights_max_ulp": None, "mismatched": [],
        "residual_bytes": None, "residual_ratio": None, "peak_bytes": None, "peak_ratio": None,
        "peak_source": None, "predicted_peak_units": peak_units(n, schedule),
        "predicted_unit_ratio": peak_units(n, schedule) / peak_units(n, parse_schedule("none")),
        "recomputed_blocks": recomputed_blocks(n, schedule),
        "step_time_s": None, "time_overhead": None,
    }


def _fill_case(case: dict, res: dict, ref: dict) -> None:
    loss_cmp = compare_bitwise({"loss": res["loss"]}, {"loss": ref["loss"]})
    grads_cmp = compare_bitwise(res["grads"], ref["grads"])
    trained = res["trained"] is not None and ref["trained"] is not None
    weights_cmp = compare_bitwise(res["trained"], ref["trained"]) if trained else None
    timed = res["step_time_s"] is not None and ref["step_time_s"] is not None
    case.update(
        loss=float(res["loss"]),
        loss_bitwise_equal=loss_cmp.equal,
        grads_bitwise_equal=grads_cmp.equal,
        weights_bitwise_equal=weights_cmp.equal if trained else None,
        max_ulp=max(loss_cmp.max_ulp, grads_cmp.max_ulp) if min(loss_cmp.max_ulp, grads_cmp.max_ulp) >= 0 else -1,
        max_abs_diff=max(loss_cmp.max_abs_diff, grads_cmp.max_abs_diff),
        weights_max_ulp=weights_cmp.max_ulp if trained else None,
        mismatched=sorted(set(loss_cmp.mismatched + grads_cmp.mismatched + loss_cmp.nonfinite + grads_cmp.nonfinite)),
        residual_bytes=int(res["residual_bytes"]),
        residual_ratio=res["residual_bytes"] / ref["residual_bytes"] if ref["residual_bytes"] else None,
        peak_bytes=int(res["peak_bytes"]),
        peak_ratio=res["peak_bytes"] / ref["peak_bytes"] if ref["peak_bytes"] else None,
        peak_source=res.get("peak_source"),
        step_time_s=float(res["step_time_s"]) if timed else None,
        time_overhead=res["step_time_s"] / ref["step_time_s"] if timed and ref["step_time_s"] else None,
    )
    checks = [case["loss_bitwise_equal"], case["grads_bitwise_equal"]] + ([weights_cmp.equal] if trained else [])
    if res.get("reverse_loop_grads") is not None:
        rl = compare_bitwise(res["reverse_loop_grads"], res["grads"])
        case["reverse_loop_bitwise_equal"] = rl.equal
        case["reverse_loop_max_ulp"] = rl.max_ulp
        checks.append(rl.equal)
    case["status"] = "pass" if all(checks) else "fail"


def _cross(schedule: str, dtype: str, a: dict | None, b: dict | None) -> dict:
    tol = tolerance_for(dtype)
    out = {"schedule": schedule, "dtype": dtype, "tolerance": tol.max_rel_err, "tolerance_reason": tol.reason,
           "max_rel_err_loss": None, "max_rel_err_grads": None, "ok": False, "error": None}
    if a is None or b is None:
        out["error"] = "a framework's case did not complete; nothing to compare"
        return out
    out["max_rel_err_loss"] = max_rel_err({"loss": a["loss"]}, {"loss": b["loss"]})
    out["max_rel_err_grads"] = max_rel_err(a["grads"], b["grads"])
    out["ok"] = out["max_rel_err_loss"] <= tol.max_rel_err and out["max_rel_err_grads"] <= tol.max_rel_err
    return out


def run_suite(suite: SuiteConfig, on_case: Callable[[dict], None] | None = None,
              on_start: Callable[[str], None] | None = None,
              on_partial: Callable[[dict], None] | None = None) -> dict:
    """Run every case of ``suite``; return the report object (``schema``, ``cases``, ``cross_framework``).

    Args:
        suite: what to run.
        on_case: called with each finished case (progress display, partial reports).
        on_start: called with a short label before each case starts.
        on_partial: called with the report so far after each case (so an interrupted run keeps them).

    Raises:
        ValueError: a schedule name or parameter is invalid (before any case runs).
    """
    schedules = suite.schedule_objects()
    report = {"schema": SCHEMA_VERSION, "suite": suite.name, "model": suite.preset.name,
              "config": None, "batch_size": suite.preset.batch_size, "seq_len": suite.preset.seq_len,
              "hparams": dataclasses.asdict(suite.hparams), "seed": suite.seed,
              "cases": [], "cross_framework": []}
    tokens = token_batch(suite.preset.batch_size, suite.preset.seq_len, seed=suite.seed)
    for dtype in suite.dtypes:
        cfg = suite.preset.config.replace(dtype=dtype)
        report["config"] = dataclasses.asdict(cfg)
        params = init_params(cfg, seed=suite.seed)
        results: dict[tuple[str, str, str], dict] = {}
        for framework, mode in FRAMEWORK_MODES:
            if framework not in suite.frameworks:
                continue
            ref = None
            for name, schedule in schedules:
                case = _base_case(framework, mode, name, schedule, cfg, suite)
                if on_start:
                    on_start(f"{framework}/{mode} {dtype} {name}")
                t_case = time.perf_counter()
                try:
                    # The hand-rolled loop is checked op by op in JAX: under jit it is a different XLA
                    # program (Python-unrolled segments), fused differently (docs/framework-differences.md).
                    res = _run_framework(framework, mode, cfg, params, tokens, schedule, suite,
                                         with_reverse_loop=name != "none" and (framework, mode) != ("jax", "jit"))
                    if name == "none":
                        # The reference is checked against a second run of itself: determinism.
                        ref = res
                        again = _run_framework(framework, mode, cfg, params, tokens, schedule,
                                               dataclasses.replace(suite, timing_repeats=1), with_reverse_loop=False)
                        _fill_case(case, {**again, "step_time_s": res["step_time_s"]}, ref)
                        case["compared_with"] = "a second run of none (run-to-run determinism)"
                    elif ref is None:
                        raise RuntimeError("the no-remat reference case failed; nothing to compare against")
                    else:
                        _fill_case(case, res, ref)
                        case["compared_with"] = "none"
                    results[(framework, mode, name)] = res
                except Exception as exc:  # recorded, and the suite goes on
                    case["status"] = "error"
                    case["error"] = f"{type(exc).__name__}: {exc}"
                    case["traceback"] = traceback.format_exc(limit=8)
                case["case_wall_s"] = time.perf_counter() - t_case
                report["cases"].append(case)
                if on_case:
                    on_case(case)
                if on_partial:
                    on_partial(report)
        if "jax" in suite.frameworks and "torch" in suite.frameworks:
            for name, _ in schedules:
                jax_res = results.get(("jax", "jit", name)) or results.get(("jax", "eager", name))
                report["cross_framework"].append(_cross(name, dtype, jax_res, results.get(("torch", "eager", name))))
    return report


def report_passed(report: dict) -> bool:
    """True when every case passed and every cross-framework comparison is within tolerance."""
    return all(c["status"] == "pass" for c in report["cases"]) and all(x["ok"] for x in report["cross_framework"])
