"""The neutral policy and plan spec: names, aliases, validation, nested schedules and their cost."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxremat.spec import nested, none, parse_schedule, peak_units, recomputed_blocks, segments, sqrt, every_k, full
from jaxremat.spec.names import ACTIVATION_NAMES
from jaxremat.spec.plan import parse_plan
from jaxremat.spec.policies import MAXTEXT_ALIASES, POLICIES, Policy, parse_policy


def test_policy_every_named_policy_is_valid_and_described():
    assert {"save_nothing", "save_everything", "save_dots", "save_dots_no_batch", "save_qkv_proj", "save_out_proj",
            "save_dots_except_mlp", "attention_only", "mlp_only"} <= set(POLICIES)
    for name, p in POLICIES.items():
        assert p.name == name and p.description
        assert p.kept_names | p.offloaded_names <= set(ACTIVATION_NAMES)


def test_policy_maxtext_aliases_have_maxtext_meaning():
    assert set(MAXTEXT_ALIASES) == {"full", "minimal", "save_dot_except_mlp", "save_qkv_proj", "save_out_proj",
                                    "qkv_proj_offloaded", "minimal_offloaded"}
    assert parse_policy("full").saves_nothing
    assert parse_policy("minimal").save_dots == "no_batch"
    assert parse_policy("save_dot_except_mlp").kept_names == {"qkv_proj", "out_proj"}
    assert parse_policy("qkv_proj_offloaded").offloaded_names == {"qkv_proj"} and not parse_policy("qkv_proj_offloaded").kept_names
    assert parse_policy("minimal_offloaded").offloaded_names == {"qkv_proj", "out_proj", "mlp_hidden", "mlp_out"}


def test_policy_attention_only_keeps_mlp_and_recomputes_attention():
    p = parse_policy("attention_only")
    assert p.kept_names == {"mlp_norm", "mlp_hidden", "mlp_act"}
    assert not p.kept_names & {"attn_norm", "qkv_proj", "attn_scores", "attn_probs", "attn_out", "out_proj"}


def test_policy_unknown_activation_name_lists_known_names():
    with pytest.raises(ValueError, match="unknown activation name.*'qkv'.*known names: block_input"):
        parse_policy("save_names(qkv)")
    with pytest.raises(ValueError, match="known names"):
        Policy("mine", save_names=frozenset({"mlp_hiden"}))


def test_policy_overlapping_save_and_offload_raises():
    with pytest.raises(ValueError, match="qkv_proj both saved and offloaded"):
        Policy("mine", save_names=frozenset({"qkv_proj"}), offload_names=frozenset({"qkv_proj"}))


def test_policy_unknown_name_lists_valid_policies():
    with pytest.raises(ValueError, match="valid policies: save_nothing"):
        parse_policy("save_dotz")


def test_plan_parses_schedule_and_policy():
    plan = parse_plan("every_k(2)+save_qkv_proj")
    assert plan.schedule == every_k(2) and plan.policy is POLICIES["save_qkv_proj"]
    assert plan.name == "every_k(2)+save_qkv_proj"
    assert parse_plan("full+minimal").name == "full+save_dots_no_batch"
    assert parse_plan("sqrt").name == "sqrt" and parse_plan("sqrt+save_nothing").name == "sqrt"
    assert parse_plan("nested(sqrt,sqrt)+save_dots").schedule == nested(sqrt, sqrt)


def test_plan_policy_on_none_is_an_error():
    with pytest.raises(ValueError, match="no effect on schedule 'none'"):
        parse_plan("none+save_dots")
    with pytest.raises(ValueError, match="nothing after"):
        parse_plan("full+")


def test_nested_parse_and_resolve():
    assert parse_schedule("nested") == nested(sqrt, sqrt)
    s = parse_schedule("nested(every_k(4), segments(2))")
    segs = s.segments_for(10)
    assert [(x.start, x.stop, x.checkpointed) for x in segs] == [(0, 4, True), (4, 8, True), (8, 10, True)]
    assert all(x.inner == segments(2) for x in segs)
    with pytest.raises(ValueError, match="does not fit the outer segment"):
        parse_schedule("nested(every_k(2),segments(3))").segments_for(8)
    with pytest.raises(ValueError, match="two schedules"):
        parse_schedule("nested(sqrt)")
    with pytest.raises(ValueError, match="nested: inner"):
        nested(sqrt, nested(sqrt, sqrt))


def _replay_peak(n, schedule):
    """Replay a step of a (possibly nested) schedule as live-unit events; return the peak count.

    Units: ("b", i) the input of block i kept as a boundary, ("a", i) block i's stored activations.
    """
    live, peak = set(), [0]

    def note():
        peak[0] = max(peak[0], len(live))

    def forward(lo, segs, store_all):
        for s in segs:
            live.add(("b", lo + s.start))
            note()
            if store_all or not s.checkpointed:
                for i in range(lo + s.start, lo + s.stop):
                    live.add(("a", i))
                    note()

    def backward(lo, segs):
        for s in reversed(segs):
            if s.checkpointed:
                if s.inner is None:
                    for i in range(lo + s.start, lo + s.stop):
                        live.add(("a", i))
                        note()
                else:
                    inner = s.inner.segments_for(s.length)
                    forward(lo + s.start, inner, False)
                    backward(lo + s.start, inner)
            for i in range(lo + s.start, lo + s.stop):
                live.discard(("a", i))
                if i != lo + s.start:
                    live.discard(("b", i))
            live.discard(("b", lo + s.start))

    segs = schedule.segments_for(n)
    forward(0, segs, False)
    backward(0, segs)
    return peak[0]


flat = st.one_of(st.just(none), st.just(full), st.just(sqrt), st.integers(1, 9).map(every_k))


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 80), outer=st.one_of(st.just(sqrt), st.integers(1, 12).map(every_k), st.just(full)),
       inner=flat)
def test_nested_peak_units_match_replay(n, outer, inner):
    sched = nested(outer, inner)
    assert peak_units(n, sched) == _replay_peak(n, sched)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 80), sched=st.one_of(flat, st.integers(1, 8).map(segments)))
def test_flat_peak_units_match_replay(n, sched):
    if isinstance(sched, type(segments(1))) and sched.s > n:
        return
    assert peak_units(n, sched) == _replay_peak(n, sched)


def test_nested_recompute_counts():
    # every_k(4) at 8: two outer segments of 4, each recomputed once (8), and inside each the
    # inner every_k(2)'s two segments recomputed once more (8): 16 block forwards recomputed.
    assert recomputed_blocks(8, nested(every_k(4), every_k(2))) == 16
    assert recomputed_blocks(8, nested(every_k(4), none)) == recomputed_blocks(8, every_k(4)) == 8
    assert peak_units(64, nested(every_k(16), every_k(4))) < peak_units(64, every_k(16))


def test_policy_name_kept_as_a_product_and_offloaded_raises():
    with pytest.raises(ValueError, match="qkv_proj both kept"):
        Policy("mine", save_dots="all", offload_names=frozenset({"qkv_proj"}))


def test_policy_names_as_a_string_is_an_error_not_characters():
    with pytest.raises(ValueError, match="must be a set of activation names"):
        Policy("mine", save_names="qkv_proj")


def test_plan_policy_on_a_schedule_that_checkpoints_nothing_at_this_depth():
    with pytest.raises(ValueError, match="checkpoints no segment at n_layer=4"):
        parse_plan("segments(1)+save_dots").segments_for(4)
    assert parse_plan("segments(2)+save_dots").segments_for(4)


@pytest.mark.parametrize("text, message", [
    ("every_k(+2)", r"every_k\(\+2\)': parameter '\+2' is not an integer"),  # not split at the '+'
    ("full+save_dots+save_qkv_proj", "more than one '\\+'"),
    ("full+save_names(qkv_proj,,)", "empty name"),
    ("full+save_names(qkv_proj,qkv_proj)", "qkv_proj listed twice"),
    ("full+save _dots", "unknown policy"),
])
def test_parse_plan_refuses_odd_values(text, message):
    with pytest.raises(ValueError, match=message):
        parse_plan(text)


def test_parse_plan_canonical_names_and_objects():
    assert parse_plan("full + save_names(qkv_proj, out_proj)").name == "full+save_names(qkv_proj,out_proj)"
    assert parse_plan(every_k(2)).name == "every_k(2)"


@pytest.mark.parametrize("schedule", [full, every_k(2), sqrt, nested(sqrt, sqrt)])
def test_save_everything_recomputes_nothing_and_keeps_none_units(schedule):
    keep_all = POLICIES["save_everything"]
    assert recomputed_blocks(4, schedule, keep_all) == 0
    assert peak_units(4, schedule, keep_all) == peak_units(4, none) == 5
    assert recomputed_blocks(4, schedule, POLICIES["save_dots"]) == recomputed_blocks(4, schedule) > 0
