"""The parity suite: every schedule against ``none`` inside each framework, and across frameworks.

For each dtype and framework (JAX under ``jit`` and op by op, PyTorch eager) the suite runs the
no-remat reference, then every schedule, and checks byte for byte: the loss, every parameter
gradient, the weights after the optimizer steps, and the hand-rolled reverse segment loop's
gradients against the library schedule's. It then compares the frameworks on the same weights and
tokens against :data:`parity.checks.compare.TOLERANCES` (:func:`parity.checks.compare.cross_check`). A case
that raises is recorded with ``status: "error"`` and the suite goes on.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import traceback
from typing import Callable, Iterable

import numpy as np

from jaxremat.models import get_model
from jaxremat.spec import DEFAULT_SCHEDULES, parse_schedule, peak_units, recomputed_blocks
from jaxremat.spec.policies import POLICIES
from jaxremat.spec.plan import RematPlan, parse_plan

from parity.inputs.train import AdamWConfig
from parity.checks.compare import compare_bitwise, cross_check, tolerance_for
from parity.inputs.presets import ModelPreset
from parity.checks.names import expected_names, measured_names
from parity.checks.predictions import attach_predictions
from parity.inputs.pretrained import preset_inputs
from parity.checks.saving import attach_saving

SCHEMA_VERSION = 3
"""report.json schema: 3 writes non-finite floats as strings and adds environment and timing spreads (docs/cli.md)."""

QUICK_PLANS = DEFAULT_SCHEDULES
"""The quick suite (the default): the segment schedules."""

FULL_PLANS = (
    "none", "full", "every_k(2)", "sqrt", "segments(4)", "nested(sqrt,sqrt)", "nested(every_k(4),every_k(2))",
    *(f"full+{name}" for name in POLICIES if name != "save_nothing"),
    "every_k(2)+save_qkv_proj", "sqrt+attention_only", "nested(every_k(4),every_k(2))+save_dots",
)
"""The full suite: every schedule, every named policy on per-block checkpoints, and combinations
of segment schedules with inner policies (MaxText aliases resolve to these policies)."""

STRESS_PLANS = ("none", "full", "every_k(2)", "sqrt", "segments(2)", "nested(sqrt,sqrt)")
"""The stress suite (:mod:`parity.cases.stress`): every schedule kind, under each stress variant."""

SUITE_PLANS = {"quick": QUICK_PLANS, "full": FULL_PLANS, "stress": STRESS_PLANS}
FRAMEWORK_MODES = (("jax", "jit"), ("jax", "eager"), ("torch", "eager"))


@dataclasses.dataclass(frozen=True)
class SuiteConfig:
    """What one suite run covers.

    Attributes:
        name: suite name (``quick``, ``full`` or ``stress``; ``stress`` runs :mod:`parity.cases.stress`).
        preset: model preset (config, batch size, sequence length).
        schedules: plans ``SCHEDULE`` or ``SCHEDULE+POLICY`` (:mod:`jaxremat.spec.plan`), ``none``
            first (it is the reference and is added if missing).
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

    def schedule_objects(self) -> list[tuple[str, RematPlan]]:
        """``[(canonical name, plan)]`` with ``none`` first; raises ValueError on a bad name."""
        parsed = [parse_plan(s) for s in self.schedules]
        out, seen = [], set()
        for plan in [parse_plan("none")] + parsed:
            if plan.name not in seen:
                seen.add(plan.name)
                out.append((plan.name, plan))
        for _, plan in out:  # resolve now so s > n_layer fails before any work starts
            plan.segments_for(self.preset.config.n_layer)
            p = plan.policy
            if "torch" in self.frameworks and "block_input" in (p.kept_names | p.offloaded_names) and not p.save_everything:
                raise ValueError(f"plan {plan.name!r}: PyTorch cannot keep 'block_input' (a checkpointed segment is "
                                 "replayed from its start); drop it or run --frameworks jax")
        return out


def run_framework(framework: str, mode: str, cfg, params, tokens, plan: RematPlan, suite: SuiteConfig,
                   with_reverse_loop: bool):
    if framework == "jax":
        from parity.runners import jax_runner

        # Op by op, JAX dispatches every primitive from Python (about a second per step here): that
        # mode checks the loss and gradients; training and step time are measured under jit.
        return jax_runner.run_schedule(
            cfg, params, tokens, plan.schedule, mode=mode, hparams=suite.hparams,
            timing_repeats=suite.timing_repeats, with_reverse_loop=with_reverse_loop, seed=suite.seed,
            with_training=mode != "eager", policy=plan.policy,
        )
    from parity.runners import torch_runner

    return torch_runner.run_schedule(
        cfg, params, tokens, plan.schedule, hparams=suite.hparams,
        timing_repeats=suite.timing_repeats, with_reverse_loop=with_reverse_loop, seed=suite.seed,
        policy=plan.policy,
    )


def _base_case(framework, mode, name, plan: RematPlan, cfg, suite) -> dict:
    n = cfg.n_layer
    schedule = plan.schedule
    return {
        "framework": framework, "model": suite.preset.name, "schedule": name, "n_layer": n,
        "policy": plan.policy.name, "offloaded_bytes": None, "names_ok": None, "block_names": None,
        "dtype": cfg.dtype, "dropout": cfg.dropout, "mode": mode, "status": "error", "error": None,
        "loss": None, "loss_bitwise_equal": None, "grads_bitwise_equal": None, "weights_bitwise_equal": None,
        "reverse_loop_bitwise_equal": None, "max_ulp": None, "max_abs_diff": None,
        "weights_max_ulp": None, "mismatched": [],
        "residual_bytes": None, "residual_ratio": None, "peak_bytes": None, "peak_ratio": None,
        "peak_source": None, "predicted_peak_units": peak_units(n, schedule, plan.policy),
        "predicted_unit_ratio": peak_units(n, schedule, plan.policy) / peak_units(n, parse_schedule("none")),
        "recomputed_blocks": recomputed_blocks(n, schedule, plan.policy),
        "step_time_s": None, "step_times_s": None, "time_overhead": None, "time_overhead_range": None,
    }


def fill_case(case: dict, res: dict, ref: dict) -> None:
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
        offloaded_bytes=int(res.get("offloaded_bytes") or 0),
        residual_ratio=res["residual_bytes"] / ref["residual_bytes"] if ref["residual_bytes"] else None,
        peak_bytes=int(res["peak_bytes"]),
        peak_ratio=res["peak_bytes"] / ref["peak_bytes"] if ref["peak_bytes"] else None,
        peak_source=res.get("peak_source"),
        step_time_s=float(res["step_time_s"]) if timed else None,
        time_overhead=res["step_time_s"] / ref["step_time_s"] if timed and ref["step_time_s"] else None,
    )
    if timed:
        case["step_times_s"] = _times(res)
        case["time_overhead_range"] = overhead_range(case["step_times_s"], _times(ref))
    checks = [case["loss_bitwise_equal"], case["grads_bitwise_equal"]] + ([weights_cmp.equal] if trained else [])
    if case.get("names_ok") is not None:
        checks.append(case["names_ok"])
    if res.get("reverse_loop_grads") is not None:
        rl = compare_bitwise(res["reverse_loop_grads"], res["grads"])
        case["reverse_loop_bitwise_equal"] = rl.equal
        case["reverse_loop_max_ulp"] = rl.max_ulp
        checks.append(rl.equal)
    case["status"] = "pass" if all(checks) else "fail"


def _times(res: dict) -> list[float]:
    """The timed steps behind ``res["step_time_s"]`` (seconds): the runner's list when its median is
    that number, else the median alone (a result whose time was taken from another run)."""
    times = res.get("step_times_s")
    if not times or statistics.median(times) != res["step_time_s"]:
        return [float(res["step_time_s"])]
    return [float(t) for t in times]


def overhead_range(times_s, ref_times_s) -> list[float] | None:
    """The lowest and highest step-time ratio any pair of timed steps gives: ``[min(t) / max(t_ref),
    max(t) / min(t_ref)]`` (seconds over seconds), or None without times.

    A ratio whose range includes 1.0 is not resolved from noise by these repeats.
    """
    if not times_s or not ref_times_s or min(ref_times_s) <= 0:
        return None
    return [min(times_s) / max(ref_times_s), max(times_s) / min(ref_times_s)]


def _check_kept(case: dict, framework: str, cfg, suite: SuiteConfig, plan: RematPlan, res: dict, ref: dict,
                cache: dict) -> None:
    """Record what one checkpointed block keeps under the plan's policy and whether it is as declared.

    ``save_everything`` must keep exactly the bytes of ``none``; every other policy must keep (and
    offload) the activation names :func:`parity.checks.names.expected_names` gives.
    """
    policy = plan.policy
    if policy.saves_nothing:
        return
    if not get_model(cfg.arch).block_names_measurable:  # block_memory builds the GPT block only
        case["expected_names"] = "not measured for this architecture"
        return
    if policy.save_everything:
        case["names_ok"] = res["residual_bytes"] == ref["residual_bytes"]
        case["expected_names"] = "the same saved bytes as none"
        return
    key = (framework, cfg, policy)
    if key not in cache:
        cache[key] = measured_names(framework, cfg, suite.preset.batch_size, suite.preset.seq_len, policy)
    measured, expected = cache[key], expected_names(policy, framework)
    case["block_names"] = measured
    case["expected_names"] = expected
    case["names_ok"] = measured["kept"] == expected["kept"] and measured["offloaded"] == expected["offloaded"]


def _cross(schedule: str, dtype: str, a: dict | None, b: dict | None, term_scale: float | None,
           scale_error: str | None = None) -> dict:
    """JAX (``a``) against PyTorch (``b``) on one schedule: :func:`parity.checks.compare.cross_check`'s fields.

    The loss is checked relative to ``term_scale`` (:func:`parity.checks.loss_terms.loss_term_scale`),
    each gradient tensor relative to its largest entry; ``tolerance`` is the gradient bound and
    ``tolerance_loss`` the loss bound, each with its reason.
    """
    tol, tol_loss = tolerance_for(dtype, "grads"), tolerance_for(dtype, "loss")
    out = {"schedule": schedule, "dtype": dtype, "tolerance": tol.bound, "tolerance_reason": tol.reason,
           "tolerance_loss": tol_loss.bound, "tolerance_loss_reason": tol_loss.reason,
           "loss_err": None, "loss_abs_diff": None, "loss_term_scale": term_scale,
           "max_rel_err_loss": None, "max_rel_err_grads": None, "worst_grad": None, "ok": False, "error": None}
    if a is None or b is None:
        out["error"] = "a framework's case did not complete; nothing to compare"
        return out
    if term_scale is None:
        out["error"] = scale_error or "the loss's term scale could not be computed; nothing to compare"
        return out
    out.update(cross_check(a["loss"], b["loss"], a["grads"], b["grads"], term_scale, dtype))
    return out


def _cross_rows(schedules, dtype: str, results: dict, cfg, params, tokens) -> list[dict]:
    """One :func:`_cross` row per schedule (JAX ``jit``, else op by op, against PyTorch)."""
    from parity.checks.loss_terms import loss_term_scale

    scale, failure = None, None
    try:
        scale = loss_term_scale(cfg, params, tokens)
    except Exception as exc:  # recorded on every row, and the suite goes on
        failure = f"the loss's term scale could not be computed: {type(exc).__name__}: {exc}"
    return [_cross(name, dtype, results.get(("jax", "jit", name)) or results.get(("jax", "eager", name)),
                   results.get(("torch", "eager", name)), scale, failure) for name, _ in schedules]


def _runs(suite: SuiteConfig, framework: str, mode: str, dropout: float) -> bool:
    """Whether ``framework``/``mode`` runs at this dropout rate (JAX op by op only at the preset's eager_dropouts)."""
    eager_dropouts = suite.preset.eager_dropouts
    skip_eager = (framework, mode) == ("jax", "eager") and eager_dropouts is not None and dropout not in eager_dropouts
    return framework in suite.frameworks and not skip_eager


def count_cases(suite: SuiteConfig) -> int:
    """Number of cases :func:`run_suite` will run (for a progress bar)."""
    if suite.name == "stress":
        from parity.cases.stress import case_count

        return case_count(suite)
    dropouts = suite.preset.dropouts or (suite.preset.config.dropout,)
    modes = sum(_runs(suite, f, m, r) for r in dropouts for f, m in FRAMEWORK_MODES)
    return len(suite.dtypes) * modes * len(suite.schedule_objects())


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
    if suite.name == "stress":
        from parity.cases.stress import run_stress

        return run_stress(suite, on_case=on_case, on_start=on_start, on_partial=on_partial)
    schedules = suite.schedule_objects()
    report = {"schema": SCHEMA_VERSION, "suite": suite.name, "model": suite.preset.name,
              "config": None, "batch_size": suite.preset.batch_size, "seq_len": suite.preset.seq_len,
              "hparams": dataclasses.asdict(suite.hparams), "seed": suite.seed,
              "cases": [], "cross_framework": []}
    dropouts = suite.preset.dropouts or (suite.preset.config.dropout,)
    for dtype, dropout in ((d, r) for d in suite.dtypes for r in dropouts):
        cfg, params, tokens = preset_inputs(suite.preset, dtype, suite.seed)
        cfg = cfg.replace(dropout=dropout)
        report["config"] = dataclasses.asdict(cfg)
        spec = get_model(cfg.arch)
        if spec.peer_checks is not None and dropout == 0.0:
            peer_checks = spec.load("peer_checks")
            try:
                ckpt = suite.preset.checkpoint() if suite.preset.checkpoint else None
                report.setdefault("peer", []).extend(peer_checks(cfg, params, tokens, ckpt))
            except Exception as exc:  # recorded as a failed check, and the suite goes on
                report.setdefault("peer", []).append({"check": "peer", "dtype": dtype, "max_rel_err": None,
                                                      "tolerance": None, "ok": False,
                                                      "note": f"{type(exc).__name__}: {exc}"})
        results: dict[tuple[str, str, str], dict] = {}
        names_cache: dict = {}
        for framework, mode in FRAMEWORK_MODES:
            if not _runs(suite, framework, mode, dropout):
                continue
            ref = None
            for name, plan in schedules:
                case = _base_case(framework, mode, name, plan, cfg, suite)
                if on_start:
                    on_start(f"{framework}/{mode} {dtype} {name}")
                t_case = time.perf_counter()
                try:
                    # The hand-rolled loop is checked op by op in JAX: under jit it is a different XLA
                    # program (Python-unrolled segments), fused differently (docs/framework-differences.md).
                    res = run_framework(framework, mode, cfg, params, tokens, plan, suite,
                                         with_reverse_loop=name != "none" and (framework, mode) != ("jax", "jit"))
                    if name == "none":
                        # The reference is checked against a second run of itself: determinism.
                        ref = res
                        again = run_framework(framework, mode, cfg, params, tokens, plan,
                                               dataclasses.replace(suite, timing_repeats=1), with_reverse_loop=False)
                        fill_case(case, {**again, "step_time_s": res["step_time_s"],
                                           "step_times_s": res.get("step_times_s")}, ref)
                        case["compared_with"] = "a second run of none (run-to-run determinism)"
                    elif ref is None:
                        raise RuntimeError("the no-remat reference case failed; nothing to compare against")
                    else:
                        _check_kept(case, framework, cfg, suite, plan, res, ref, names_cache)
                        fill_case(case, res, ref)
                        case["compared_with"] = "none"
                    attach_predictions(case, framework, cfg, suite.preset.batch_size, suite.preset.seq_len, plan, res)
                    if name != "none":
                        attach_saving(case, framework, cfg, suite.preset.batch_size, suite.preset.seq_len, plan, res, ref)
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
        # With dropout the two frameworks draw different masks (different RNGs): compared only without.
        if "jax" in suite.frameworks and "torch" in suite.frameworks and dropout == 0.0:
            report["cross_framework"] += _cross_rows(schedules, dtype, results, cfg, params, tokens)
    return report


def report_passed(report: dict) -> bool:
    """True when every case passed and every cross-framework comparison is within tolerance."""
    return (all(c["status"] == "pass" for c in report["cases"]) and all(x["ok"] for x in report["cross_framework"])
            and all(x["ok"] is not False for x in report.get("peer", [])))
