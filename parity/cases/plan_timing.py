"""Plans timed against each other as whole training steps: paired ratios, and the fastest plan chosen.

Two plans' step times measured in separate runs do not compare: each carries the load of its own moment,
and the ratio of two ratios to ``none`` has a spread as wide as both ranges allow. Here the plans' compiled
(JAX) or eager (PyTorch) training steps are timed interleaved in one run, through the framework door
(:meth:`parity.runners.framework.Framework.time_steps`: process CPU time, every plan once per round, the order
rotated), so that the ratio of two plans is the median of their per-round ratios with its real [min-max]
(:func:`parity.checks.timing.ratio_spread`). The 1-minute load average is read before and after.

:func:`pick` is the choice rule among candidates that fit, the same for the planner's case and the uniform case:
the candidates in a fixed order, fewest recompute FLOPs first (then by name); the first is the incumbent, and a
later candidate replaces the incumbent only when its paired ratio to it is below 1 in every round (the whole
[min-max] below 1, over two rounds at least) and by more than its spread (:func:`beyond_noise`, a gain beyond the
noise; the same test :func:`parity.cli.plan_choice.choose` applies to the planner's plan against the uniform
plan). Otherwise the order
decides. Rounds are aligned, so "faster in every round" is transitive: the plan picked is faster than the
least-FLOPs candidate in every round, or is that candidate. :func:`pick_cases` applies the rule to both cases on
one run's measurements: the uniform case's candidates first, then the planner's own candidates beside the uniform
case's pick only, so that the two picks never rank two plans in opposite orders. What a choice *claims* is the paired comparison of the planner's plan
with the uniform plan (:func:`parity.cli.plan_choice.paired_times`).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Mapping, Sequence

from parity.checks.timing import RatioSpread, load_average_1min, ratio_spread
from parity.runners.framework import get_framework

__all__ = ["KEPT", "MIN_SAMPLE_S", "PAIRED_ROUNDS", "PlanTimes", "REPLACED", "TimedPick", "beyond_noise", "pick",
           "pick_cases", "spread_text", "time_plans"]

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


REPLACED = "fastest beyond noise"
""":attr:`TimedPick.rule` where a candidate replaced the least-FLOPs one (:func:`beyond_noise`)."""
KEPT = "noise: least FLOPs kept"
""":attr:`TimedPick.rule` where no candidate was faster than the incumbent beyond the noise."""


def spread_text(ratio: RatioSpread) -> str:
    """``0.930x [0.850-0.980]``: the median and [min-max], with no ``noise`` mark (a choice says its own rule)."""
    return f"{ratio.median:.3f}x [{ratio.low:.3f}-{ratio.high:.3f}]"


def beyond_noise(ratio: RatioSpread) -> bool:
    """A gain beyond the noise: the paired ratio's whole [min-max] below 1 (faster in every round, over two rounds
    at least: one round has no spread to judge by) and not marked noise (its spread no wider than its distance
    from 1, :attr:`parity.checks.timing.RatioSpread.noise`), so that no ratio a report shows as noise decides a
    choice."""
    return ratio.rounds >= 2 and ratio.high < 1 and not ratio.noise


@dataclasses.dataclass(frozen=True)
class TimedPick:
    """A plan picked among candidates timed whole (:func:`pick`).

    Attributes:
        plan: the plan's name.
        rule: :data:`REPLACED`, :data:`KEPT`, or ``"the only candidate"``.
        reason: a sentence with the ratio it rests on.
        ratio: the plan's paired ratio to the least-FLOPs candidate (None when the plan is that candidate); with
            :data:`KEPT`, the ratio of the candidate of least median to it (the gain not taken), else None.
    """

    plan: str
    rule: str
    reason: str
    ratio: RatioSpread | None = None


def pick(times: PlanTimes, candidates: Sequence[tuple[str, float]]) -> TimedPick:
    """The plan of ``candidates`` (``(name, recompute FLOPs)``, each timed in ``times``) by the rule of the module
    docstring: in order of fewest FLOPs then name, a candidate replaces the incumbent only when faster than it in
    every paired round.

    Raises:
        ValueError: no candidates. KeyError: a candidate was not timed.
    """
    order = [n for _, n in sorted({(float(f), n) for n, f in candidates})]
    if not order:
        raise ValueError("pick needs at least one candidate")
    least = incumbent = order[0]
    if len(order) == 1:
        return TimedPick(least, "the only candidate", f"the only candidate ({least})")
    for name in order[1:]:
        if beyond_noise(times.ratio(name, incumbent)):
            incumbent = name
    if incumbent != least:
        r = times.ratio(incumbent, least)
        return TimedPick(incumbent, REPLACED, f"{REPLACED}: {incumbent} {spread_text(r)} of the least-FLOPs candidate "
                         f"{least}, faster in every one of {r.rounds} paired rounds, beyond the noise", r)
    best = min(order[1:], key=lambda n: (times.ratio(n, least).median, n))
    r = times.ratio(best, least)
    return TimedPick(least, KEPT, f"{KEPT}: {least}; no candidate of {len(order)} faster beyond the noise "
                     f"(the least median, {best}: {spread_text(r)})", r)


def pick_cases(times: PlanTimes, planner: Sequence[tuple[str, float]],
               uniform: Sequence[tuple[str, float]]) -> dict[str, TimedPick]:
    """``{"best_uniform": pick, "budget": pick}`` on one run's ``times`` (module docstring): the uniform case's
    pick among ``uniform``, then the planner's among its candidates that are not uniform ones and the uniform pick.

    Raises:
        ValueError: no uniform candidate. KeyError: a candidate was not timed.
    """
    u = pick(times, uniform)
    names = {n for n, _ in uniform}
    own = [(n, f) for n, f in planner if n not in names]
    if not own:
        return {"best_uniform": u, "budget": u}
    flops = dict(uniform)
    return {"best_uniform": u, "budget": pick(times, [*own, (u.plan, flops[u.plan])])}
