"""Rematerialization schedules over a chain of N blocks, declared once for both frameworks.

A schedule says which block inputs survive the forward pass. It is a frozen, hashable value that
knows nothing of JAX or PyTorch; :meth:`Schedule.segments_for` resolves it, for a depth N, into
contiguous :class:`Segment` s. A *checkpointed* segment keeps only its input (the boundary) during
the forward pass and recomputes its interior during the backward pass; a segment that is not
checkpointed keeps everything, as without remat. A segment plan, ``plan(...)``, lists its
segments explicitly, each with its own length and policy (:mod:`jaxremat.spec.segment_plan`).

The grammar helpers (``split_call``, ``plain_int``, ``split_top``) live in
:mod:`jaxremat.spec.grammar` and are imported here as before.

Source: Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", arXiv:1604.06174;
PyTorch's ``torch.utils.checkpoint.checkpoint_sequential`` for the ``segments(s)`` split.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Union

from .grammar import plain_int, split_call, split_top
from .segment_plan import PLAN_GRAMMAR, PlanSegment, Segment, SegmentPlan, parse_segment_plan, segment_plan


def _check_int(name: str, value, low: int, high: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {low}{high}, got {value!r} ({type(value).__name__})")
    if value < low:
        raise ValueError(f"{name} must be an integer >= {low}{high}, got {value}")


def _check_depth(n_layer) -> None:
    _check_int("n_layer", n_layer, 1)


def _uniform(n_layer: int, k: int, checkpointed: bool = True) -> tuple[Segment, ...]:
    """Segments of ``k`` blocks from the bottom up; the last one holds the remainder ``N mod k``."""
    return tuple(Segment(a, min(a + k, n_layer), checkpointed) for a in range(0, n_layer, k))


@dataclasses.dataclass(frozen=True)
class NoRemat:
    """``none``: store every activation; nothing is recomputed. One segment, not checkpointed."""

    name = "none"

    def segments_for(self, n_layer: int) -> tuple[Segment, ...]:
        _check_depth(n_layer)
        return (Segment(0, n_layer, False),)


@dataclasses.dataclass(frozen=True)
class Full:
    """``full``: checkpoint every block (``every_k(1)``): N segments of one block each."""

    name = "full"

    def segments_for(self, n_layer: int) -> tuple[Segment, ...]:
        _check_depth(n_layer)
        return _uniform(n_layer, 1)


@dataclasses.dataclass(frozen=True)
class EveryK:
    """``every_k(k)``: checkpointed segments of ``k`` blocks from the bottom of the stack.

    Rounding: ``ceil(N / k)`` segments; when ``k`` does not divide N the last (top) segment holds
    the remaining ``N mod k`` blocks. ``k >= N`` gives a single checkpointed segment of N blocks.

    Raises:
        ValueError: ``k`` is not an integer >= 1.
    """

    k: int

    def __post_init__(self) -> None:
        _check_int("every_k: k (blocks per segment)", self.k, 1)

    @property
    def name(self) -> str:
        return f"every_k({self.k})"

    def segments_for(self, n_layer: int) -> tuple[Segment, ...]:
        _check_depth(n_layer)
        return _uniform(n_layer, self.k)


@dataclasses.dataclass(frozen=True)
class Segments:
    """``segments(s)``: ``s`` contiguous segments split exactly as ``checkpoint_sequential`` does.

    Rounding (PyTorch ``torch.utils.checkpoint.checkpoint_sequential``): the first ``s - 1``
    segments hold ``floor(N / s)`` blocks each and are checkpointed; the last segment holds the
    remaining ``N - (s - 1) * floor(N / s)`` blocks and is *not* checkpointed, since its backward
    pass starts right after its forward pass. ``segments(1)`` therefore equals ``none``.

    Raises:
        ValueError: ``s`` is not an integer >= 1 (at construction), or ``s > N`` (when resolved).
    """

    s: int

    def __post_init__(self) -> None:
        _check_int("segments: s (number of segments)", self.s, 1, " and <= n_layer")

    @property
    def name(self) -> str:
        return f"segments({self.s})"

    def segments_for(self, n_layer: int) -> tuple[Segment, ...]:
        _check_depth(n_layer)
        if self.s > n_layer:
            raise ValueError(
                f"segments: s (number of segments) must be in [1, n_layer] = [1, {n_layer}], got {self.s}"
            )
        size = n_layer // self.s
        out = [Segment(i * size, (i + 1) * size, True) for i in range(self.s - 1)]
        out.append(Segment((self.s - 1) * size, n_layer, False))
        return tuple(out)


@dataclasses.dataclass(frozen=True)
class Sqrt:
    """``sqrt``: ``segments(s)`` with ``s = round(sqrt(N))``, at least 2 for N >= 2 (Chen et al. 2016).

    Rounding: ``round`` to the nearest integer (``sqrt(N)`` is never exactly half-way for an
    integer N), then split as :class:`Segments` does. N = 64 gives 8 segments of 8 blocks. At
    N = 2, ``round(sqrt(2)) = 1`` would checkpoint nothing; two 1-layer segments (peak: one
    boundary and one layer, against two layers without remat) are used instead.
    """

    name = "sqrt"

    @staticmethod
    def n_segments(n_layer: int) -> int:
        """Number of segments ``round(sqrt(n_layer))``, at least ``min(2, n_layer)``."""
        _check_depth(n_layer)
        return max(min(2, n_layer), round(math.sqrt(n_layer)))

    def segments_for(self, n_layer: int) -> tuple[Segment, ...]:
        return Segments(self.n_segments(n_layer)).segments_for(n_layer)


@dataclasses.dataclass(frozen=True)
class Nested:
    """``nested(outer,inner)``: two-level checkpointing, e.g. ``nested(sqrt,sqrt)``.

    The forward pass keeps only the boundaries of ``outer``'s segments. In the backward pass each
    checkpointed outer segment is recomputed under ``inner`` (resolved over that segment's own
    length, so no divisibility is needed): the recompute keeps the inner boundaries, and each
    inner checkpointed segment is recomputed once more during its own backward pass. Blocks in
    inner checkpointed segments therefore run three times per step, others twice. Outer segments
    that are not checkpointed (the last one of ``segments``/``sqrt``) run plainly.

    Source: Chen et al. 2016, arXiv:1604.06174, section 4.2 (recursive application gives
    O(log N) memory); torch nests non-reentrant ``checkpoint`` calls, JAX nests ``jax.checkpoint``.

    Raises:
        ValueError: ``outer`` or ``inner`` is not a schedule, or is itself nested (at
            construction); ``inner`` is invalid for an outer segment's length (when resolved,
            e.g. ``segments(3)`` inside a 2-block segment).
    """

    outer: "Schedule"
    inner: "Schedule"

    def __post_init__(self) -> None:
        for role, sched in (("outer", self.outer), ("inner", self.inner)):
            if not isinstance(sched, _FLAT_SCHEDULES):
                raise ValueError(f"nested: {role} must be one of {', '.join(SCHEDULE_NAMES[:5])}, got {sched!r}")

    @property
    def name(self) -> str:
        return f"nested({self.outer.name},{self.inner.name})"

    def segments_for(self, n_layer: int) -> tuple[Segment, ...]:
        out = []
        for seg in self.outer.segments_for(n_layer):
            if seg.checkpointed:
                try:
                    self.inner.segments_for(seg.length)
                except ValueError as exc:
                    raise ValueError(
                        f"{self.name} at n_layer={n_layer}: the inner schedule does not fit the outer segment "
                        f"[{seg.start}, {seg.stop}) of {seg.length} blocks: {exc}"
                    ) from None
                seg = dataclasses.replace(seg, inner=self.inner)
            out.append(seg)
        return tuple(out)


_FLAT_SCHEDULES = (NoRemat, Full, EveryK, Segments, Sqrt)
Schedule = Union[NoRemat, Full, EveryK, Segments, Sqrt, Nested, SegmentPlan]
_ALL_SCHEDULES = (*_FLAT_SCHEDULES, Nested, SegmentPlan)

none = NoRemat()
full = Full()
sqrt = Sqrt()


def every_k(k: int) -> EveryK:
    """Checkpointed segments of ``k`` blocks; see :class:`EveryK`."""
    return EveryK(k)


def segments(s: int) -> Segments:
    """``s`` segments as ``checkpoint_sequential`` splits them; see :class:`Segments`."""
    return Segments(s)


def nested(outer: Schedule, inner: Schedule) -> Nested:
    """Two-level checkpointing; see :class:`Nested`."""
    return Nested(outer, inner)


SCHEDULE_NAMES = ("none", "full", "every_k(K)", "sqrt", "segments(S)", "nested(OUTER,INNER)", "nested", PLAN_GRAMMAR)
DEFAULT_SCHEDULES = ("none", "full", "every_k(2)", "sqrt", "segments(4)")


_PLAIN = {"none": none, "full": full, "sqrt": sqrt}


def parse_schedule(text: "str | Schedule") -> Schedule:
    """Parse a schedule name such as ``"none"``, ``"every_k(2)"``, ``"segments(4)"``,
    ``"nested(sqrt,every_k(2))"`` (``"nested"`` alone is ``nested(sqrt,sqrt)``) or a segment plan
    ``"plan(3*2+save_dots,4:store)"`` (:mod:`jaxremat.spec.segment_plan`); a schedule object is
    returned as it is.

    Parsing is strict: whitespace is allowed around parentheses and commas only; a parameter is
    ASCII digits only (``every_k(2_0)``, ``every_k(+2)``, ``every_k(２)`` are refused, not read
    as 20, 2 or 2); names are lower case.

    Raises:
        ValueError: the name is unknown (the message lists the valid names), its parameter is
            not a plain integer, a parameter is missing or given to a schedule that takes none,
            or ``text`` is neither a string nor a schedule; a bad segment plan
            (:func:`jaxremat.spec.segment_plan.parse_segment_plan`).
    """
    if isinstance(text, _ALL_SCHEDULES):
        return text
    if not isinstance(text, str):
        raise ValueError(f"a schedule is a name such as 'sqrt' or a schedule object, got {text!r} "
                         f"({type(text).__name__}); valid schedules: {', '.join(SCHEDULE_NAMES)}")
    name, arg = split_call(text, "schedule", ", ".join(SCHEDULE_NAMES))
    if name == "plan":
        return parse_segment_plan(text)
    if name in _PLAIN or (name == "nested" and arg is None):
        if arg is not None:
            raise ValueError(f"schedule {text!r}: {name} takes no parameter; write {name}")
        return _PLAIN[name] if name in _PLAIN else Nested(sqrt, sqrt)
    if name == "nested":
        parts = split_top(arg, ",")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise ValueError(f"schedule {text!r}: nested needs two schedules, e.g. nested(sqrt,sqrt)")
        return Nested(parse_schedule(parts[0]), parse_schedule(parts[1]))
    makers = {"every_k": (every_k, "every_k(2)"), "segments": (segments, "segments(4)")}
    if name in makers:
        make, example = makers[name]
        if arg is None:
            raise ValueError(f"schedule {text!r}: {name} needs a parameter, e.g. {example}")
        return make(plain_int(text, arg, example))
    raise ValueError(f"unknown schedule {text!r}; valid schedules: {', '.join(SCHEDULE_NAMES)}")
