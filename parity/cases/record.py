"""The case record: the fields every case starts with, and how a run fills them against its reference.

Every case of every report -- suite, stress, sweep, plan, distributed -- is a dict that starts with
the same fields (:data:`BASE_FIELDS`, made by :func:`base_case`): which framework and mode, which
model, which plan (its canonical name), depth, dtype, dropout, and the status with its error. Each
kind of case adds its own fields after them; report code reads the base fields the same way
everywhere (docs/report-schema.md).

:func:`new_case` is a suite case before it runs (``status: "error"`` until checked);
:func:`fill_case` compares one run with the reference byte for byte (:func:`parity.checks.compare.compare_bitwise`:
loss, gradients, trained weights, the reverse loop's gradients) and copies its measurements;
:func:`overhead_range` is the spread of a step-time ratio over the timed steps.
"""

from __future__ import annotations

import statistics

from jaxremat.spec import parse_schedule, peak_units, recomputed_blocks
from jaxremat.spec.plan import RematPlan

from parity.checks.compare import compare_bitwise
from parity.runners.result import RunResult, training_divergence


def policy_label(plan: RematPlan) -> str:
    """The case's ``policy``: the plan's policy, or for a segment plan the policies its checkpointed
    segments follow, joined by ``,`` in order of first use (``save_dots,attention_only``)."""
    return ",".join(p.name for p in plan.policies) or plan.policy.name


BASE_FIELDS = ("framework", "mode", "model", "plan", "n_layer", "dtype", "dropout", "status", "error")
"""The fields every case record starts with, in this order."""


def base_case(framework: str, mode: str, plan: str, model: str, cfg) -> dict:
    """The fields every case record starts with (:data:`BASE_FIELDS`), ``status`` ``"error"`` until checked.

    Args:
        framework: a name of :data:`parity.runners.framework.FRAMEWORKS`.
        mode: the mode the case runs in (``"jit"``, ``"eager"``).
        plan: the plan's canonical name (``"sqrt"``, ``"full+save_dots"``, ``"budget(50%)"``).
        model: the model's name in the report (a ``--model`` preset).
        cfg: the model configuration (``n_layer``, ``dtype``, ``dropout``).
    """
    return {"framework": framework, "mode": mode, "model": model, "plan": plan, "n_layer": cfg.n_layer,
            "dtype": cfg.dtype, "dropout": cfg.dropout, "status": "error", "error": None}


def new_case(framework: str, mode: str, name: str, plan: RematPlan, cfg, model: str) -> dict:
    """A suite case before it runs: the base fields, its predictions, every check unset.

    Args:
        framework: a name of :data:`parity.runners.framework.FRAMEWORKS`.
        mode: ``"jit"`` or ``"eager"``.
        name: the plan's canonical name.
        plan: the remat plan.
        cfg: the model configuration (``n_layer``, ``dtype``, ``dropout``).
        model: the model's name in the report.
    """
    n = cfg.n_layer
    schedule = plan.schedule
    return {
        **base_case(framework, mode, name, model, cfg),
        "policy": policy_label(plan), "offloaded_bytes": None, "names_ok": None, "block_names": None,
        "loss": None, "loss_bitwise_equal": None, "grads_bitwise_equal": None, "weights_bitwise_equal": None,
        "reverse_loop_bitwise_equal": None, "max_ulp": None, "max_abs_diff": None,
        "weights_max_ulp": None, "mismatched": [],
        "saved_bytes": None, "saved_ratio": None, "peak_bytes": None, "peak_ratio": None,
        "peak_source": None, "predicted_peak_units": peak_units(n, schedule, plan.policy),
        "predicted_unit_ratio": peak_units(n, schedule, plan.policy) / peak_units(n, parse_schedule("none")),
        "recomputed_blocks": recomputed_blocks(n, schedule, plan.policy),
        "step_time_s": None, "step_times_s": None, "time_overhead": None, "time_overhead_range": None,
    }
def fill_case(case: dict, res: RunResult, ref: RunResult) -> None:
    """Compare ``res`` with the reference ``ref`` byte for byte and copy its measurements into ``case``.

    Sets the bitwise checks (loss, gradients, trained weights when both trained, the reverse loop's
    gradients against ``res``'s own; where the trained weights differ, ``training_divergence``: the
    training step and the part of it where the two runs first parted,
    :func:`parity.runners.result.training_divergence`), ``max_ulp``, the saved, offloaded and peak bytes and their
    ratios to ``ref``'s, the step time and its ratio, and ``status`` (``pass`` when every check holds,
    ``names_ok`` included when set, else ``fail``).
    """
    loss_cmp = compare_bitwise({"loss": res.loss}, {"loss": ref.loss})
    grads_cmp = compare_bitwise(res.grads, ref.grads)
    trained = res.trained is not None and ref.trained is not None
    weights_cmp = compare_bitwise(res.trained, ref.trained) if trained else None
    timed = res.step_time_s is not None and ref.step_time_s is not None
    mem, ref_mem = res.memory, ref.memory
    case.update(
        loss=float(res.loss),
        loss_bitwise_equal=loss_cmp.equal,
        grads_bitwise_equal=grads_cmp.equal,
        weights_bitwise_equal=weights_cmp.equal if trained else None,
        max_ulp=max(loss_cmp.max_ulp, grads_cmp.max_ulp) if min(loss_cmp.max_ulp, grads_cmp.max_ulp) >= 0 else -1,
        max_abs_diff=max(loss_cmp.max_abs_diff, grads_cmp.max_abs_diff),
        weights_max_ulp=weights_cmp.max_ulp if trained else None,
        mismatched=sorted(set(loss_cmp.mismatched + grads_cmp.mismatched + loss_cmp.nonfinite + grads_cmp.nonfinite)),
        saved_bytes=int(mem.saved_bytes),
        offloaded_bytes=int(mem.offloaded_bytes or 0),
        saved_ratio=mem.saved_bytes / ref_mem.saved_bytes if ref_mem.saved_bytes else None,
        peak_bytes=int(mem.peak_bytes),
        peak_ratio=mem.peak_bytes / ref_mem.peak_bytes if ref_mem.peak_bytes else None,
        peak_source=mem.peak_source,
        step_time_s=float(res.step_time_s) if timed else None,
        time_overhead=res.step_time_s / ref.step_time_s if timed and ref.step_time_s else None,
    )
    if trained and not weights_cmp.equal:
        case["training_divergence"] = training_divergence(res.training_steps, ref.training_steps)
    if timed:
        case["step_times_s"] = _times(res)
        case["time_overhead_range"] = overhead_range(case["step_times_s"], _times(ref))
    checks = [case["loss_bitwise_equal"], case["grads_bitwise_equal"]] + ([weights_cmp.equal] if trained else [])
    if case.get("names_ok") is not None:
        checks.append(case["names_ok"])
    if res.reverse_loop_grads is not None:
        rl = compare_bitwise(res.reverse_loop_grads, res.grads)
        case["reverse_loop_bitwise_equal"] = rl.equal
        case["reverse_loop_max_ulp"] = rl.max_ulp
        checks.append(rl.equal)
    case["status"] = "pass" if all(checks) else "fail"


def _times(res: RunResult) -> list[float]:
    """The timed steps behind ``res.step_time_s`` (seconds): the runner's list when its median is
    that number, else the median alone (a result whose time was taken from another run)."""
    times = res.step_times_s
    if not times or statistics.median(times) != res.step_time_s:
        return [float(res.step_time_s)]
    return [float(t) for t in times]


def overhead_range(times_s, ref_times_s) -> list[float] | None:
    """The lowest and highest step-time ratio any pair of timed steps gives: ``[min(t) / max(t_ref),
    max(t) / min(t_ref)]`` (seconds over seconds), or None without times.

    A ratio whose range includes 1.0 is not resolved from noise by these repeats.
    """
    if not times_s or not ref_times_s or min(ref_times_s) <= 0:
        return None
    return [min(times_s) / max(ref_times_s), max(times_s) / min(ref_times_s)]


