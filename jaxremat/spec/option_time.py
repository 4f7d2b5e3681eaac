"""The planner's time cost: each block option's measured forward and backward time, framework-neutral.

The frameworks time one block option by running segments of it (:mod:`jaxremat.block_time` in JAX,
:mod:`torchref.block_time` in PyTorch): a segment of ``L`` blocks under the option (``plan(L:store)``
or ``plan(L+POLICY)``), its forward pass alone and its whole training step (forward and backward,
recompute included), for two lengths ``L1 < L2``, interleaved over several rounds. This module turns
those samples into per-block costs and hands them to the planner
(:func:`jaxremat.spec.planner.plan_for_budget` with ``cost="time"``):

* per round, the slope of a segment's time against its length is the time of one block
  (``forward``, ``step``; ``backward = step - forward``: the backward pass with its recompute), and
  the intercept of the step time is what a segment costs once (its loop, its checkpoint call);
* the cost of an option is the median over rounds (slopes and intercepts below 0, which noise can
  give, count as 0), with the [min-max] of the rounds beside it.

No framework is imported here.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Hashable, Mapping, Sequence

from .planner import BlockOption
from .policies import parse_policy
from .segment_plan import PlanSegment, SegmentPlan

__all__ = ["DEFAULT_LENGTHS", "DEFAULT_ROUNDS", "OptionTime", "TimeSpread", "measure_options", "option_plan", "option_time",
           "options_with_times", "time_rounds", "times_table", "timed_gpt_chain"]

DEFAULT_LENGTHS = (2, 4)
"""The two segment lengths (blocks) each option is timed at: 2, not 1, since a one-block JAX segment runs
isolated (a scan of trip count 1, inlined), unlike a block of a longer segment."""
DEFAULT_ROUNDS = 5
"""Interleaved rounds per measurement (the medians are over these)."""


@dataclasses.dataclass(frozen=True)
class TimeSpread:
    """A measured time: the median over rounds and the smallest and largest round (seconds)."""

    median_s: float
    low_s: float
    high_s: float

    @classmethod
    def of(cls, samples_s: Sequence[float]) -> "TimeSpread":
        """Median, min and max of per-round samples (seconds). Raises ValueError on no samples."""
        if not samples_s:
            raise ValueError("a time spread needs at least one sample")
        return cls(float(statistics.median(samples_s)), float(min(samples_s)), float(max(samples_s)))

    def as_ms(self) -> list[float]:
        """``[median, min, max]`` in milliseconds (for a JSON report)."""
        return [1e3 * self.median_s, 1e3 * self.low_s, 1e3 * self.high_s]


@dataclasses.dataclass(frozen=True)
class OptionTime:
    """One block option's measured times, per block (seconds, with spread over rounds).

    Attributes:
        name: the option's name in the menu (``store``, ``save_nothing``, ``save_dots``, ...).
        forward: one block's forward pass (as the training step's forward runs it).
        backward: one block's backward pass, its recompute included (step less forward).
        segment: what a segment under the option costs once in the step (the intercept).
        rounds: how many interleaved rounds the medians are over.
        lengths: the two segment lengths (blocks) timed.
    """

    name: str
    forward: TimeSpread
    backward: TimeSpread
    segment: TimeSpread
    rounds: int
    lengths: tuple

    @property
    def step_time_s(self) -> float:
        """One block's forward and backward time (seconds, >= 0): the planner's per-block cost."""
        return max(0.0, self.forward.median_s + self.backward.median_s)

    @property
    def segment_time_s(self) -> float:
        """A segment's own time (seconds, >= 0): the planner's per-segment cost."""
        return max(0.0, self.segment.median_s)

    def as_dict(self) -> dict:
        """``{"forward_ms", "backward_ms", "segment_ms": [median, min, max], "step_ms", "rounds", "lengths"}``."""
        return {"forward_ms": self.forward.as_ms(), "backward_ms": self.backward.as_ms(),
                "segment_ms": self.segment.as_ms(), "step_ms": 1e3 * self.step_time_s, "rounds": self.rounds,
                "lengths": list(self.lengths)}


def option_time(name: str, lengths: Sequence[int], forward_s: Mapping[int, Sequence[float]],
                step_s: Mapping[int, Sequence[float]]) -> OptionTime:
    """Per-block times of one option from its segments' timed rounds (module docstring).

    Args:
        name: the option's name.
        lengths: two segment lengths ``(L1, L2)``, ``1 <= L1 < L2`` (blocks).
        forward_s: per length, one forward time per round (seconds), rounds aligned across lengths.
        step_s: per length, one training-step time per round (seconds).

    Raises:
        ValueError: bad lengths, or rounds missing or of unequal counts.
    """
    l1, l2 = (int(v) for v in lengths)
    if not 1 <= l1 < l2:
        raise ValueError(f"lengths must be two block counts 1 <= L1 < L2, got {tuple(lengths)}")
    rounds = {len(d.get(n) or ()) for d in (forward_s, step_s) for n in (l1, l2)}
    if len(rounds) != 1 or 0 in rounds:
        raise ValueError(f"option {name!r}: every length needs the same number (>= 1) of forward and step rounds")
    slope = lambda d, r: (d[l2][r] - d[l1][r]) / (l2 - l1)  # noqa: E731
    n = rounds.pop()
    fwd = [slope(forward_s, r) for r in range(n)]
    step = [slope(step_s, r) for r in range(n)]
    seg = [step_s[l1][r] - l1 * step[r] for r in range(n)]
    return OptionTime(name, TimeSpread.of(fwd), TimeSpread.of([s - f for s, f in zip(step, fwd)]),
                      TimeSpread.of(seg), n, (l1, l2))


def options_with_times(options: Sequence[BlockOption], times: Mapping[str, OptionTime]) -> list[BlockOption]:
    """The menu with each option's ``step_time_s`` and ``segment_time_s`` set from its measurement.

    Raises:
        ValueError: an option of the menu has no measurement.
    """
    missing = [o.name for o in options if o.name not in times]
    if missing:
        raise ValueError(f"no measured time for options {missing}; measured: {sorted(times)}")
    return [dataclasses.replace(o, step_time_s=times[o.name].step_time_s, segment_time_s=times[o.name].segment_time_s)
            for o in options]


def times_table(times: Mapping[str, OptionTime]) -> dict:
    """``{option: OptionTime.as_dict()}`` for a JSON report."""
    return {name: t.as_dict() for name, t in times.items()}


def time_rounds(calls: Mapping[Hashable, Callable[[], object]], rounds: int = DEFAULT_ROUNDS, *,
                min_sample_s: float = 0.005, clock: Callable[[], float] = time.process_time) -> dict:
    """Time every call once per round, interleaved: ``{key: [seconds per call, one per round]}``.

    Each call runs once to warm up (compiled programs, allocator), then once more to choose how many
    calls make one sample of at least ``min_sample_s``; a round runs every key's sample, the order
    rotated every round and reversed in odd rounds, so that load falls on every key alike.

    Args:
        calls: the functions to time (each blocks until its work is done).
        rounds: samples per key (int >= 1).
        min_sample_s: the least duration of one sample (seconds).
        clock: the clock (seconds); the process's CPU time by default (``time.process_time``: on a
            shared machine the time other jobs hold the cores is left out).

    Raises:
        ValueError: no calls or fewer than one round.
    """
    if not calls or rounds < 1:
        raise ValueError(f"time_rounds needs calls and rounds >= 1, got {len(calls)} calls, {rounds} rounds")
    counts = {}
    for key, fn in calls.items():
        fn()
        t0 = clock()
        fn()
        counts[key] = max(1, math.ceil(min_sample_s / max(clock() - t0, 1e-6)))
    keys, out = list(calls), {k: [] for k in calls}
    for r in range(rounds):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for key in (order if r % 2 == 0 else order[::-1]):
            fn, n = calls[key], counts[key]
            t0 = clock()
            for _ in range(n):
                fn()
            out[key].append((clock() - t0) / n)
    return out


def measure_options(segment_calls: Callable[[str, int], tuple], names: Sequence[str], *,
                    lengths: Sequence[int] = DEFAULT_LENGTHS, rounds: int = DEFAULT_ROUNDS,
                    **kw) -> dict[str, OptionTime]:
    """Every option's :class:`OptionTime`, its segments timed interleaved with every other option's.

    Args:
        segment_calls: ``(option name, length) -> (forward, step)``: two callables running a segment of
            that many blocks under the option, its forward pass and its whole training step.
        names: the options to time.
        lengths: the two segment lengths (:data:`DEFAULT_LENGTHS`).
        rounds: interleaved rounds (:data:`DEFAULT_ROUNDS`).
        **kw: passed to :func:`time_rounds` (``min_sample_s``, ``clock``).
    """
    calls = {}
    for name in names:
        for length in lengths:
            calls[(name, length, "forward")], calls[(name, length, "step")] = segment_calls(name, length)
    got = time_rounds(calls, rounds, **kw)
    return {name: option_time(name, lengths, {n: got[(name, n, "forward")] for n in lengths},
                              {n: got[(name, n, "step")] for n in lengths}) for name in names}


def timed_gpt_chain(cfg, batch: int, seq: int, policies: Sequence, rounds: int,
                    chain_of: Callable, times_of: Callable) -> dict:
    """A GPT planner chain with every option's measured ``step_time_s`` and ``segment_time_s`` set and
    ``option_times`` (``{name: OptionTime}``) added; ``chain_of(cfg, batch, seq, policies)`` is a
    framework's ``gpt_chain`` and ``times_of(cfg, batch, seq, names, rounds=)`` its ``gpt_option_times``.

    Raises:
        ValueError: a family other than GPT (``cfg.arch``), or what ``chain_of`` raises.
    """
    if cfg.arch != "gpt":
        raise ValueError(f"timed_chain times the GPT block; cfg.arch is {cfg.arch!r}")
    chain = chain_of(cfg, batch, seq, policies)
    menu = chain["options_per_block"][0]
    times = times_of(cfg, batch, seq, [o.name for o in menu], rounds=rounds)
    return {**chain, "options_per_block": [options_with_times(menu, times)] * cfg.n_layer, "option_times": times}


def option_plan(name: str, length: int) -> SegmentPlan:
    """The one-segment plan that times block option ``name`` over ``length`` blocks: ``"store"`` keeps
    every activation (no checkpoint); any other name is a policy (``save_nothing``: recompute all).

    Raises:
        ValueError: ``name`` is not ``"store"`` nor a known policy (:func:`jaxremat.spec.policies.parse_policy`).
    """
    if name == "store":
        return SegmentPlan((PlanSegment(length, False, None),))
    p = parse_policy(name)
    return SegmentPlan((PlanSegment(length, True, None if p.saves_nothing else p),))
