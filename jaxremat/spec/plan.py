"""A remat plan: a schedule over the block stack plus a policy inside its checkpointed segments.

Written ``SCHEDULE`` or ``SCHEDULE+POLICY``: ``sqrt``, ``full+attention_only``,
``every_k(2)+save_qkv_proj``, ``nested(sqrt,sqrt)+save_dots``. The policy applies inside every
checkpointed segment (for nested schedules: inside the innermost ones); ``save_nothing`` is the
default and is left out of the name.
"""

from __future__ import annotations

import dataclasses

from .policies import POLICIES, Policy, parse_policy
from .schedules import NoRemat, Schedule, parse_schedule, split_top


@dataclasses.dataclass(frozen=True)
class RematPlan:
    """A schedule and the policy its checkpointed segments follow.

    Raises:
        ValueError: a policy other than ``save_nothing`` on ``none`` (nothing is checkpointed, so
            the policy would silently do nothing).
    """

    schedule: Schedule
    policy: Policy = POLICIES["save_nothing"]

    def __post_init__(self) -> None:
        if isinstance(self.schedule, NoRemat) and not self.policy.saves_nothing:
            raise ValueError(
                f"policy {self.policy.name!r} has no effect on schedule 'none' (nothing is checkpointed); "
                f"combine it with a schedule that checkpoints, e.g. 'full+{self.policy.name}'"
            )

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
    def name(self) -> str:
        """``schedule`` or ``schedule+policy`` (canonical policy name)."""
        if self.policy.name == "save_nothing":
            return self.schedule.name
        return f"{self.schedule.name}+{self.policy.name}"


def parse_plan(text: "str | RematPlan") -> RematPlan:
    """Parse ``SCHEDULE`` or ``SCHEDULE+POLICY``; see the module docstring.

    The ``+`` is found outside parentheses, so ``every_k(+2)`` is read as a schedule (and refused
    for its parameter), not split into ``every_k(`` and ``2)``. A RematPlan is returned as it is.

    Raises:
        ValueError: unknown schedule or policy (the messages list the valid names), a parameter
            that is not a plain integer (:func:`jaxremat.spec.parse_schedule`), more than one
            top-level ``+``, nothing after ``+``, or a policy on ``none``.
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
