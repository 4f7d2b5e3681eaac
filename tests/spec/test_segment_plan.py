"""Segment plans (heterogeneous plans): values, names, errors, the default-policy rule, the cost model."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxremat.spec import (
    PLAN_GRAMMAR, POLICIES, SCHEDULE_NAMES, PlanSegment, RematPlan, Segment, SegmentPlan, check_default_policy, none,
    parse_plan, parse_policy, parse_schedule, peak_units, recomputed_blocks, segment_plan, stored_boundaries,
)
from jaxremat.spec.lint import resolve_plan

SAVE_DOTS, ATTENTION_ONLY = POLICIES["save_dots"], POLICIES["attention_only"]
EXAMPLE = "plan(3*2+save_dots,1+attention_only,4:store)"

_policies = st.one_of(
    st.none(), st.sampled_from(sorted(POLICIES)).map(parse_policy),
    st.sampled_from(["save_names(qkv_proj,out_proj)", "offload_names(mlp_hidden)", "minimal"]).map(parse_policy),
)
_items = st.one_of(
    st.builds(PlanSegment, st.integers(1, 6), st.just(True), _policies),
    st.builds(PlanSegment, st.integers(1, 6), st.just(False)),
)
_segment_plans = st.lists(_items, min_size=1, max_size=8).map(lambda items: SegmentPlan(tuple(items)))


def _brute_force_peak(segs):
    """Replay one step on a set of live units (as tests/spec/test_schedules.py does)."""
    live, peak = set(), 0
    for j, s in enumerate(segs):
        live.add(("boundary", j))
        if not s.checkpointed:
            live.update(("block", i) for i in range(s.start, s.stop))
        peak = max(peak, len(live))
    for j in reversed(range(len(segs))):
        s = segs[j]
        live.update(("block", i) for i in range(s.start, s.stop))
        peak = max(peak, len(live))
        live -= {("block", i) for i in range(s.start, s.stop)} | {("boundary", j)}
    return peak


# ---------------------------------------------------------------- values and names


@settings(max_examples=300, deadline=None)
@given(sp=_segment_plans)
def test_segment_plan_name_round_trips_and_is_a_hashable_value(sp):
    plan = RematPlan(sp)
    assert parse_plan(plan.name) == plan and parse_plan(plan.name).name == plan.name
    assert parse_schedule(sp.name) == sp
    assert hash(parse_plan(plan.name)) == hash(plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sp.segments = ()


@settings(max_examples=300, deadline=None)
@given(sp=_segment_plans)
def test_segment_plan_resolves_to_contiguous_segments_with_their_policies(sp):
    segs = sp.segments_for(sp.n_layer)
    assert [i for s in segs for i in range(s.start, s.stop)] == list(range(sp.n_layer))
    assert [(s.length, s.checkpointed, s.policy) for s in segs] == [
        (it.length, it.checkpointed, it.policy) for it in sp.segments]
    assert all(s.inner is None for s in segs)
    # neighbouring stored segments are one stored run
    assert not any(not a.checkpointed and not b.checkpointed for a, b in zip(segs, segs[1:]))


@settings(max_examples=200, deadline=None)
@given(sp=_segment_plans, default=st.sampled_from(["save_dots", "attention_only", "save_everything"]))
def test_plan_wide_policy_is_the_default_of_segments_naming_none(sp, default):
    segs = sp.segments_for(sp.n_layer)
    reaches = any(s.checkpointed and s.policy is None for s in segs)
    named = any(s.policy is not None for s in segs)
    text = f"{sp.name}+{default}"
    if not reaches and (named or not any(s.checkpointed for s in segs)):
        with pytest.raises(ValueError, match="would"):
            parse_plan(text)
        return
    plan = parse_plan(text)
    assert parse_plan(plan.name) == plan
    expected = []
    for s in segs:
        p = (s.policy or POLICIES[default]) if s.checkpointed else None
        if p is not None and p not in expected:
            expected.append(p)
    assert plan.policies == tuple(expected)


def test_canonical_names():
    assert parse_plan("plan(3,3)").name == "plan(3*2)"
    assert parse_plan("plan(2:store,2:store,3)").name == "plan(4:store,3)"
    assert parse_plan("plan(2:store,2:store)") == parse_plan("plan(4:store)")
    assert parse_plan(" plan( 3 * 2 + minimal , 4 : store )").name == "plan(3*2+save_dots_no_batch,4:store)"
    assert parse_plan("plan(3+save_names(out_proj,qkv_proj),2)").name == "plan(3+save_names(out_proj,qkv_proj),2)"
    assert parse_plan("plan(3+save_nothing,5)+save_dots").name == "plan(3+save_nothing,5)+save_dots"
    p = parse_plan(EXAMPLE)
    assert p.name == EXAMPLE and p.policy == POLICIES["save_nothing"]
    assert p.schedule == segment_plan(PlanSegment(3, policy="save_dots"), PlanSegment(3, policy=SAVE_DOTS),
                                      PlanSegment(1, policy=ATTENTION_ONLY), PlanSegment(4, False))
    assert PLAN_GRAMMAR in SCHEDULE_NAMES


def test_example_segments_and_policies():
    segs = parse_plan(EXAMPLE).segments_for(11)
    assert segs == (Segment(0, 3, True, None, SAVE_DOTS), Segment(3, 6, True, None, SAVE_DOTS),
                    Segment(6, 7, True, None, ATTENTION_ONLY), Segment(7, 11, False))
    assert parse_plan(EXAMPLE).policies == (SAVE_DOTS, ATTENTION_ONLY)
    assert not parse_plan(EXAMPLE).saves_nothing and parse_plan("plan(3,2:store)").saves_nothing


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("text, message", [
    ("plan(3,0)", r"item '0': a segment holds at least 1 block"),
    ("plan(3*0)", "repeated at least once"),
    ("plan(3*)", r"nothing after '\*'"),
    ("plan(*3)", "does not start with a length"),
    ("plan(x)", "'x' is not an integer written in ASCII digits"),
    ("plan(2_0)", "'2_0' is not an integer"),
    ("plan(\uff12)", "not an integer written in ASCII digits"),
    ("plan(+2)", "does not start with a length"),
    ("plan()", "empty item"),
    ("plan(3,,4)", "empty item"),
    ("plan(3,)", "empty item"),
    ("plan", "written plan\\(LENGTH"),
    ("plan(3:keep)", "after ':' write 'store'"),
    ("plan(4:store+save_dots)", "a stored segment keeps every activation, so policy 'save_dots' would do nothing; "
                                "write 4:store, or 4\\+save_dots"),
    ("plan(4+save_dots:store)", "policy 'save_dots' would do nothing"),
    ("plan(3+)", "nothing after '\\+'"),
    ("plan(3+save_dotz)", "unknown policy 'save_dotz'; valid policies"),
    ("plan(3+save_dots)+attention_only", "every checkpointed segment names its own policy \\(save_dots\\)"),
    ("plan(4:store)+save_dots", "every segment is stored"),
    ("plan(3,(4)", "unbalanced parentheses"),
])
def test_bad_segment_plans_raise_one_line_that_says_what_to_write(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_plan(text)
    assert "\n" not in str(info.value)


def test_lengths_must_sum_to_the_depth_and_the_message_gives_both():
    with pytest.raises(ValueError, match="sum to 11 blocks but the stack has n_layer=8; make the lengths add up to 8"):
        parse_plan(EXAMPLE).segments_for(8)
    with pytest.raises(ValueError, match="n_layer must be an integer >= 1"):
        parse_plan(EXAMPLE).schedule.segments_for(0)
    assert parse_plan(EXAMPLE).schedule.n_layer == 11


@pytest.mark.parametrize("bad, message", [
    (lambda: PlanSegment(0), "length"), (lambda: PlanSegment(2.0), "length"), (lambda: PlanSegment(True), "length"),
    (lambda: PlanSegment(2, 1), "checkpointed must be True or False"),
    (lambda: PlanSegment(4, False, "save_dots"), "a stored segment keeps every activation"),
    (lambda: PlanSegment(2, True, "nope"), "unknown policy"),
    (lambda: SegmentPlan(()), "at least one segment"),
    (lambda: SegmentPlan((3, 4)), "must be PlanSegment values"),
    (lambda: SegmentPlan("plan(3)"), "at least one segment"),
])
def test_bad_segment_plan_values_raise(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_default_policy_rule_for_renderers():
    segs = parse_plan("plan(3+save_dots,2)").segments_for(5)
    check_default_policy(segs, "attention_only", "x")  # reaches the second segment
    check_default_policy(segs, None, "x")
    only_own = parse_plan("plan(3+save_dots,2:store)").segments_for(5)
    with pytest.raises(ValueError, match="forward_blocks: policy 'attention_only' was given, but every checkpointed"):
        check_default_policy(only_own, "attention_only", "forward_blocks")
    check_default_policy(none.segments_for(5), "save_dots", "x")  # not a segment plan: the no-effect lint's case


def test_resolve_plan_takes_policy_as_the_default_of_a_segment_plan():
    schedule, policy = resolve_plan("plan(3+save_dots,2)", "attention_only")
    assert schedule == parse_schedule("plan(3+save_dots,2)") and policy == "attention_only"
    with pytest.raises(ValueError, match="give the policy once"):
        resolve_plan("plan(3+save_dots,2)+mlp_only", "attention_only")
    with pytest.raises(ValueError, match="give the policy once"):
        resolve_plan("sqrt+save_dots", "attention_only")


# ---------------------------------------------------------------- the cost model


@settings(max_examples=300, deadline=None)
@given(sp=_segment_plans)
def test_peak_units_of_a_segment_plan_counts_save_everything_as_stored(sp):
    n = sp.n_layer
    as_stored = SegmentPlan(tuple(PlanSegment(s.length, False) if s.policy is not None and s.policy.save_everything
                                  else s for s in sp.segments))
    assert peak_units(n, sp) == peak_units(n, as_stored) == _brute_force_peak(as_stored.segments_for(n))
    assert recomputed_blocks(n, sp) == sum(s.length for s in as_stored.segments if s.checkpointed)
    assert stored_boundaries(n, sp) == len(sp.segments)


def test_cost_model_known_values():
    assert peak_units(11, parse_schedule(EXAMPLE)) == 8  # backward of the stored tail: 3 boundaries below + 5
    assert recomputed_blocks(11, parse_schedule(EXAMPLE)) == 7
    assert peak_units(4, parse_schedule("plan(2+save_everything,2:store)")) == peak_units(4, none) == 5
    assert recomputed_blocks(4, parse_schedule("plan(2+save_everything,2)")) == 2
    # the plan-wide policy is the default: save_everything there stores the segments naming none
    sp = parse_schedule("plan(2+save_dots,2)")
    assert recomputed_blocks(4, sp, POLICIES["save_everything"]) == 2
    assert peak_units(4, sp, POLICIES["save_everything"]) == peak_units(4, parse_schedule("plan(2,2:store)"))
    # uniform schedules are unchanged
    assert peak_units(64, parse_schedule("segments(8)")) == 16
