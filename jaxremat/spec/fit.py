"""The framework-neutral loop that fits a stack of N alike layers to a memory budget, checked on measurements.

:func:`fit_plan` is shared by :func:`jaxremat.fit.plan_scan`, :func:`jaxremat.flax.plan_stack` (JAX: XLA's
compiled temporary bytes) and :func:`torchref.plan_blocks` (PyTorch: the step's live activation bytes):

1. the budget: bytes, or a percentage of ``none``'s measured peak (``"50%"``);
2. the least-recompute plan the planner (:func:`jaxremat.spec.planner.plan_for_budget`) predicts within
   the budget less ``none``'s measured offset from its prediction; measured; over the budget, the target
   is lowered by the overshoot and the planner asked again (:data:`MAX_ATTEMPTS`);
3. the plan's gradients against ``none``'s, byte for byte.

Imports neither JAX nor PyTorch. Source: Beaumont et al. 2019/2021 (Rotor)'s dynamic program over a chain.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from .planner import Budget, NoPlanFits, chain_costs, min_peak_plan, parse_budget, plan_for_budget
from .segment_plan import SegmentPlan

__all__ = ["FittedPlan", "MAX_ATTEMPTS", "fit_plan"]

MAX_ATTEMPTS = 4
"""Plans measured for one budget before the call gives up (a plan chosen again is not measured again: the
target is lowered by its overshoot once more)."""


@dataclasses.dataclass(frozen=True)
class FittedPlan:
    """A plan fitted to a budget and what was measured to check it.

    Attributes:
        plan: the segment plan (``remat_scan``, ``remat_stack`` and ``torchref.forward_blocks`` take it as the schedule).
        budget_bytes: the budget in bytes.
        peak_bytes: the plan's measured peak activation bytes (JAX: compiled temporary bytes of
            ``jit(grad(loss))``; PyTorch: the step's peak less parameters and gradients).
        none_peak_bytes: the same for ``none``.
        predicted_peak_bytes: the planner's prediction for the plan (bytes).
        recompute_flops: the planner's recompute FLOPs per step for the plan.
        grads_bitwise_equal: the plan's gradients have the raw bytes of ``none``'s on the given input.
        attempts: ``(plan name, target bytes, measured bytes)`` of every plan measured, in order.
    """

    plan: SegmentPlan
    budget_bytes: int
    peak_bytes: int
    none_peak_bytes: int
    predicted_peak_bytes: int
    recompute_flops: float
    grads_bitwise_equal: bool
    attempts: tuple

    @property
    def ratio(self) -> float:
        """``peak_bytes`` over ``none_peak_bytes``."""
        return self.peak_bytes / self.none_peak_bytes


def _as_budget(budget: "int | str | Budget") -> Budget:
    if isinstance(budget, Budget):
        return budget
    if isinstance(budget, (int, np.integer)) and not isinstance(budget, bool):
        if budget <= 0:
            raise ValueError(f"budget must be > 0 bytes, got {budget}")
        return Budget(f"{int(budget)}B", bytes=int(budget))
    if isinstance(budget, str):
        return parse_budget(budget)
    raise ValueError(f"budget must be bytes (int), a string such as '50%' or '2GiB', or a Budget; got {budget!r}")


def fit_plan(menu: Sequence, n_layer: int, boundary_bytes: int, budget: "int | str | Budget",
             measure: Callable[[Any], int], bitwise: Callable[[Any], bool]) -> FittedPlan:
    """The framework-neutral loop of :func:`plan_scan` and ``torchref.plan_blocks`` (module docstring, steps 2-4).

    Args:
        menu: one layer's :class:`jaxremat.spec.planner.BlockOption` menu (used for every layer).
        n_layer: N.
        boundary_bytes: bytes of one layer input.
        budget: bytes, ``"50%"`` (of ``none``'s measured peak) or ``"2GiB"``.
        measure: ``plan -> measured peak activation bytes`` (``"none"`` for the reference).
        bitwise: ``plan -> gradients bitwise equal to none's``.

    Raises:
        ValueError: a bad budget, or no plan measured within it (the least measured peak and the plan named).
    """
    b = _as_budget(budget)
    menus = [list(menu)] * n_layer
    none_peak = int(measure("none"))
    budget_bytes = b.resolve(none_peak)
    predicted_none = chain_costs(menus, [(n_layer, "store")], boundary_bytes)[0]
    target = budget_bytes - (none_peak - predicted_none)  # none's offset from the prediction, kept for every plan
    attempts, measured, best = [], {}, None
    for _ in range(16 * MAX_ATTEMPTS):  # repeats cost one planner call each, no measurement
        if len(attempts) == MAX_ATTEMPTS:
            break
        try:
            r = plan_for_budget(menus, max(0, target), boundary_bytes)
            plan, predicted, flops = r.plan, r.peak_bytes, r.recompute_flops
            floor = False
        except NoPlanFits:  # the target is under every plan's prediction: the least-peak plan, once
            predicted, plan = min_peak_plan(menus, boundary_bytes)
            flops = chain_costs(menus, [(s.length, _option(menu, s)) for s in plan.segments], boundary_bytes)[1]
            floor = True
        if plan.name in measured:  # the lowered target chose a plan already measured: lower it again, or stop
            if floor:
                break
            target -= measured[plan.name] - budget_bytes
            continue
        peak = measured[plan.name] = int(measure(plan))
        attempts.append((plan.name, int(target), peak))
        if best is None or peak < best[1]:
            best = (plan, peak, predicted, flops)
        if peak <= budget_bytes:
            return FittedPlan(plan, budget_bytes, peak, none_peak, int(predicted), float(flops), bool(bitwise(plan)),
                              tuple(attempts))
        target -= peak - budget_bytes
    raise ValueError(f"no plan was measured within the budget {b.text} ({budget_bytes} bytes; none's peak is "
                     f"{none_peak}): the least reached is {best[1]} bytes ({best[0].name}) after {len(attempts)} "
                     "plan(s); raise the budget to at least that, or make the layers keep less (a smaller batch, "
                     "a policy that keeps less)")


def _option(menu: Sequence, segment) -> str:
    """The menu option a plan segment renders (its policy's name, or ``store``)."""
    if not segment.checkpointed:
        return "store"
    name = segment.policy.name if segment.policy is not None else "save_nothing"
    return next(o.name for o in menu if o.name == name)


