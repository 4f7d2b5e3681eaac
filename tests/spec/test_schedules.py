"""Properties of the neutral schedule spec and the chain cost model."""

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxremat.spec import (
    EveryK, Segment, every_k, full, none, parse_schedule, peak_units,
    recomputed_blocks, segments, sqrt, stored_boundaries,
)

depths = st.integers(min_value=1, max_value=512)


def _schedules_for(n):
    return st.one_of(
        st.just(none), st.just(full), st.just(sqrt),
        st.integers(1, 600).map(every_k),
        st.integers(1, n).map(segments),
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=depths)
def test_segments_cover_every_layer_once(data, n):
    sched = data.draw(_schedules_for(n))
    segs = sched.segments_for(n)
    covered = [i for s in segs for i in range(s.start, s.stop)]
    assert covered == list(range(n))
    assert all(s.length >= 1 for s in segs)


def _brute_force_peak(segs):
    """Replay one training step as events on a set of live units; return the largest set size."""
    live, peak = set(), 0

    def note():
        nonlocal peak
        peak = max(peak, len(live))

    for j, s in enumerate(segs):  # forward
        live.add(("boundary", j))
        if not s.checkpointed:
            live.update(("block", i) for i in range(s.start, s.stop))
        note()
    for j in reversed(range(len(segs))):  # backward, top segment first
        s = segs[j]
        live.update(("block", i) for i in range(s.start, s.stop))  # recomputed (or already kept)
        note()
        live -= {("block", i) for i in range(s.start, s.stop)} | {("boundary", j)}
    assert not live
    return peak


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=depths)
def test_peak_units_matches_brute_force_count(data, n):
    sched = data.draw(_schedules_for(n))
    assert peak_units(n, sched) == _brute_force_peak(sched.segments_for(n))


def test_peak_units_known_values():
    assert peak_units(64, segments(8)) == 16
    assert peak_units(64, sqrt) == 16
    assert peak_units(64, none) == 65
    assert peak_units(64, full) == 65  # the unit model cannot see inside a block
    assert peak_units(10, every_k(3)) == 6  # backward of the third segment: 3 boundaries + 3 blocks
    assert peak_units(3, every_k(2)) == 3


def test_sqrt_near_optimum():
    for n in (4, 9, 16, 25, 64, 100, 144):
        assert peak_units(n, sqrt) == 2 * math.isqrt(n)


def test_recompute_and_boundaries():
    assert recomputed_blocks(64, none) == 0
    assert recomputed_blocks(64, full) == 64
    assert recomputed_blocks(64, segments(8)) == 56  # the last segment is not checkpointed
    assert recomputed_blocks(10, every_k(4)) == 10
    assert stored_boundaries(10, every_k(4)) == 3


def test_segments_split_like_checkpoint_sequential():
    assert segments(3).segments_for(8) == (Segment(0, 2, True), Segment(2, 4, True), Segment(4, 8, False))
    assert segments(1).segments_for(5) == none.segments_for(5)
    # round(sqrt(2)) = 1 would checkpoint nothing: sqrt keeps at least two segments
    assert sqrt.segments_for(2) == (Segment(0, 1, True), Segment(1, 2, False))
    assert sqrt.segments_for(1) == none.segments_for(1)
    assert every_k(3).segments_for(7) == (Segment(0, 3, True), Segment(3, 6, True), Segment(6, 7, True))
    assert every_k(9).segments_for(4) == (Segment(0, 4, True),)


@pytest.mark.parametrize("bad, param", [
    (lambda: every_k(0), "k"), (lambda: every_k(-2), "k"), (lambda: every_k(2.5), "k"),
    (lambda: every_k(True), "k"), (lambda: segments(0), "s"), (lambda: segments("3"), "s"),
    (lambda: segments(9).segments_for(8), "s"), (lambda: none.segments_for(0), "n_layer"),
])
def test_bad_schedule_parameters_raise(bad, param):
    with pytest.raises(ValueError, match=param):
        bad()


def test_segments_error_names_range():
    with pytest.raises(ValueError, match=r"\[1, 8\]"):
        segments(9).segments_for(8)


def test_parse_schedule_round_trip_and_errors():
    for s in (none, full, sqrt, every_k(3), segments(4)):
        assert parse_schedule(s.name) == s
    assert parse_schedule(" every_k( 2 ) ") == EveryK(2)
    with pytest.raises(ValueError, match="valid schedules"):
        parse_schedule("sqrtt")
    with pytest.raises(ValueError, match="not an integer"):
        parse_schedule("every_k(x)")


def test_schedules_are_hashable_values():
    assert len({every_k(2), every_k(2), segments(2), none, full}) == 4


def test_spec_imports_neither_framework():
    code = "import jaxremat, jaxremat.spec, sys; assert 'jax' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("text, message", [
    ("every_k(2_0)", r"parameter '2_0' is not an integer written in ASCII digits"),
    ("every_k(\uff12)", "not an integer written in ASCII digits"),  # fullwidth 2
    ("segments(\u0662)", "not an integer written in ASCII digits"),  # Arabic-Indic 2
    ("every_k(+2)", r"parameter '\+2' is not an integer"),
    ("every_k(-2)", r"parameter '-2' is not an integer"),
    ("ful l", "unknown schedule 'ful l'"),
    ("FULL", "unknown schedule 'FULL'"),
    ("full()", "full takes no parameter"),
    ("every_k", "every_k needs a parameter"),
    ("every_k(2))", "unbalanced parentheses"),
    ("nested(sqrt,every_k(2)", "unbalanced parentheses"),
    ("nested(sqrt,)", "two schedules"),
    (5, "got 5 \\(int\\)"),
])
def test_parse_schedule_refuses_odd_values_with_one_line(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_schedule(text)
    assert "\n" not in str(info.value)


def test_parse_schedule_takes_schedule_objects_and_normalises_visibly():
    assert parse_schedule(every_k(3)) is not None and parse_schedule(every_k(3)) == every_k(3)
    assert parse_schedule(full) is full
    assert parse_schedule("segments(02)").name == "segments(2)"  # the canonical name is what the report shows
    assert parse_schedule("nested( every_k(4) , segments(2) )").name == "nested(every_k(4),segments(2))"
