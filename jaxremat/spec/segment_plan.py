"""Heterogeneous plans: an explicit list of segments, each with its own length and its own policy.

A uniform schedule (``every_k(3)``, ``sqrt``) cuts the stack into segments of one rule and gives
every checkpointed segment the plan's one policy. A :class:`SegmentPlan` lists the segments
themselves, bottom of the stack first: how many blocks each holds, whether it is checkpointed or
stored (kept whole, as without remat), and the policy it follows inside, e.g. blocks 0-5
checkpointed in segments of 3 with ``save_dots``, block 6 checkpointed with ``attention_only``,
the last 4 blocks stored::

    plan(3*2+save_dots,1+attention_only,4:store)

The name grammar (``parse_plan(p.name) == p`` for every plan ``p``)::

    PLAN    := "plan(" ITEM ("," ITEM)* ")"
    ITEM    := LENGTH ["*" COUNT] ["+" POLICY | ":store"]

* ``LENGTH`` (blocks, >= 1) and ``COUNT`` (repetitions, >= 1) are ASCII digits; ``3*2`` is two
  segments of 3 blocks (``3,3`` is the same plan).
* ``+POLICY`` is any name :func:`jaxremat.spec.policies.parse_policy` reads (``save_dots``,
  ``save_names(qkv_proj,out_proj)``, a MaxText alias; the name keeps the canonical one). An item
  without one is checkpointed under the plan's default policy: ``plan(3,5)+save_dots`` gives
  both segments ``save_dots``, ``plan(3+attention_only,5)+save_dots`` gives the first
  ``attention_only`` and the second ``save_dots`` (a segment's own policy wins). ``3+save_nothing``
  names the full recompute explicitly, whatever the default.
* ``:store`` keeps the segment's activations, as ``none`` does; a policy there would do nothing and
  is refused. Neighbouring stored items are one stored run: ``2:store,2:store`` is ``4:store``.

The canonical name writes runs of equal segments as ``LENGTH*COUNT``. The lengths must sum to the
stack's depth N when the plan is resolved (:meth:`SegmentPlan.segments_for`); a plan is not cut or
padded to fit. Items are not nested (no inner schedule); use ``nested(...)`` for two levels.

:class:`Segment` (a resolved segment: blocks ``[start, stop)``) lives here too, since a
:class:`SegmentPlan` resolves to segments that carry their own policy.

Source: segment-wise checkpointing, Chen et al. 2016 (arXiv:1604.06174); per-layer choice of
what to keep, selective recomputation, Korthikanti et al. 2022 (arXiv:2205.05198, section 5).
"""

from __future__ import annotations

import dataclasses
import re

from .grammar import plain_int, split_call, split_top
from .policies import Policy, parse_policy

__all__ = ["PLAN_GRAMMAR", "PlanSegment", "Segment", "SegmentPlan", "parse_segment_plan", "segment_plan"]

PLAN_GRAMMAR = "plan(LENGTH[*COUNT][+POLICY|:store],...)"
"""The short form of the grammar, for messages and ``--help``."""

_EXAMPLE = "plan(3*2+save_dots,1+attention_only,4:store)"


@dataclasses.dataclass(frozen=True)
class Segment:
    """Blocks ``[start, stop)`` of the stack, recomputed in the backward pass when ``checkpointed``.

    ``inner`` (nested schedules only): the schedule under which a checkpointed segment's interior
    is recomputed in the backward pass, resolved over the segment's own ``length`` blocks. None
    means the interior is recomputed plainly, keeping everything until its backward pass is done.

    ``policy`` (:class:`SegmentPlan` only): the :class:`jaxremat.spec.policies.Policy` this
    checkpointed segment follows inside, in place of the plan's policy. None means the plan's
    (or the renderer's ``policy=``) policy applies.
    """

    start: int
    stop: int
    checkpointed: bool
    inner: "object | None" = None
    policy: "Policy | None" = None

    @property
    def length(self) -> int:
        """Number of blocks in the segment."""
        return self.stop - self.start


def _whole(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class PlanSegment:
    """One entry of a :class:`SegmentPlan`: ``length`` blocks, checkpointed or stored, with a policy.

    Attributes:
        length: blocks in the segment (>= 1).
        checkpointed: True: keep only the segment's input and recompute it in the backward pass;
            False: store every activation (``:store``).
        policy: what a checkpointed segment keeps inside itself (a
            :class:`jaxremat.spec.policies.Policy`; a name is parsed to its canonical Policy), or
            None for the plan's default policy.

    Raises:
        ValueError: ``length`` not an integer >= 1, ``checkpointed`` not a bool, an unknown
            policy, or a policy on a stored segment (it would do nothing).
    """

    length: int
    checkpointed: bool = True
    policy: "Policy | None" = None

    def __post_init__(self) -> None:
        _whole("plan segment length (blocks)", self.length)
        if not isinstance(self.checkpointed, bool):
            raise ValueError(f"plan segment: checkpointed must be True or False, got {self.checkpointed!r}")
        if self.policy is not None:
            object.__setattr__(self, "policy", parse_policy(self.policy))
            if not self.checkpointed:
                raise ValueError(
                    f"plan segment {self.length}:store with policy {self.policy.name!r}: a stored segment keeps "
                    f"every activation, so a policy would do nothing; write {self.length}:store, or "
                    f"{self.length}+{self.policy.name} to checkpoint it under that policy")

    @property
    def name(self) -> str:
        """``LENGTH``, ``LENGTH+POLICY`` or ``LENGTH:store``."""
        return f"{self.length}{_suffix(self)}"


def _suffix(seg: PlanSegment) -> str:
    if not seg.checkpointed:
        return ":store"
    return "" if seg.policy is None else f"+{seg.policy.name}"


def _merge_stored(items: tuple) -> tuple:
    out: list[PlanSegment] = []
    for it in items:
        if out and not it.checkpointed and not out[-1].checkpointed:
            out[-1] = PlanSegment(out[-1].length + it.length, False)
        else:
            out.append(it)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class SegmentPlan:
    """``plan(...)``: an explicit list of segments, bottom of the stack first (module docstring).

    Attributes:
        segments: the :class:`PlanSegment` s (a list is turned into a tuple; neighbouring stored
            segments are merged into one, so two spellings of one plan compare equal).

    Raises:
        ValueError: no segments, or an entry that is not a :class:`PlanSegment`.
    """

    segments: tuple

    def __post_init__(self) -> None:
        items = tuple(self.segments) if isinstance(self.segments, (list, tuple)) else None
        if not items:
            raise ValueError(f"a segment plan needs at least one segment, e.g. {_EXAMPLE}; got {self.segments!r}")
        bad = [it for it in items if not isinstance(it, PlanSegment)]
        if bad:
            raise ValueError(f"segment plan entries must be PlanSegment values (or parse the name {_EXAMPLE!r} "
                             f"with parse_plan); got {bad[0]!r}")
        object.__setattr__(self, "segments", _merge_stored(items))

    @property
    def n_layer(self) -> int:
        """The depth the plan covers: the sum of its segment lengths."""
        return sum(s.length for s in self.segments)

    @property
    def policies(self) -> tuple:
        """The distinct policies the segments name, in order of first use (None omitted)."""
        seen: list = []
        for s in self.segments:
            if s.policy is not None and s.policy not in seen:
                seen.append(s.policy)
        return tuple(seen)

    @property
    def name(self) -> str:
        """The canonical name: runs of equal segments written ``LENGTH*COUNT``."""
        runs: list[list] = []
        for s in self.segments:
            if runs and runs[-1][0] == s:
                runs[-1][1] += 1
            else:
                runs.append([s, 1])
        items = [f"{s.length}{'' if n == 1 else f'*{n}'}{_suffix(s)}" for s, n in runs]
        return f"plan({','.join(items)})"

    def segments_for(self, n_layer: int) -> tuple[Segment, ...]:
        """The plan's segments with their blocks ``[start, stop)`` and policies, at depth N.

        Raises:
            ValueError: ``n_layer`` is not an integer >= 1, or the lengths do not sum to it (the
                message gives both numbers).
        """
        _whole("n_layer", n_layer)
        if self.n_layer != n_layer:
            raise ValueError(f"{self.name}: the segment lengths sum to {self.n_layer} blocks but the stack has "
                             f"n_layer={n_layer}; make the lengths add up to {n_layer}")
        out, start = [], 0
        for s in self.segments:
            out.append(Segment(start, start + s.length, s.checkpointed, None, s.policy))
            start += s.length
        return tuple(out)


def segment_plan(*segments: PlanSegment) -> SegmentPlan:
    """A :class:`SegmentPlan` of the given segments, bottom first; see the module docstring."""
    return SegmentPlan(tuple(segments))


_ITEM = re.compile(r"\s*([^*+:]*?)\s*(?:\*\s*([^+:]*?)\s*)?(?:(\+)(.*)|(:)(.*))?", re.ASCII | re.DOTALL)


def _parse_item(text: str, item: str) -> list[PlanSegment]:
    m = _ITEM.fullmatch(item)
    length_s, count_s, plus, policy_s, colon, store_s = m.groups() if m else (None,) * 6
    if m is None or not length_s:
        raise ValueError(f"plan {text!r}: item {item.strip()!r} does not start with a length; write "
                         f"LENGTH[*COUNT][+POLICY|:store], e.g. {_EXAMPLE}")
    what = "segment plan"
    length = plain_int(text, length_s, _EXAMPLE, what)
    if count_s is not None and not count_s.strip():
        raise ValueError(f"plan {text!r}: item {item.strip()!r}: nothing after '*'; give the number of segments, "
                         f"e.g. {length}*2 (two segments of {length} blocks)")
    count = 1 if count_s is None else plain_int(text, count_s, f"{length}*2 (two segments of {length} blocks)", what)
    if length < 1 or count < 1:
        raise ValueError(f"plan {text!r}: item {item.strip()!r}: a segment holds at least 1 block and is repeated "
                         f"at least once (LENGTH >= 1, COUNT >= 1)")
    if colon:
        store, _, extra = store_s.strip().partition("+")
        if store.strip() != "store":
            raise ValueError(f"plan {text!r}: item {item.strip()!r}: after ':' write 'store' (keep the segment "
                             f"whole), e.g. 4:store")
        if extra.strip():
            raise ValueError(f"plan {text!r}: item {item.strip()!r}: a stored segment keeps every activation, so "
                             f"policy {extra.strip()!r} would do nothing; write {length}:store, or "
                             f"{length}+{extra.strip()} to checkpoint it under that policy")
        return [PlanSegment(length, False)] * count
    policy = None
    if plus:
        body, _, after = policy_s.rpartition(":")
        if _ and after.strip() == "store":
            raise ValueError(f"plan {text!r}: item {item.strip()!r}: a stored segment keeps every activation, so "
                             f"policy {body.strip()!r} would do nothing; write {length}:store, or "
                             f"{length}+{body.strip()} to checkpoint it under that policy")
        if not policy_s.strip():
            raise ValueError(f"plan {text!r}: item {item.strip()!r}: nothing after '+'; name a policy, "
                             f"e.g. {length}+save_dots")
        policy = parse_policy(policy_s.strip())
    return [PlanSegment(length, True, policy)] * count


def parse_segment_plan(text: str) -> SegmentPlan:
    """Parse ``plan(ITEM,...)``; see the module docstring for the grammar.

    Raises:
        ValueError: not of the form ``plan(...)``, an empty item, a length or count that is not a
            plain integer >= 1, an unknown policy, ``:`` followed by anything but ``store``, or a
            policy on a stored item (each message quotes the item and says how to write it).
    """
    name, args = split_call(text, "segment plan", PLAN_GRAMMAR)
    if name != "plan" or args is None:
        raise ValueError(f"a segment plan is written {PLAN_GRAMMAR}, e.g. {_EXAMPLE}; got {text!r}")
    items = split_top(args, ",")
    if any(not it.strip() for it in items):
        raise ValueError(f"plan {text!r}: empty item (two commas in a row, or a comma at an end); write "
                         f"LENGTH[*COUNT][+POLICY|:store] items separated by single commas, e.g. {_EXAMPLE}")
    return SegmentPlan(tuple(seg for it in items for seg in _parse_item(text, it)))
