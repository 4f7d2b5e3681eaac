"""What both frameworks' estimates share: the row's keys, recompute FLOPs from the planner's chain,
and the plan for a budget checked on its own estimate (imports neither JAX nor PyTorch).

The frameworks' estimate modules (:mod:`parity.runners.jax_estimate`, :mod:`parity.runners.torch_estimate`)
measure a plan abstractly (a compile from shapes; a step under fake tensors) and give one row per plan,
a dict of :data:`ROW_KEYS`. A budget is planned here, the same way for both, as
:func:`parity.cases.budget_plan.resolve` plans a measured run, on estimates instead of runs:

1. the budget in bytes: given, or a percentage of ``none``'s estimated total peak;
2. the floor: parameters, gradients and AdamW state (which no plan changes) plus the least activation
   peak the planner's chain predicts for any plan of its space; a budget under it is refused in one line;
3. the target of the planner (:func:`jaxremat.spec.planner.plan_chain`): the budget less what ``none``'s
   peak holds besides activations (the model state; in PyTorch the gradients allocated by then) and less
   ``none``'s offset (its estimated activation peak over the chain's prediction, what the
   chain leaves out: single ops' working buffers, layout copies);
4. the plan's own estimate (its compiled program, its fake-tensor step); over the budget, the target is
   lowered (by the plan's own error over its prediction when that exceeds ``none``'s offset, else to the
   plan's prediction less the overshoot) and the planner asked again, up to :data:`MAX_ATTEMPTS` times. The row of
   the last plan carries ``budget`` (the budget, whether it is met, every attempt).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from jaxremat.spec.plan import RematPlan, parse_plan
from jaxremat.spec.planner import Budget, NoPlanFits, chain_costs, min_peak_plan, parse_budget, plan_chain

from parity.report.format import fmt_bytes as format_bytes

__all__ = ["BudgetNotMet", "FLOOR_FRACTION", "MAX_ATTEMPTS", "ROW_KEYS", "add_ratios", "as_budget", "budget_row",
           "chain_policies", "check_reachable", "fmt_bytes", "plan_within_budget", "recompute_flops", "state_bytes"]

MAX_ATTEMPTS = 4
"""Plans estimated for one budget before the last is reported (module docstring, step 4)."""

ROW_KEYS = ("framework", "plan", "parameters_bytes", "gradients_bytes", "adamw_state_bytes",
            "activation_peak_bytes", "total_peak_bytes", "ratio_to_none", "recompute_flops", "backend",
            "compile_time_s")
"""The keys of one estimate row (bytes, FLOPs, seconds). ``activation_peak_bytes`` is the peak less
the model state it holds; ``total_peak_bytes`` the whole step's peak with parameters, gradients and
AdamW state resident; ``ratio_to_none`` the total's ratio to ``none``'s; ``recompute_flops`` None where
the planner's chain cannot cost the plan; ``compile_time_s`` the seconds the estimate took (JAX: lower
and compile; PyTorch: the fake-tensor step). A budget plan's row adds ``budget``."""


def as_budget(budget: "int | str | Budget") -> Budget:
    """A :class:`jaxremat.spec.planner.Budget` from bytes (int), ``"24GiB"`` / ``"50%"``, or a Budget.

    Raises:
        ValueError: a bad text (:func:`jaxremat.spec.planner.parse_budget`) or bytes < 1.
    """
    if isinstance(budget, Budget):
        return budget
    if isinstance(budget, int) and not isinstance(budget, bool):
        if budget < 1:
            raise ValueError(f"budget must be at least one byte, got {budget}")
        return Budget(f"{budget}B", bytes=budget)
    return parse_budget(budget)


def state_bytes(row: dict) -> int:
    """Parameters, gradients and AdamW state of a row: what no plan changes (bytes)."""
    return int(row["parameters_bytes"] + row["gradients_bytes"] + row["adamw_state_bytes"])


def chain_policies(plans, menu=()) -> tuple:
    """``menu`` plus every policy the checkpointing plans use (``save_nothing`` for a plain checkpoint),
    deduplicated; offloading policies and ``save_everything`` are left out (no chain costs them)."""
    names = list(menu)
    for plan in plans:
        plan = parse_plan(plan)
        if plan.name == "none":
            continue
        for p in [plan.policy, *(s.policy for s in getattr(plan.schedule, "segments", ()) if s.policy is not None)]:
            if p.name not in names and not p.offloaded_names and not p.save_everything:
                names.append(p.name)
    return tuple(names)


def recompute_flops(chain: dict, plan: RematPlan, n_layer: int) -> float | None:
    """The recompute FLOPs of ``plan`` by the chain's per-block menus (None for a nested schedule or a
    policy outside the menu)."""
    options = [o.name for o in chain["options_per_block"][0]]
    try:
        segs = plan.segments_for(n_layer)
    except ValueError:
        return None
    pairs = []
    for s in segs:
        if s.inner is not None:
            return None
        name = (s.policy or plan.policy).name if s.checkpointed else "store"
        if name not in options:
            return None
        pairs.append((s.length, name))
    return float(chain_costs(chain["options_per_block"], pairs, chain["boundary_bytes"], chain["invariant_bytes"])[1])


def add_ratios(rows: list[dict]) -> list[dict]:
    """Fill ``ratio_to_none`` (total peak over ``none``'s) in place; returns ``rows``."""
    ref = next((r["total_peak_bytes"] for r in rows if r["plan"] == "none"), None)
    for r in rows:
        r["ratio_to_none"] = r["total_peak_bytes"] / ref if ref else None
    return rows


def fmt_bytes(n: float) -> str:
    """``n`` bytes for a message, two decimals: ``512 B``, ``3.20 MiB``, ``24.00 GiB``."""
    return format_bytes(n, digits=2)


FLOOR_FRACTION = 0.5
"""The share of the chain's least predicted activation peak the pre-compile floor counts on. The chain
model leaves out single ops' working buffers and XLA's buffer reuse: the least activation peak estimated
for any plan was 0.70x to 1.03x the chain's least prediction (JAX and PyTorch, gpt2-124m and gpt-1.3b,
docs/real-sizes.md), so half of it is a floor no plan goes under by a wide margin."""


def check_reachable(budget_bytes: int, state: int, chain: dict, framework: str, *, gradients_bytes: int = 0,
                    min_checkpoint_length: int = 1, what: str = "") -> None:
    """Refuse, before any compile, a budget under the floor: no plan's total peak is below ``state``
    (parameters, gradients, AdamW state: all held once the backward pass ends), nor below the state held
    during the backward pass plus :data:`FLOOR_FRACTION` of the least activation peak the planner's chain
    predicts (the tensors outside the stack included).

    Args:
        budget_bytes: the budget (bytes).
        state: parameters + gradients + AdamW state (bytes).
        chain: the planner's chain.
        framework: for the message.
        gradients_bytes: gradients that may still be unallocated at the activation peak (PyTorch allocates
            them during the backward pass: pass their bytes; JAX's compiled peak holds them: 0).
        min_checkpoint_length: as :func:`jaxremat.spec.planner.plan_for_budget`.
        what: the budget as the user wrote it, for the message.

    Raises:
        ValueError: one line with the floor and its parts.
    """
    least, plan = min_peak_plan(chain["options_per_block"], chain["boundary_bytes"], chain["invariant_bytes"],
                                min_checkpoint_length=min_checkpoint_length)
    least += int(chain["fixed_bytes"])
    floor = max(state, state - gradients_bytes + int(FLOOR_FRACTION * least))
    if budget_bytes < floor:
        raise ValueError(f"budget {what or fmt_bytes(budget_bytes)} is below anything a plan reaches in {framework}: "
                         f"parameters, gradients and AdamW state take {fmt_bytes(state)} and the least activation "
                         f"peak the planner predicts is {fmt_bytes(least)} ({plan.name}); no plan comes near "
                         f"{fmt_bytes(floor)}: raise the budget or shrink the batch or sequence")


class BudgetNotMet(ValueError):
    """No plan the planner chose was estimated within the budget.

    Attributes:
        row: the row of the plan estimated lowest, with ``budget`` (``within_budget`` False).
        rows: every row of the call that raised it, that one last (:func:`budget_row` fills it), for
            the table a command still prints.
    """

    def __init__(self, message: str, row: dict):
        super().__init__(message)
        self.row = row
        self.rows: list[dict] = [row]


def budget_row(rows: list[dict], plan: Callable[[], dict]) -> dict:
    """``plan()`` (a :func:`plan_within_budget` call); a :class:`BudgetNotMet` it raises leaves with ``rows``
    (ratios filled) followed by its row."""
    try:
        return plan()
    except BudgetNotMet as exc:
        exc.rows = add_ratios([*rows, exc.row])
        raise


@dataclasses.dataclass
class _Attempt:
    plan: str
    target_bytes: int
    predicted_activation_bytes: int
    total_peak_bytes: int
    within_budget: bool


def plan_within_budget(budget: "int | str | Budget", none_row: dict, chain: dict, n_layer: int,
                       measure: Callable[[RematPlan], dict], framework: str, *, gradients_bytes: int = 0,
                       min_checkpoint_length: int = 1) -> dict:
    """The planner's plan for ``budget``, checked on its own estimate (module docstring).

    Args:
        budget: bytes, ``"24GiB"``, ``"50%"`` (of ``none``'s total peak) or a Budget.
        none_row: ``none``'s estimate row.
        chain: the planner's chain at this shape (``jaxremat.planner.model_chain`` or
            ``torchref.planner.model_chain``'s dict).
        n_layer: N.
        measure: ``plan -> row``, the framework's estimate of one plan.
        framework: ``"jax"`` or ``"torch"``, for messages.
        gradients_bytes: as :func:`check_reachable`.
        min_checkpoint_length: as :func:`jaxremat.spec.planner.plan_for_budget`.

    Returns:
        The row of the plan within the budget, with ``budget``: ``{"budget": text, "budget_bytes",
        "within_budget", "attempts": [{"plan", "target_bytes", "predicted_activation_bytes",
        "total_peak_bytes", "within_budget"}, ...]}``.

    Raises:
        ValueError: the budget is below the floor (:func:`check_reachable`), before any estimate.
        BudgetNotMet: no attempt was estimated within the budget (a ValueError; its ``row`` is the
            lowest attempt's, for the table).
    """
    b = as_budget(budget)
    budget_bytes = b.resolve(none_row["total_peak_bytes"])
    text = b.text + (f" ({fmt_bytes(budget_bytes)})" if b.fraction is not None else "")
    check_reachable(budget_bytes, state_bytes(none_row), chain, framework, min_checkpoint_length=min_checkpoint_length,
                    gradients_bytes=gradients_bytes, what=text)
    held = int(none_row["total_peak_bytes"] - none_row["activation_peak_bytes"])  # what none's peak holds besides
    opts, bnd, inv = chain["options_per_block"], chain["boundary_bytes"], chain["invariant_bytes"]
    predicted_none = int(chain["fixed_bytes"]) + chain_costs(opts, [(n_layer, "store")], bnd, inv)[0]
    offset = max(0, int(none_row["activation_peak_bytes"]) - predicted_none)
    target = budget_bytes - held - offset
    attempts: list[_Attempt] = []
    rows: list[dict] = []
    for _ in range(MAX_ATTEMPTS):
        try:
            res = plan_chain(chain, max(0, target), min_checkpoint_length=min_checkpoint_length)
            segment_plan, predicted = res.plan, res.peak_bytes
        except NoPlanFits as exc:  # the target is under the chain's least: try the least-peak plan, once
            segment_plan, predicted = exc.min_peak_plan, exc.min_peak_bytes
        plan = RematPlan(segment_plan)
        if any(a.plan == plan.name for a in attempts):
            break  # the lowered target chose a plan already estimated: nothing new to learn
        row = measure(plan)
        ok = row["total_peak_bytes"] <= budget_bytes
        attempts.append(_Attempt(plan.name, int(target), int(predicted), int(row["total_peak_bytes"]), ok))
        rows.append(row)
        if ok:
            break
        # as parity.cases.budget_plan.resolve: this plan's error over its prediction replaces none's offset when
        # larger, else the target goes under this plan's prediction by the overshoot
        error = int(row["total_peak_bytes"]) - held - int(predicted)
        if error > offset:
            offset, target = error, budget_bytes - held - error
        else:
            target = min(target, int(predicted)) - (int(row["total_peak_bytes"]) - budget_bytes)
    best = min(range(len(attempts)), key=lambda i: (not attempts[i].within_budget, attempts[i].total_peak_bytes))
    row = rows[best]
    row["budget"] = {"budget": b.text, "budget_bytes": int(budget_bytes), "within_budget": attempts[best].within_budget,
                     "attempts": [dataclasses.asdict(a) for a in attempts]}
    if not attempts[best].within_budget:
        raise BudgetNotMet(f"no plan was estimated within the budget {text} in {framework}: the lowest, "
                           f"{row['plan']}, reaches {fmt_bytes(row['total_peak_bytes'])} after {len(attempts)} "
                           f"attempt(s); raise the budget or shrink the batch or sequence", row)
    return row
