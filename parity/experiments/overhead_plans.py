"""The budget plans of ``scripts/bench_overhead.py --planner``, chosen as ``python -m parity plan`` chooses them.

:data:`BUDGET_PLANS` are the plans for 50% of ``none``'s predicted peak activation: the planner's (``budget``) and
the best uniform plan that fits (``best_uniform``, :func:`parity.cases.budget_plan.choose_plan`), on recompute
FLOPs or, with ``:time``, on measured time as the framework's time cost measures it
(:attr:`parity.runners.framework.FrameworkInfo.time_cost`): PyTorch's block options timed on segments
(:func:`torchref.block_time.timed_chain`), JAX's candidate plans timed whole
(:func:`parity.cases.budget_plan.timed_choice`). The benchmark's worker calls these pinned, like its steps.
"""

from __future__ import annotations

from typing import Callable, Sequence

from jaxremat.spec.option_time import times_table
from jaxremat.spec.plan import parse_plan
from jaxremat.spec.planner import chain_costs, parse_budget

from parity.cases.budget_plan import BudgetRequest, choose_plan, timed_choice
from parity.cases.plan_timing import time_plans
from parity.runners.framework import FRAMEWORKS

__all__ = ["BUDGET_PLANS", "budget_plan", "chain_cache", "choose_plans", "option_times", "plan_timer"]

BUDGET_PLANS = ("budget(50%)", "budget(50%):time", "best_uniform(50%)", "best_uniform(50%):time")
"""Plans chosen for 50% of none's predicted peak activation: the planner's (``budget``) and the best uniform plan
that fits (``best_uniform``), on recompute FLOPs or, with ``:time``, on measured time (module docstring)."""


def budget_plan(name: str, chains: Callable[[str], dict], n_layer: int, time_plans=None):
    """``(plan, predictions)``: the plan ``name`` of :data:`BUDGET_PLANS` for 50% of ``none``'s predicted peak
    activation; ``chains(cost)`` gives the chain (measured once per cost). With ``time_plans`` (a framework whose
    time cost is whole plans, :attr:`parity.runners.framework.FrameworkInfo.time_cost` ``"plans"``), a ``:time``
    plan is picked among candidates timed whole (:func:`parity.cases.budget_plan.timed_choice`), as
    ``python -m parity plan`` picks it."""
    kind, _, cost = name.partition(":")
    whole = cost == "time" and time_plans is not None
    chain = chains("flops" if whole else cost or "flops")
    none_peak, _, _ = chain_costs(chain["options_per_block"], [(n_layer, "store")], chain["boundary_bytes"],
                                  chain["invariant_bytes"])
    request = BudgetRequest(kind.split("(")[0], parse_budget("50%"))
    target = (none_peak + chain["fixed_bytes"]) // 2
    if whole:
        return timed_choice(request, chain, n_layer, target, 1, time_plans)
    return choose_plan(request, chain, n_layer, target, 1, cost or "flops")


def plan_timer(framework: str, cfg, params, tokens):
    """``plans -> PlanTimes`` (:func:`parity.cases.plan_timing.time_plans`, in the calling pinned worker) where the
    framework times whole plans for its time cost, else None; one timing per list of plans (both kinds of
    :func:`parity.cases.budget_plan.timed_choice` time the same list)."""
    if FRAMEWORKS[framework].time_cost != "plans":
        return None
    got = {}

    def timer(plans):
        key = tuple(p.name for p in plans)
        if key not in got:
            got[key] = time_plans(framework, cfg, params, tokens, plans)
        return got[key]
    return timer


def choose_plans(plans: Sequence[str], chains, n_layer: int, time_plans=None,
                 skip: Sequence[str] = ()) -> tuple[dict, dict]:
    """``({name: RematPlan}, {name: candidates})`` for the plans of ``plans`` not in ``skip`` (plain torch): budget
    plans chosen (:func:`budget_plan`), the others parsed; per budget plan chosen among candidates timed whole, the
    ``choice_reason``, ``timing`` and ``candidates`` of :func:`parity.cases.budget_plan.timed_choice`."""
    chosen, candidates = {}, {}
    for name in plans:
        if name in skip:
            continue
        if name not in BUDGET_PLANS:
            chosen[name] = parse_plan(name)
            continue
        chosen[name], pred = budget_plan(name, chains, n_layer, time_plans)
        if "candidates" in pred:
            candidates[name] = {k: pred[k] for k in ("choice_reason", "timing", "candidates")}
    return chosen, candidates


def chain_cache(model_chain, timed_chain, cfg, batch: int, seq: int) -> tuple[Callable[[str], dict], dict]:
    """``(chains, got)``: ``chains(cost)`` builds the chain of ``cost`` once (``"time"``: ``timed_chain``, else
    ``model_chain``, each ``(cfg, batch, seq) -> chain``); ``got`` holds those built, by cost."""
    got = {}

    def chains(cost: str) -> dict:
        if cost not in got:
            got[cost] = (timed_chain if cost == "time" else model_chain)(cfg, batch, seq)
        return got[cost]
    return chains, got


def option_times(chains: dict) -> dict:
    """``{"option_times": {option: ms per block, [median, min, max]}}`` where a time-cost chain was measured."""
    return {"option_times": times_table(chains["time"]["option_times"])} if "time" in chains else {}
