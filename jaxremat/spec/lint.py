"""Plan lint, the framework-neutral part: a warning category and the checks that need no framework.

A policy that matches nothing it is meant to keep turns a selective plan into full remat, and
nothing in either framework says so: ``jax.checkpoint`` saves nothing when no value carries a
kept ``checkpoint_name`` tag (or no matrix product lacks batch dimensions, e.g. under ``jax.vmap``
over stacked parameters), and a selective checkpoint in PyTorch caches nothing when no op sits in
a kept :func:`torchref.names.activation` region. Each framework's lint (:mod:`jaxremat.lint`,
:mod:`torchref.lint`) looks at the block and warns with :class:`RematPolicyWarning`; this module
holds the category, the plan resolution both library APIs share and the message for a policy on a
schedule that checkpoints nothing.

Turn the warnings into errors with ``warnings.simplefilter("error", RematPolicyWarning)``, or
silence them with ``warnings.simplefilter("ignore", RematPolicyWarning)``.
"""

from __future__ import annotations

from typing import Any

from .plan import RematPlan, parse_plan
from .policies import Policy, parse_policy
from .schedules import SegmentPlan, parse_schedule

__all__ = ["RematPolicyWarning", "no_effect_message", "resolve_plan", "unmatched_message"]


class RematPolicyWarning(UserWarning):
    """A remat policy that will keep nothing (or less than it names) in the block it is given."""


def resolve_plan(schedule: Any, policy: Any = None) -> tuple[Any, Any]:
    """``(schedule, policy)`` from a schedule value, a schedule name, or a plan ``SCHEDULE+POLICY``.

    Args:
        schedule: a :mod:`jaxremat.spec.schedules` value, a name (``"sqrt"``, ``"every_k(2)"``),
            a plan string (``"sqrt+save_dots"``) or a :class:`jaxremat.spec.plan.RematPlan`.
        policy: the policy given separately (any form the framework accepts), or None.

    Returns:
        The schedule value and the policy: ``policy`` unchanged, or the plan's policy (a
        :class:`jaxremat.spec.policies.Policy`; None when the plan has none).

    Raises:
        ValueError: an unknown schedule or policy name, a policy given both in the plan and
            separately, or a ``schedule`` of another type (e.g. a tensor passed in its place).
            A segment plan's per-segment policies are not "in the plan" in this sense: ``policy=``
            is then the default of the segments that name none (:mod:`jaxremat.spec.plan`; the
            renderers refuse it when it reaches no segment).
    """
    if isinstance(schedule, str):
        plan = parse_plan(schedule) if "+" in schedule else None
        if plan is None:
            return parse_schedule(schedule), policy
        schedule = plan
    if isinstance(schedule, RematPlan):
        # A segment plan without a plan-wide policy takes policy= as the default of its segments
        # that name none (jaxremat.spec.plan); any other plan names its one policy.
        plan_wide = not schedule.policy.saves_nothing or not isinstance(schedule.schedule, SegmentPlan)
        if policy is not None and plan_wide:
            raise ValueError(f"plan {schedule.name!r} names a policy and policy={policy!r} was given too; "
                             "give the policy once (in the plan or as policy=)")
        if schedule.policy.saves_nothing:
            return schedule.schedule, policy
        return schedule.schedule, schedule.policy
    if not hasattr(schedule, "segments_for"):
        raise ValueError(f"schedule must be a jaxremat.spec schedule, a name such as 'sqrt' or a plan such as "
                         f"'sqrt+save_dots'; got {type(schedule).__name__} (extra arguments for the blocks go after it)")
    return schedule, policy


def no_effect_message(schedule: Any, policy: Any, n_layer: int, where: str) -> str | None:
    """The warning for a policy on a schedule that checkpoints no segment at depth N, or None.

    For nested schedules the policy acts in the inner segments: it has no effect when no inner
    segment of any checkpointed outer segment is checkpointed.

    Args:
        schedule: the schedule value.
        policy: the policy as given (None, a name, a spec Policy or a framework policy object).
        n_layer: the depth N.
        where: the calling API, for the message (``"remat_stack"``).
    """
    if policy is None or (isinstance(policy, (str, Policy)) and parse_policy(policy).saves_nothing):
        return None
    if _policy_applies(schedule, n_layer):
        return None
    name = getattr(policy, "name", None) or getattr(policy, "__name__", None) or repr(policy)
    return (f"{where}: policy {name!r} has no effect: schedule {schedule.name} checkpoints no segment at "
            f"n_layer={n_layer}, so nothing is recomputed; drop the policy or use a schedule that checkpoints "
            f"(e.g. 'full+{name}')")


def _policy_applies(schedule: Any, n_layer: int) -> bool:
    """True when some segment the policy acts in is checkpointed (for nested: an inner segment)."""
    for seg in schedule.segments_for(n_layer):
        if seg.checkpointed and (seg.inner is None or _policy_applies(seg.inner, seg.length)):
            return True
    return False


def unmatched_message(where: str, policy_name: str, missing: list[str], kept_any: bool, how_to_tag: str) -> str:
    """The warning for a policy whose named activations are not marked in the block.

    Args:
        where: the calling API.
        policy_name: the policy's name.
        missing: the kept or offloaded names the block does not mark.
        kept_any: whether the policy still keeps something else in the block.
        how_to_tag: the framework's way to mark a value (``checkpoint_name(x, name)``).
    """
    effect = ("those names keep nothing" if kept_any
              else "the policy keeps nothing: every checkpointed segment is recomputed in full (as save_nothing)")
    return (f"{where}: policy {policy_name!r} keeps {', '.join(missing)}, but the block marks no value with "
            f"{'that name' if len(missing) == 1 else 'these names'}; {effect}. Mark the values in the block "
            f"with {how_to_tag}, or choose another policy")
