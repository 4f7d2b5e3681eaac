"""Plans for a memory budget, as cases of the one case loop: ``budget(50%)`` and ``best_uniform(50%)``.

``budget(BUDGET)`` is the planner's plan (:func:`jaxremat.planner.plan_model` in JAX,
:func:`torchref.planner.plan_model` in PyTorch: least recompute within the budget over one-level
segment plans with a policy per segment); ``best_uniform(BUDGET)`` is the uniform plan of least
recompute that fits the same budget (``full``, ``every_k(k)``, ``segments(s)``, ``sqrt``, each
with no policy or one of the menu's policies, predicted by the same menu and chain model).
``BUDGET`` is a percentage of ``none``'s *measured* peak activation bytes in the same framework
(``50%``) or bytes with a unit (``12MiB``, ``4096B``; a bare number is refused:
:func:`jaxremat.spec.planner.parse_budget`).
``plan(...)`` is always a segment plan (:mod:`jaxremat.spec.segment_plan`); the budget's old
spelling ``plan(50%)`` is refused with a message naming ``budget(50%)``.

"Least recompute" is the suite's ``planner_cost``: recompute FLOPs (``"flops"``), or time (``"time"``). How
time is measured is the framework's :attr:`parity.runners.framework.FrameworkInfo.time_cost`: ``"segments"``
(PyTorch), each block option's forward and backward time measured once per model and shape
(:mod:`torchref.block_time`) and summed by the planner; ``"plans"`` (JAX, where block times measured on short
segments do not add up to a compiled stack's), a handful of candidate plans (:func:`candidate_plans`: the
planner's plan on the FLOPs chain, the least-recompute uniform plan and ``full`` under each option that fit)
compiled and timed whole, interleaved, and picked by one rule for both cases
(:func:`parity.cases.plan_timing.pick_cases`): the candidate of fewest recompute FLOPs, unless another is faster
than it in every paired round (the whole [min-max] of the paired ratio below 1).

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
4. when no plan is predicted to fit the first target, the plan of least predicted peak runs: it is the case's
   plan when its measurement is within the budget, else :class:`jaxremat.spec.planner.NoPlanFits` names its
   measured peak as the least reachable (``none``'s offset need not hold for a plan that keeps little).

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

from parity.cases.plan_timing import PlanTimes, pick_cases
from parity.runners.framework import get_framework

__all__ = ["BudgetRequest", "MAX_ATTEMPTS", "Resolution", "candidate_plans", "choose_plan", "parse_case_plan", "resolve",
           "timed_choice", "uniform_candidates"]

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
    """``plan``'s segments at depth ``n`` as the chain model takes them: ``(length, option name or "store")``."""
    return [(s.length, (s.policy or plan.policy).name if s.checkpointed else "store") for s in plan.segments_for(n)]


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


def _planned(chain: dict, target: int, min_len: int, cost: str) -> tuple[RematPlan, dict]:
    """The planner's plan for ``target`` bytes (whole-step peak activation) on ``chain``, and its predictions."""
    fixed, opts = chain["fixed_bytes"], chain["options_per_block"]
    try:
        r = plan_for_budget(opts, max(0, target - fixed), chain["boundary_bytes"], chain["invariant_bytes"],
                            min_checkpoint_length=min_len, cost=cost)
    except NoPlanFits as exc:
        raise NoPlanFits(target, exc.min_peak_bytes + fixed, exc.min_peak_plan) from None
    return RematPlan(r.plan), {"predicted_peak_activation_bytes": r.peak_bytes + fixed,
                               "predicted_stack_saved_bytes": r.saved_bytes, "recompute_flops": r.recompute_flops,
                               "predicted_stack_step_time_s": r.step_time_s}


def _uniform_fits(chain: dict, n: int, target: int, min_len: int, cost: str) -> list[tuple[RematPlan, dict]]:
    """Every uniform plan predicted to fit ``target`` bytes, least ``cost`` first (then least peak)."""
    fixed, opts = chain["fixed_bytes"], chain["options_per_block"]
    names = [o.name for o in opts[0]]
    fits = []
    for plan in uniform_candidates(n, [m for m in names if m != "store"]):
        segs = _uniform_segments(plan, n)
        if any(o != "store" and length < min_len for length, o in segs):
            continue  # outside the space the planner searches too
        peak, flops, saved = chain_costs(opts, segs, chain["boundary_bytes"], chain["invariant_bytes"])
        if peak + fixed <= target:
            t = chain_time_s(opts, segs) if cost == "time" else None
            fits.append(((flops if t is None else t, peak), plan, {
                "predicted_peak_activation_bytes": peak + fixed, "predicted_stack_saved_bytes": saved,
                "recompute_flops": flops, "predicted_stack_step_time_s": t}))
    return [(plan, pred) for _, plan, pred in sorted(fits, key=lambda f: f[0])]


def choose_plan(request: BudgetRequest, chain: dict, n: int, target: int, min_len: int = 1,
            cost: str = "flops") -> tuple[RematPlan, dict]:
    """The plan for ``target`` bytes (whole-step peak activation) of least ``cost``, and its predictions
    (``predicted_stack_step_time_s``: the stack's predicted step time, with ``cost="time"``)."""
    if request.kind == "budget":
        return _planned(chain, target, min_len, cost)
    fits = _uniform_fits(chain, n, target, min_len, cost)
    if not fits:
        least, least_plan = min_peak_plan(chain["options_per_block"], chain["boundary_bytes"], chain["invariant_bytes"],
                                          min_checkpoint_length=min_len)
        raise NoPlanFits(target, least + chain["fixed_bytes"], least_plan)
    return fits[0]


def candidate_plans(chains: dict, n: int, target: int, min_len: int = 1) -> dict[str, list[tuple[RematPlan, dict]]]:
    """The plans timed whole for ``target`` bytes, per case kind, the model's choice first (each with its
    predictions and ``sources``: why it is a candidate).

    ``chains``: ``{cost: chain}``, the model's cost first. ``best_uniform``: the uniform plan of least cost on
    each chain, and ``full`` under each checkpoint option of the first chain's menu that fits (every block its
    own segment: recompute fused into each block's backward, the fastest uniform plan measured on XLA:CPU,
    docs/time.md); ``budget``: the planner's plan on each chain, then every ``best_uniform`` candidate (the
    planner's space holds them).

    Raises:
        jaxremat.spec.planner.NoPlanFits: no plan of the space fits (the first chain's least peak).
    """
    out: dict[str, dict] = {"budget": {}, "best_uniform": {}}

    def add(kind, plan, pred, source):
        got = out[kind].setdefault(plan.name, (plan, {**pred, "sources": []}))
        got[1]["sources"].append(source)

    first = next(iter(chains.values()))
    for cost, chain in chains.items():
        add("budget", *_planned(chain, target, min_len, cost), f"planner ({cost})")
        fits = _uniform_fits(chain, n, target, min_len, cost)
        if fits:
            add("best_uniform", *fits[0], f"best uniform ({cost})")
        if chain is first:
            full = [(p, d) for p, d in fits if all(s.checkpointed and s.length == 1 for s in p.segments_for(n))]
            for plan, pred in full:
                add("best_uniform", plan, pred, f"full, {plan.policy.name}")
    if not out["best_uniform"]:
        least, least_plan = min_peak_plan(first["options_per_block"], first["boundary_bytes"], first["invariant_bytes"],
                                          min_checkpoint_length=min_len)
        raise NoPlanFits(target, least + first["fixed_bytes"], least_plan)
    for name, (plan, pred) in out["best_uniform"].items():
        for source in pred["sources"]:
            add("budget", plan, pred, source)
    return {kind: list(got.values()) for kind, got in out.items()}


def timed_choice(request: BudgetRequest, chain: dict, n: int, target: int, min_len: int,
                 time_plans: Callable[[list], PlanTimes]) -> tuple[RematPlan, dict]:
    """The candidate of ``request``'s kind for ``target`` bytes (whole-step peak activation), measured.

    :func:`candidate_plans` on the FLOPs ``chain``; every candidate of both kinds is timed in one interleaved run
    (``time_plans(plans) -> PlanTimes``, e.g. :func:`parity.cases.plan_timing.time_plans`; the same list of plans
    for both kinds, so a caller may time it once), the choice :func:`parity.cases.plan_timing.pick_cases`'s (the
    least-FLOPs candidate unless another is faster beyond the noise), the same rule for both kinds.

    Returns:
        ``(plan, predictions)``: the predictions of :func:`choose_plan` with ``choice_rule`` (``"fastest beyond
        noise"``, ``"noise: least FLOPs kept"`` or ``"the only candidate"``), ``choice_reason`` (a sentence),
        ``choice_ratio`` (:attr:`parity.cases.plan_timing.TimedPick.ratio` as a dict, or None), ``candidates`` (per
        candidate of the kind: ``plan``, ``sources``, ``recompute_flops``, ``predicted_peak_activation_bytes``,
        ``step_ms`` [median, min, max], ``vs_model_choice``: the paired ratio to the kind's least-FLOPs candidate)
        and ``timing``.

    Raises:
        jaxremat.spec.planner.NoPlanFits: no plan of the space fits.
    """
    cands = candidate_plans({"flops": chain}, n, target, min_len)
    mine = cands[request.kind]
    timing = time_plans([p for p, _ in {p.name: (p, d) for p, d in cands["budget"] + mine}.values()])
    picks = pick_cases(timing, *([(p.name, d["recompute_flops"]) for p, d in cands[k]]
                                 for k in ("budget", "best_uniform")))
    got = picks[request.kind]
    plan, pred = next((p, d) for p, d in mine if p.name == got.plan)
    least = min(mine, key=lambda c: (c[1]["recompute_flops"], c[0].name))[0].name
    rows = [{"plan": p.name, "sources": d["sources"], "recompute_flops": d["recompute_flops"],
             "predicted_peak_activation_bytes": d["predicted_peak_activation_bytes"], "step_ms": timing.step_ms(p.name),
             "vs_model_choice": timing.ratio(p.name, least).as_dict()} for p, d in mine]
    return plan, {**{k: v for k, v in pred.items() if k != "sources"}, "choice_rule": got.rule,
                  "choice_reason": got.reason, "choice_ratio": None if got.ratio is None else got.ratio.as_dict(),
                  "candidates": rows, "timing": {"rounds": timing.rounds, "load_1min": list(timing.load_1min)}}


def _least_peak(request: BudgetRequest, chain: dict, n: int, exc: NoPlanFits, min_len: int,
                cost: str) -> tuple[RematPlan, dict]:
    """The plan of least predicted peak of ``request``'s kind (the planner's space, or the uniform plans), and its
    predictions: what a budget no plan is predicted to fit runs to find out whether the measurement fits."""
    if request.kind == "budget":
        try:
            return _planned(chain, exc.min_peak_bytes, min_len, cost)
        except NoPlanFits:  # the quantised search may miss the exact least peak: take the least plan as it is
            plan = RematPlan(exc.min_peak_plan)
            segs = _uniform_segments(plan, n)
            peak, flops, saved = chain_costs(chain["options_per_block"], segs, chain["boundary_bytes"],
                                             chain["invariant_bytes"])
            return plan, {"predicted_peak_activation_bytes": peak + chain["fixed_bytes"],
                          "predicted_stack_saved_bytes": saved, "recompute_flops": flops,
                          "predicted_stack_step_time_s": chain_time_s(chain["options_per_block"], segs)
                          if cost == "time" else None}
    fits = _uniform_fits(chain, n, 1 << 62, min_len, cost)
    return min(fits, key=lambda f: (f[1]["predicted_peak_activation_bytes"], f[1]["recompute_flops"]))


def _no_fit(request: BudgetRequest, budget: int, measured_none: int, offset: int, plan: RematPlan, pred: dict,
            measured: int | None) -> NoPlanFits:
    """The error of a budget below what the least-peak plan measured (or was predicted to need, unmeasured)."""
    need = measured if measured is not None else pred["predicted_peak_activation_bytes"] + offset
    how = (f"measured {measured} bytes (predicted {pred['predicted_peak_activation_bytes']})" if measured is not None
           else f"predicted to need about {need} bytes (unmeasured)")
    return NoPlanFits(budget, need, plan, (
        f"{request.name}: no plan fits: the budget is {budget} bytes"
        + (f" ({request.budget.text} of none's measured peak activation, {measured_none} bytes)"
           if request.budget.fraction is not None else "")
        + f"; the plan of least predicted peak, {plan.name}, {how}: the least reachable is {need} bytes, "
        f"{100 * need / measured_none:.0f}% of none's; raise the budget to that, or shrink the batch or the sequence"))


def resolve(request: BudgetRequest, framework: str, cfg, batch: int, seq: int, ref, run: Callable[[RematPlan], object],
            *, policies=None, predicted_none: int | None = None, min_checkpoint_length: int = 1,
            cost: str = "flops", time_plans: Callable[[list], PlanTimes] | None = None) -> Resolution:
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
            ``"time"``: each option measured by the framework (``planner_chain(..., cost="time")``), or, for a
            framework whose :attr:`parity.runners.framework.FrameworkInfo.time_cost` is ``"plans"``, whole
            candidate plans timed (:func:`candidate_plans`, picked by :func:`parity.cases.plan_timing.pick_cases`).
        time_plans: ``plans -> PlanTimes``, the candidates' steps timed interleaved
            (:func:`parity.cases.plan_timing.time_plans` on the case's model and batch); needed for whole plans.

    Raises:
        jaxremat.spec.planner.NoPlanFits: no plan of the space is predicted to fit the (offset) budget.
        ValueError: a family without a planner chain, or ``none`` without a measured peak.
    """
    measured_none = ref.memory.peak_activation_bytes if ref.memory is not None else None
    if not measured_none:
        raise ValueError("none's peak activation bytes were not measured; a budget plan needs them")
    fw = get_framework(framework)
    if policies is None:
        policies = fw.default_menu()
    whole = cost == "time" and fw.info.time_cost == "plans"
    if whole and time_plans is None:
        raise ValueError(f"{fw.info.label} times whole candidate plans for cost 'time': pass time_plans")
    chain = fw.planner_chain(cfg, batch, seq, tuple(policies), "flops" if whole else cost)
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
            plan, pred = (timed_choice(request, chain, n, target, min_checkpoint_length, time_plans) if whole
                          else choose_plan(request, chain, n, target, min_checkpoint_length, cost))
        except NoPlanFits as exc:
            if not attempts:
                plan, pred = _least_peak(request, chain, n, exc, min_checkpoint_length, cost)
                res = run(plan)
                measured = res.memory.peak_activation_bytes
                if measured is None or measured > budget:
                    raise _no_fit(request, budget, measured_none, offset, plan, pred, measured) from None
                last = (plan, res)
                attempts.append({"plan": plan.name, "target_bytes": int(target), **pred,
                                 "measured_peak_activation_bytes": measured, "within_budget": True,
                                 "note": "no plan was predicted to fit the budget less none's offset; the plan of "
                                         "least predicted peak ran and measured within the budget"})
                break
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
    times = times_table(chain["option_times"]) if "option_times" in chain else None
    return Resolution(last[0], last[1], budget, tuple(attempts), none_offset, cost, times)
