"""Plans for a memory budget, as cases of the one case loop: ``budget(50%)`` and ``best_uniform(50%)``.

``budget(BUDGET)`` is the planner's plan (:func:`jaxremat.planner.plan_model` in JAX,
:func:`torchref.planner.plan_model` in PyTorch: least recompute within the budget over one-level
segment plans with a policy per segment); ``best_uniform(BUDGET)`` is the uniform plan of least
recompute that fits the same budget (``full``, ``every_k(k)``, ``segments(s)``, ``sqrt``, each
with no policy or one of the menu's policies, predicted by the same menu and chain model).
``BUDGET`` is a percentage of ``none``'s *measured* peak activation bytes in the same framework
(``50%``) or bytes (``12MiB``, ``4096`` = 4096 bytes; :func:`jaxremat.spec.planner.parse_budget`).
``plan(...)`` is always a segment plan (:mod:`jaxremat.spec.segment_plan`); the budget's old
spelling ``plan(50%)`` is refused with a message naming ``budget(50%)``.

"Least recompute" is the suite's ``planner_cost``: recompute FLOPs (``"flops"``), or time (``"time"``:
each block option's forward and backward time measured by the framework once per model and shape,
:mod:`jaxremat.block_time`, :mod:`torchref.block_time`); the uniform plan is chosen on the same cost.

A budget plan is resolved when its case runs, once ``none`` has been measured:

1. the budget in bytes (a percentage of ``none``'s measured peak activation);
2. the offset of the measurement over the model, ``max(0, measured - predicted)`` of ``none``
   (what the per-tensor model leaves out: single ops' working buffers, XLA's layout copies), is
   taken off the budget, and the plan is chosen for what remains;
3. the plan runs (the framework's one measurement path, checked bitwise against ``none`` as every
   case is); when its measured peak activation still exceeds the budget, the planner is asked
   again for the budget less that plan's own error (measured less predicted) when it is larger
   than the offset, else for the target lowered by the overshoot, up to :data:`MAX_ATTEMPTS` times. Every attempt
   is recorded in the case (``budget_attempts``); the case reports the last one, and a measured
   peak over budget is the status ``over_budget``, a failure.

A family without a per-tensor account (the BERT encoder) has a chain of its stack only
(``fixed_bytes`` 0): the prediction it reports is the chain's plus ``none``'s offset
(``calibration_bytes`` in each attempt), the offset standing in for what lies outside the stack.

JAX op by op reuses the plan resolved under ``jit`` (the compiled program is what is measured).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

from jaxremat.models import get_model
from jaxremat.spec.plan import RematPlan, parse_plan
from jaxremat.spec.option_time import times_table
from jaxremat.spec.planner import (Budget, NoPlanFits, chain_costs, chain_time_s, min_peak_plan, parse_budget,
                                   plan_for_budget)
from jaxremat.spec.policies import parse_policy
from jaxremat.spec.schedules import parse_schedule

from parity.runners.framework import get_framework

__all__ = ["BudgetRequest", "MAX_ATTEMPTS", "Resolution", "choose_plan", "parse_case_plan", "resolve", "uniform_candidates"]

MAX_ATTEMPTS = 4
"""Plans tried per budget case before the last is reported (module docstring, step 3)."""

_REQUEST = re.compile(r"^\s*(budget|best_uniform)\(\s*([^(),]*?)\s*\)\s*$")
_OLD_BUDGET = re.compile(r"^\s*plan\(\s*([0-9.]+\s*(%|[A-Za-z]+))\s*\)\s*$")


@dataclasses.dataclass(frozen=True)
class BudgetRequest:
    """``budget(BUDGET)`` or ``best_uniform(BUDGET)``: a plan chosen for a memory budget when its case runs.

    Attributes:
        kind: ``"budget"`` (the planner) or ``"best_uniform"`` (the best uniform plan).
        budget: the :class:`jaxremat.spec.planner.Budget`.
    """

    kind: str
    budget: Budget

    @property
    def name(self) -> str:
        return f"{self.kind}({self.budget.text})"


def parse_case_plan(text: "str | RematPlan | BudgetRequest") -> "RematPlan | BudgetRequest":
    """A case's plan: ``budget(50%)`` / ``best_uniform(12MiB)`` as a :class:`BudgetRequest`, else
    :func:`jaxremat.spec.plan.parse_plan` (``plan(3+save_dots,5)`` is a segment plan). Objects are
    returned as they are.

    Raises:
        ValueError: a bad budget (:func:`jaxremat.spec.planner.parse_budget`), a bad plan, or a budget
            written with the old spelling ``plan(50%)`` (the message names ``budget(50%)``).
    """
    if isinstance(text, (RematPlan, BudgetRequest)):
        return text
    if isinstance(text, str):
        old = _OLD_BUDGET.match(text)
        if old:
            raise ValueError(f"{text.strip()!r}: a memory budget is written budget({old.group(1).replace(' ', '')}) "
                             "(plan(...) lists the segments of a segment plan, e.g. plan(3*2+save_dots,2:store))")
        m = _REQUEST.match(text)
        if m:
            try:
                return BudgetRequest(m.group(1), parse_budget(m.group(2)))
            except ValueError as exc:
                raise ValueError(f"{text!r}: {exc}") from None
    return parse_plan(text)


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What resolving a budget case gave.

    Attributes:
        plan: the :class:`jaxremat.spec.plan.RematPlan` run last.
        result: its run (the runner's result).
        budget_bytes: the budget in bytes.
        attempts: one dict per plan tried: ``plan``, ``target_bytes`` (what the planner was given),
            ``predicted_peak_activation_bytes``, ``predicted_saved_bytes`` (of the stack and the
            tensors outside it), ``recompute_flops``, ``measured_peak_activation_bytes``, ``within_budget``.
        offset_bytes: ``none``'s measured peak activation less its prediction (>= 0), taken off the budget.
        cost: what the plan minimized (``"flops"`` or ``"time"``).
        option_times: with ``cost="time"``, each option's measured times
            (:func:`jaxremat.spec.option_time.times_table`: ms per block, [median, min, max]); else None.
    """

    plan: RematPlan
    result: object
    budget_bytes: int
    attempts: tuple
    offset_bytes: int
    cost: str = "flops"
    option_times: dict | None = None

    @property
    def last(self) -> dict:
        return self.attempts[-1]


def _uniform_segments(plan: RematPlan, n: int) -> list[tuple[int, str]]:
    opt = plan.policy.name
    return [(s.length, opt if s.checkpointed else "store") for s in plan.segments_for(n)]


def uniform_candidates(n_layer: int, policies) -> list[RematPlan]:
    """Every uniform plan the comparison considers at depth N: ``full``, ``every_k(k)`` (2 <= k < N),
    ``segments(s)`` (1 <= s <= N), ``sqrt``, each with no policy or one of ``policies``, deduplicated
    by the segments they resolve to (``nested`` plans are left out, as they are of the planner's space)."""
    schedules = ["full", *(f"every_k({k})" for k in range(2, n_layer)),
                 *(f"segments({s})" for s in range(1, n_layer + 1)), "sqrt"]
    out, seen = [], set()
    for pol in policies:
        for sch in schedules:
            plan = RematPlan(parse_schedule(sch), parse_policy(pol))
            try:
                key = (tuple((s.length, s.checkpointed) for s in plan.segments_for(n_layer)), plan.policy.name)
            except ValueError:
                continue
            if key not in seen:
                seen.add(key)
                out.append(plan)
    return out


def choose_plan(request: BudgetRequest, chain: dict, n: int, target: int, min_len: int = 1,
            cost: str = "flops") -> tuple[RematPlan, dict]:
    """The plan for ``target`` bytes (whole-step peak activation) of least ``cost``, and its predictions
    (``predicted_stack_step_time_s``: the stack's predicted step time, with ``cost="time"``)."""
    fixed = chain["fixed_bytes"]
    opts, bnd, inv = chain["options_per_block"], chain["boundary_bytes"], chain["invariant_bytes"]
    timed = {"predicted_stack_step_time_s": None}
    if request.kind == "budget":
        try:
            r = plan_for_budget(opts, max(0, target - fixed), bnd, inv, min_checkpoint_length=min_len, cost=cost)
        except NoPlanFits as exc:
            raise NoPlanFits(target, exc.min_peak_bytes + fixed, exc.min_peak_plan) from None
        return RematPlan(r.plan), {"predicted_peak_activation_bytes": r.peak_bytes + fixed,
                                   "predicted_stack_saved_bytes": r.saved_bytes, "recompute_flops": r.recompute_flops,
                                   "predicted_stack_step_time_s": r.step_time_s}
    names = [o.name for o in opts[0]]
    best = None
    for plan in uniform_candidates(n, [m for m in names if m != "store"]):
        segs = _uniform_segments(plan, n)
        if any(o != "store" and length < min_len for length, o in segs):
            continue  # outside the space the planner searches too
        peak, flops, saved = chain_costs(opts, segs, bnd, inv)
        key = (chain_time_s(opts, segs) if cost == "time" else flops, peak)
        if peak + fixed <= target and (best is None or key < best[0]):
            best = (key, plan, saved, flops)
    if best is None:
        least, least_plan = min_peak_plan(opts, bnd, inv, min_checkpoint_length=min_len)
        raise NoPlanFits(target, least + fixed, least_plan)
    (value, peak), plan, saved, flops = best
    if cost == "time":
        timed["predicted_stack_step_time_s"] = value
    return plan, {"predicted_peak_activation_bytes": peak + fixed, "predicted_stack_saved_bytes": saved,
                  "recompute_flops": flops, **timed}


def resolve(request: BudgetRequest, framework: str, cfg, batch: int, seq: int, ref, run: Callable[[RematPlan], object],
            *, policies=None, predicted_none: int | None = None, min_checkpoint_length: int = 1,
            cost: str = "flops") -> Resolution:
    """Choose, run and if need be re-choose the plan of a budget case (module docstring).

    Args:
        request: the budget case.
        framework: a name of :data:`parity.runners.framework.FRAMEWORKS` (its planner chain and menu).
        cfg, batch, seq: the model (a family with planner chains) and the batch's shape.
        ref: ``none``'s run in this framework (its ``memory.peak_activation_bytes`` is the reference).
        run: ``plan -> result`` (the case set's runner; results carry ``memory``).
        policies: the menu's checkpoint options (None: the framework's ``DEFAULT_MENU``).
        predicted_none: ``none``'s predicted peak activation (None: the chain model's all-store plan).
        min_checkpoint_length: the shortest checkpointed segment of the space, for the planner
            and the uniform plans alike (:func:`jaxremat.spec.planner.plan_for_budget`).
        cost: what the plan minimizes, the planner's and the uniform plan's alike: ``"flops"`` or
            ``"time"`` (each option measured by the framework, ``planner_chain(..., cost="time")``).

    Raises:
        jaxremat.spec.planner.NoPlanFits: no plan of the space is predicted to fit the (offset) budget.
        ValueError: a family without a planner chain, or ``none`` without a measured peak.
    """
    measured_none = ref.memory.peak_activation_bytes if ref.memory is not None else None
    if not measured_none:
        raise ValueError("none's peak activation bytes were not measured; a budget plan needs them")
    if policies is None:
        policies = get_framework(framework).default_menu()
    chain = get_framework(framework).planner_chain(cfg, batch, seq, tuple(policies), cost)
    n = cfg.n_layer
    if predicted_none is None:
        predicted_none = chain["fixed_bytes"] + chain_costs(chain["options_per_block"], [(n, "store")],
                                                            chain["boundary_bytes"], chain["invariant_bytes"])[0]
    budget = request.budget.resolve(measured_none)
    offset = max(0, int(measured_none) - int(predicted_none))
    target, none_offset = budget - offset, offset
    calibrate = get_model(cfg.arch).activation_account is None
    attempts: list[dict] = []
    last = None
    for _ in range(MAX_ATTEMPTS):
        try:
            plan, pred = choose_plan(request, chain, n, target, min_checkpoint_length, cost)
        except NoPlanFits as exc:
            if not attempts:
                need = exc.min_peak_bytes + offset
                raise NoPlanFits(budget, need, exc.min_peak_plan,
                                 f"{request.name}: no plan fits: the budget is {budget} bytes"
                                 + (f" ({request.budget.text} of none's measured peak activation, {measured_none} bytes)"
                                    if request.budget.fraction is not None else "")
                                 + f"; the smallest predicted peak activation of the planner's space is "
                                 f"{exc.min_peak_bytes} bytes ({exc.min_peak_plan.name}), plus {offset} bytes by which "
                                 f"none's measurement exceeds the model: about {need} bytes"
                                 + (f", {100 * need / measured_none:.0f}% of none's" if measured_none else "")
                                 + "; raise the budget to that, or shrink the batch or the sequence") from None
            attempts[-1]["next"] = f"no plan is predicted to fit the lowered target: {exc}"
            break
        if last is not None and plan.name == last[0].name:
            break  # the lowered target chose the same plan: nothing new to measure
        res = run(plan)
        last = (plan, res)
        measured = res.memory.peak_activation_bytes
        raw = pred["predicted_peak_activation_bytes"]
        if calibrate:  # no account of what lies outside the stack: none's gap stands in for it
            pred = {**pred, "predicted_peak_activation_bytes": raw + none_offset, "calibration_bytes": none_offset}
        attempts.append({"plan": plan.name, "target_bytes": int(target), **pred,
                         "measured_peak_activation_bytes": measured,
                         "within_budget": measured is not None and measured <= budget})
        if measured is None or measured <= budget:
            break
        # this plan measured further above its prediction than none did: take that error off the budget
        error = measured - raw
        target = budget - max(offset, error) if error > offset else target - (measured - budget)
        offset = max(offset, error)
    times = times_table(chain["option_times"]) if cost == "time" else None
    return Resolution(last[0], last[1], budget, tuple(attempts), none_offset, cost, times)
