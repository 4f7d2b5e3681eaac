"""Plans timed against each other as whole training steps: paired ratios, and the fastest plan chosen.

Two plans' step times measured in separate runs do not compare: each carries the load of its own moment,
and the ratio of two ratios to ``none`` has a spread as wide as both ranges allow. Here the plans' compiled
(JAX) or eager (PyTorch) training steps are timed interleaved in one run, through the framework door
(:meth:`parity.runners.framework.Framework.time_steps`: process CPU time, every plan once per round, the order
rotated), so that the ratio of two plans is the median of their per-round ratios with its real [min-max]
(:func:`parity.checks.timing.ratio_spread`). The 1-minute load average is read before and after.

:func:`fastest` is the choice rule among candidates: the candidate of least median paired ratio to the
model's choice (the model's choice on a tie). A choice has to be made, and the median of paired rounds is the
best estimate there is: a gain marked noise (:attr:`parity.checks.timing.RatioSpread.noise`) is still taken,
and said to be noise. Falling back to the model's choice on noise was measured to keep, in JAX at gpt-small, the
FLOPs model's plan where every round but one put ``full+save_qkv_proj`` 5-20% faster (docs/planner.md). What a
choice *claims* is the paired comparison of the planner's plan with the uniform plan
(:func:`parity.cli.plan_choice.paired_times`), where a ratio marked noise decides nothing.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Mapping, Sequence

from parity.checks.timing import RatioSpread, load_average_1min, ratio_spread
from parity.runners.framework import get_framework

__all__ = ["MIN_SAMPLE_S", "PAIRED_ROUNDS", "PlanTimes", "fastest", "time_plans"]

PAIRED_ROUNDS = 7
"""Interleaved rounds of a paired comparison (medians over these)."""
MIN_SAMPLE_S = 0.1
"""The least CPU time of one plan's sample in a round (seconds): a gpt-small step (about 20 ms) is timed over 5
steps, which narrows the spread of the per-round ratios more than more rounds of one step would."""


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


def time_plans(framework: str, cfg, params, tokens, plans: Sequence, rounds: int = PAIRED_ROUNDS,
               min_sample_s: float = MIN_SAMPLE_S) -> PlanTimes:
    """Time ``plans`` (:class:`jaxremat.spec.plan.RematPlan` s, distinct names) interleaved in ``framework``.

    Args:
        framework: a name of :data:`parity.runners.framework.FRAMEWORKS`.
        cfg, params, tokens: the model, its canonical parameters and a ``(B, T+1)`` token batch.
        plans: the plans to time.
        rounds: interleaved rounds (>= 1).
        min_sample_s: the least CPU time of one plan's sample in a round (:data:`MIN_SAMPLE_S`).

    Raises:
        ValueError: no plans, two plans of one name, or fewer than one round.
    """
    names = [p.name for p in plans]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"time_plans needs plans of distinct names, got {names}")
    before = load_average_1min()
    got = get_framework(framework).time_steps(cfg, params, tokens, list(plans), rounds, min_sample_s)
    return PlanTimes({n: tuple(got[n]) for n in names}, (before, load_average_1min()))


def fastest(times: PlanTimes, model_choice: str, names: Sequence[str] | None = None) -> tuple[str, str]:
    """``(plan name, why)``: the plan of ``names`` (default: every plan timed) of least median paired ratio to
    ``model_choice``, the model's choice itself (ratio 1) on a tie; ``why`` gives the ratio, marked noise where its
    spread is wider than its distance from 1 (module docstring).

    Raises:
        KeyError: ``model_choice`` or a name was not timed.
    """
    others = [n for n in (names if names is not None else times.times_s) if n != model_choice]
    if not others:
        return model_choice, "the only candidate"
    best = min(others, key=lambda n: times.ratio(n, model_choice).median)
    r = times.ratio(best, model_choice)
    if r.median < 1:
        return best, f"measured fastest of {len(others) + 1} candidates: {r.text(3)} of the model's choice {model_choice}"
    return model_choice, f"the model's choice, measured fastest of {len(others) + 1} candidates (the next, {best}: {r.text(3)})"
