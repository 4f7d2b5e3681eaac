"""The analytic chain model of remat cost (Chen et al. 2016, arXiv:1604.06174, section 4).

The unit is one block's worth of saved activation (Chen et al.'s "one layer"). A segment keeps
its input (its boundary, 1 unit) until its backward pass is done; a segment that is not
checkpointed also keeps one unit per block from its forward pass; a checkpointed segment
recomputes its blocks' units during its backward pass and frees them after it. The peak is the
largest number of live units at any moment of the step. During the backward pass of segment j
(0-based, boundaries of segments 0..j still live) it is

    (j + 1) + length_j + (units of the non-checkpointed segments below j),

so for ``s`` equal checkpointed segments the peak is ``s + N/s``, minimal at ``s = sqrt(N)``
where it equals ``2 * sqrt(N)`` (64 blocks, 8 segments: 16). ``none`` is one segment of N blocks,
``N + 1`` units. The model cannot see inside a block, so ``full`` (N segments of one block) also
reads ``N + 1``: per-block savings need a per-tensor account, not this model.

A policy that keeps everything (``save_everything``, JAX ``everything_saveable``) turns every
checkpointed segment back into a plain one: nothing is recomputed and every unit is kept, so
``peak_units`` and ``recomputed_blocks`` take an optional policy and read as for ``none`` under
it. Other policies keep part of each block and still re-run it; the unit model counts those
blocks as recomputed.

Segment plans (:class:`jaxremat.spec.segment_plan.SegmentPlan`): each checkpointed segment
follows its own policy (or the given one where it names none); a segment whose policy keeps
everything counts as stored, and neighbouring stored segments count as one (one boundary), so
``plan(2+save_everything,2:store)`` reads as ``none``.

Nested schedules: while checkpointed outer segment j is recomputed and run backward under its
inner schedule, the live units are the j outer boundaries below it, the units kept below, and
the inner chain's own peak over the segment's length (whose first boundary is segment j's input):
``j + kept_below + peak_units(length_j, inner)``.
"""

from __future__ import annotations

import dataclasses

from .schedules import NoRemat, Schedule, SegmentPlan


def _keeps_everything(policy) -> bool:
    return policy is not None and getattr(policy, "save_everything", False)


def _effective_segments(n_layer: int, schedule: Schedule, policy) -> tuple:
    """The segments as the unit model sees them: a checkpointed segment whose policy keeps
    everything is stored; neighbouring stored segments (no inner schedule) are merged."""
    segs = schedule.segments_for(n_layer)  # the schedule must resolve at this depth, whatever the policy
    if not isinstance(schedule, SegmentPlan):
        return NoRemat().segments_for(n_layer) if _keeps_everything(policy) else segs
    out: list = []
    for seg in segs:
        own = seg.policy if seg.policy is not None else policy
        stored = not seg.checkpointed or _keeps_everything(own)
        if stored and out and not out[-1].checkpointed:
            out[-1] = dataclasses.replace(out[-1], stop=seg.stop)
        else:
            out.append(dataclasses.replace(seg, checkpointed=not stored, policy=None))
    return tuple(out)


def peak_units(n_layer: int, schedule: Schedule, policy=None) -> int:
    """Peak live activation units of one training step under ``schedule`` at depth N.

    Example: ``peak_units(64, segments(8)) == 16``; ``peak_units(64, none) == 65``.

    Args:
        n_layer: depth N.
        schedule: the remat schedule.
        policy: optional :class:`jaxremat.spec.policies.Policy`; ``save_everything`` keeps every
            unit, as ``none`` does (``N + 1``). Other policies do not change the unit count. For
            a segment plan, the default of the segments that name no policy of their own.

    Raises:
        ValueError: ``n_layer < 1`` or the schedule is invalid for this depth.
    """
    segs = _effective_segments(n_layer, schedule, policy)
    kept_below = 0  # units kept from the forward pass by non-checkpointed segments below j
    peak = 0
    for j, seg in enumerate(segs):
        inner_peak = seg.length + 1 if seg.inner is None else peak_units(seg.length, seg.inner)
        peak = max(peak, j + inner_peak + kept_below)
        if not seg.checkpointed:
            kept_below += seg.length
    return max(peak, len(segs) + kept_below)  # the end of the forward pass


def recomputed_blocks(n_layer: int, schedule: Schedule, policy=None) -> int:
    """Block forwards recomputed per training step: the blocks of every checkpointed segment.

    Nested: each checkpointed outer segment's blocks once, plus the inner schedule's recomputes
    within it (blocks of inner checkpointed segments run a third time). Under a policy that keeps
    everything (``save_everything``) nothing is recomputed: 0; in a segment plan, the segments
    whose own policy (or ``policy``, where they name none) keeps everything recompute nothing.

    Raises:
        ValueError: ``n_layer < 1`` or the schedule is invalid for this depth.
    """
    total = 0
    for s in _effective_segments(n_layer, schedule, policy):
        if s.checkpointed:
            total += s.length + (0 if s.inner is None else recomputed_blocks(s.length, s.inner))
    return total


def stored_boundaries(n_layer: int, schedule: Schedule) -> int:
    """Segment inputs kept through the forward pass (one per segment)."""
    return len(schedule.segments_for(n_layer))
