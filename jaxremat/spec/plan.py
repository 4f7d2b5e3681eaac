"""A remat plan: a schedule over the block stack plus a policy inside its checkpointed segments.

Written ``SCHEDULE`` or ``SCHEDULE+POLICY``: ``sqrt``, ``full+attention_only``,
``every_k(2)+save_qkv_proj``, ``nested(sqrt,sqrt)+save_dots``. The policy applies inside every
checkpointed segment (for nested schedules: inside the innermost ones); ``save_nothing`` is the
default and is left out of the name.

Heterogeneous plans list their segments, each with its own length and policy:
``plan(3*2+save_dots,1+attention_only,4:store)`` (grammar: :mod:`jaxremat.spec.segment_plan`).
The rule when a plan-wide policy meets per-segment ones, the same in the name
(``plan(3+save_dots,5)+attention_only``) and in every renderer's ``policy=`` argument: a
segment's own policy wins; the plan-wide one is the default of the checkpointed segments that
name none. A plan-wide policy that reaches no segment -- every checkpointed segment names its
own -- is refused (ValueError: it would silently do nothing), as a policy on ``none`` is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .grammar import split_top
from .policies import POLICIES, Policy, parse_policy
from .schedules import NoRemat, Schedule, SegmentPlan, parse_schedule

__all__ = ["RematPlan", "check_default_policy", "parse_plan", "segment_policy"]


def segment_policy(segment: Any, default: Any) -> Any:
    """The policy a checkpointed segment follows: its own (:class:`jaxremat.spec.segment_plan.Segment`
    ``policy``) when it names one, else ``default`` (the plan's or the renderer's ``policy=``, in
    whatever form the renderer takes it)."""
    return default if segment.policy is None else segment.policy


def check_default_policy(segments: tuple, policy_name: "str | None", where: str) -> None:
    """Refuse a default policy that reaches no segment of a heterogeneous plan.

    Args:
        segments: the resolved segments (:meth:`jaxremat.spec.segment_plan.SegmentPlan.segments_for`).
        policy_name: the default policy's name, or None when no default that keeps anything was given.
        where: the calling API or plan, for the message.

    Raises:
        ValueError: some segment names its own policy, ``policy_name`` is given, and no
            checkpointed segment is left without one (the default would do nothing).
    """
    if policy_name is None or not any(s.policy is not None for s in segments):
        return
    if not any(s.checkpointed and s.policy is None for s in segments):
        named = sorted({s.policy.name for s in segments if s.policy is not None})
        raise ValueError(
            f"{where}: policy {policy_name!r} was given, but every checkpointed segment names its own policy "
            f"({', '.join(named)}), so it would reach no segment; drop it, or leave the segments that should "
            f"follow it without a policy (a segment's own policy wins over the default)")


@dataclasses.dataclass(frozen=True)
class RematPlan:
    """A schedule and the policy its checkpointed segments follow.

    For a :class:`jaxremat.spec.segment_plan.SegmentPlan`, ``policy`` is the default of the
    checkpointed segments that name no policy of their own (module docstring).

    Raises:
        ValueError: a policy other than ``save_nothing`` on ``none`` (nothing is checkpointed, so
            the policy would silently do nothing), or on a segment plan whose checkpointed
            segments all name their own policy (or which checkpoints nothing).
    """

    schedule: Schedule
    policy: Policy = POLICIES["save_nothing"]

    def __post_init__(self) -> None:
        if isinstance(self.schedule, NoRemat) and not self.policy.saves_nothing:
            raise ValueError(
                f"policy {self.policy.name!r} has no effect on schedule 'none' (nothing is checkpointed); "
                f"combine it with a schedule that checkpoints, e.g. 'full+{self.policy.name}'"
            )
        if isinstance(self.schedule, SegmentPlan) and not self.policy.saves_nothing:
            segs = self.schedule.segments_for(self.schedule.n_layer)
            check_default_policy(segs, self.policy.name, f"plan {self.name!r}")
            if not any(s.checkpointed for s in segs):
                raise ValueError(f"plan {self.name!r}: every segment is stored, so policy {self.policy.name!r} would "
                                 f"have no effect; checkpoint a segment or drop the policy")

    def segments_for(self, n_layer: int):
        """The schedule's segments at depth N.

        Raises:
            ValueError: the schedule does not resolve at this depth, or a policy other than
                ``save_nothing`` meets a schedule that checkpoints nothing at this depth (e.g.
                ``segments(1)``), where it would silently do nothing.
        """
        segs = self.schedule.segments_for(n_layer)
        if not self.policy.saves_nothing and not any(s.checkpointed for s in segs):
            raise ValueError(f"plan {self.name!r}: {self.schedule.name} checkpoints no segment at n_layer={n_layer}, "
                             f"so policy {self.policy.name!r} would have no effect")
        return segs

    @property
    def policies(self) -> tuple[Policy, ...]:
        """The distinct policies the checkpointed segments follow, in order of first use.

        ``(policy,)`` for a uniform schedule (also when it checkpoints nothing); for a segment
        plan each checkpointed segment's own policy, or the default where it names none (empty
        when every segment is stored).
        """
        if not isinstance(self.schedule, SegmentPlan):
            return (self.policy,)
        out: list[Policy] = []
        for s in self.schedule.segments:
            p = segment_policy(s, self.policy) if s.checkpointed else None
            if p is not None and p not in out:
                out.append(p)
        return tuple(out)

    @property
    def saves_nothing(self) -> bool:
        """True when every checkpointed segment keeps nothing but its input (no policy anywhere)."""
        return all(p.saves_nothing for p in self.policies)

    @property
    def name(self) -> str:
        """``schedule`` or ``schedule+policy`` (canonical policy name)."""
        if self.policy.name == "save_nothing":
            return self.schedule.name
        return f"{self.schedule.name}+{self.policy.name}"


def parse_plan(text: "str | RematPlan") -> RematPlan:
    """Parse ``SCHEDULE`` or ``SCHEDULE+POLICY``; see the module docstring.

    The ``+`` is found outside parentheses, so ``every_k(+2)`` is read as a schedule (and refused
    for its parameter), not split into ``every_k(`` and ``2)``, and the ``+`` of a segment plan's
    items (``plan(3+save_dots,5)``) stays inside the schedule. A RematPlan is returned as it is.

    Raises:
        ValueError: unknown schedule or policy (the messages list the valid names), a parameter
            that is not a plain integer (:func:`jaxremat.spec.parse_schedule`), more than one
            top-level ``+``, nothing after ``+``, a policy on ``none``, a bad segment plan
            (:func:`jaxremat.spec.segment_plan.parse_segment_plan`), or a plan-wide policy that
            reaches no segment of a segment plan.
    """
    if isinstance(text, RematPlan):
        return text
    if not isinstance(text, str):
        return RematPlan(parse_schedule(text))  # a Schedule object, or a clear error for anything else
    parts = split_top(text, "+")
    if len(parts) > 2:
        raise ValueError(f"plan {text!r}: more than one '+'; write SCHEDULE+POLICY, e.g. full+save_dots")
    if len(parts) == 2 and not parts[1].strip():
        raise ValueError(f"plan {text!r}: nothing after '+'; write SCHEDULE+POLICY, e.g. full+save_dots")
    policy = parse_policy(parts[1]) if len(parts) == 2 else POLICIES["save_nothing"]
    return RematPlan(parse_schedule(parts[0]), policy)
