"""Plans timed against each other as whole training steps: paired ratios, and the fastest plan chosen.

Two plans' step times measured in separate runs do not compare: each carries the load of its own moment,
and the ratio of two ratios to ``none`` has a spread as wide as both ranges allow. Here the plans' compiled
(JAX) or eager (PyTorch) training steps are timed interleaved in one run, through the framework door
(:meth:`parity.runners.framework.Framework.time_steps`: process CPU time, every plan once per round, the order
rotated), so that the ratio of two plans is the median of their per-round ratios with its real [min-max]
(:func:`parity.checks.timing.ratio_spread`). The 1-minute load average is read before and after.

:func:`fastest` is the choice rule among candidates: the candidate of least median paired ratio to the
model's choice, when that ratio is below 1 beyond its noise (:attr:`parity.checks.timing.RatioSpread.noise`);
otherwise the model's choice (a ratio marked noise decides nothing).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Mapping, Sequence

from parity.checks.timing import RatioSpread, load_average_1min, ratio_spread
from parity.runners.framework import get_framework

__all__ = ["PAIRED_ROUNDS", "PlanTimes", "fastest", "time_plans"]

PAIRED_ROUNDS = 7
"""Interleaved rounds of a paired comparison (medians over these)."""


@dataclasses.dataclass(frozen=True)
class PlanTimes:
    """Plans' step times from one interleaved run.

    Attributes:
        times_s: ``{plan name: (seconds per step, one per round)}``, rounds aligned across plans.
        load_1min: the 1-minute load average before and after the run (None where the platform has none).
    """

    times_s: Mapping[str, tuple]
    load_1min: tuple = (None, None)

    @property
    def rounds(self) -> int:
        """Rounds per plan."""
        return len(next(iter(self.times_s.values()))) if self.times_s else 0

    def ratio(self, name: str, reference: str) -> RatioSpread:
        """``name``'s step time over ``reference``'s, paired per round. Raises KeyError: a plan not timed here."""
        return ratio_spread(self.times_s[name], self.times_s[reference])

    def step_ms(self, name: str) -> list[float]:
        """``[median, min, max]`` of ``name``'s step time over rounds (ms)."""
        t = self.times_s[name]
        return [1e3 * statistics.median(t), 1e3 * min(t), 1e3 * max(t)]

    def as_dict(self) -> dict:
        """``{"rounds", "load_1min", "step_ms": {plan: [median, min, max]}}`` for a JSON report."""
        return {"rounds": self.rounds, "load_1min": list(self.load_1min),
                "step_ms": {n: self.step_ms(n) for n in self.times_s}}


def time_plans(framework: str, cfg, params, tokens, plans: Sequence, rounds: int = PAIRED_ROUNDS) -> PlanTimes:
    """Time ``plans`` (:class:`jaxremat.spec.plan.RematPlan` s, distinct names) interleaved in ``framework``.

    Args:
        framework: a name of :data:`parity.runners.framework.FRAMEWORKS`.
        cfg, params, tokens: the model, its canonical parameters and a ``(B, T+1)`` token batch.
        plans: the plans to time.
        rounds: interleaved rounds (>= 1).

    Raises:
        ValueError: no plans, two plans of one name, or fewer than one round.
    """
    names = [p.name for p in plans]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"time_plans needs plans of distinct names, got {names}")
    before = load_average_1min()
    got = get_framework(framework).time_steps(cfg, params, tokens, list(plans), rounds)
    return PlanTimes({n: tuple(got[n]) for n in names}, (before, load_average_1min()))


def fastest(times: PlanTimes, model_choice: str, names: Sequence[str] | None = None) -> tuple[str, str]:
    """``(plan name, why)``: the fastest of ``names`` (default: every plan timed) by median paired ratio to
    ``model_choice``, if it is faster beyond the noise; else ``model_choice`` (module docstring).

    Raises:
        KeyError: ``model_choice`` or a name was not timed.
    """
    others = [n for n in (names if names is not None else times.times_s) if n != model_choice]
    if not others:
        return model_choice, "the only candidate"
    best = min(others, key=lambda n: times.ratio(n, model_choice).median)
    r = times.ratio(best, model_choice)
    if r.median < 1 and not r.noise:
        return best, f"measured faster than the model's choice {model_choice}: {r.text(3)}"
    if r.median < 1:
        return model_choice, f"the fastest, {best}, at {r.text(3)} of it: noise decides nothing; the model's choice"
    return model_choice, f"measured fastest of {len(others) + 1} candidates (the next, {best}: {r.text(3)})"
