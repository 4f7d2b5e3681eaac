"""Plans timed whole and paired (parity.cases.plan_timing): the choice rule, the record, the framework door."""

import numpy as np
import pytest

from jaxremat.models import init_params
from jaxremat.models.config import TransformerConfig
from jaxremat.spec.plan import parse_plan
from parity.cases.plan_timing import KEPT, REPLACED, PlanTimes, beyond_noise, pick, pick_cases, time_plans

CFG = TransformerConfig(arch="gpt", vocab_size=64, n_layer=2, d_model=16, n_head=2, d_ff=32, max_seq_len=8)



def test_a_candidate_replaces_the_least_flops_one_only_when_faster_in_every_round():
    t = PlanTimes({"least": (1.0, 1.1, 0.9, 1.0), "fast": (0.80, 0.86, 0.73, 0.81), "slow": (1.3, 1.4, 1.2, 1.3),
                   "maybe": (0.70, 0.70, 0.95, 0.70)})
    got = pick(t, [("slow", 30.0), ("fast", 20.0), ("least", 10.0)])
    r = t.ratio("fast", "least")  # paired round by round: 0.80, 0.782, 0.811, 0.81
    assert (got.plan, got.rule) == ("fast", REPLACED) and got.ratio == r and beyond_noise(r)
    assert got.reason == ("fastest beyond noise: fast 0.805x [0.782-0.811] of the least-FLOPs candidate least, "
                          "faster in every one of 4 paired rounds, beyond the noise")
    # "maybe" has the least median (0.70x) but one round slower (0.95/0.9): within the noise, so the order decides
    got = pick(t, [("least", 10.0), ("maybe", 20.0), ("slow", 30.0)])
    assert (got.plan, got.rule, got.ratio.median) == ("least", KEPT, pytest.approx(0.7))
    assert got.reason.startswith("noise: least FLOPs kept: least; no candidate of 3 faster beyond the noise")


def test_a_gain_in_every_round_that_the_reports_mark_noise_decides_nothing():
    t = PlanTimes({"least": (1.0, 1.0, 1.0, 1.0), "thin": (0.99, 0.90, 0.95, 0.96)})  # 0.955x [0.90-0.99]
    r = t.ratio("thin", "least")
    assert r.high < 1 and r.noise and not beyond_noise(r)  # faster in every round, by less than its spread
    assert (pick(t, [("least", 1.0), ("thin", 2.0)]).plan, pick(t, [("least", 1.0), ("thin", 2.0)]).rule) == \
        ("least", KEPT)


def test_the_fixed_order_is_fewest_flops_then_name_and_replacement_is_transitive():
    t = PlanTimes({"a": (1.0, 1.0), "b": (1.0, 1.0), "c": (0.9, 0.9), "d": (0.8, 0.85)})
    assert pick(t, [("b", 5.0), ("a", 5.0)]).plan == "a"  # a tie in FLOPs: by name
    assert (pick(t, [("b", 5.0), ("a", 6.0)]).plan, pick(t, [("b", 5.0), ("a", 6.0)]).rule) == ("b", KEPT)
    got = pick(t, [("a", 1.0), ("c", 2.0), ("d", 3.0)])  # c replaces a, then d replaces c
    assert got.plan == "d" and got.ratio == t.ratio("d", "a")
    assert pick(PlanTimes({"x": (1.0,)}), [("x", 1.0)]).rule == "the only candidate"
    assert pick(PlanTimes({"a": (1.0,), "b": (0.5,)}), [("a", 1.0), ("b", 2.0)]).plan == "a"  # one round: no spread
    with pytest.raises(ValueError, match="at least one"):
        pick(t, [])


def test_the_planner_and_the_uniform_case_never_rank_two_plans_in_opposite_orders():
    # u1 has a lower median than u0 against the FLOPs plan p0, but u1/u0 is 1.03x [0.78-1.37]: the old rule (the
    # least median against each case's own first candidate) gave the planner u1 and the uniform case u0
    t = PlanTimes({"p0": (1.0, 1.0, 1.0), "u0": (0.90, 1.20, 0.95), "u1": (0.93, 0.93, 1.30)})
    picks = pick_cases(t, [("p0", 10.0), ("u0", 20.0), ("u1", 30.0)], [("u0", 20.0), ("u1", 30.0)])
    assert (picks["best_uniform"].plan, picks["best_uniform"].rule) == ("u0", KEPT)
    assert (picks["budget"].plan, picks["budget"].rule) == ("p0", KEPT)
    # u1 faster than p0 in every round, but not than u0: the planner takes u0, the uniform case's pick, or p0
    t = PlanTimes({"p0": (1.0, 1.0, 1.0), "u0": (0.90, 0.95, 0.92), "u1": (0.85, 0.90, 0.95)})
    picks = pick_cases(t, [("p0", 10.0), ("u0", 20.0), ("u1", 30.0)], [("u0", 20.0), ("u1", 30.0)])
    assert picks["best_uniform"].plan == picks["budget"].plan == "u0" and picks["budget"].rule == REPLACED
    # the FLOPs plan is a uniform plan: both cases pick among the same plans, and agree
    t = PlanTimes({"u0": (1.0, 1.0), "u1": (0.9, 0.9)})
    picks = pick_cases(t, [("u0", 1.0), ("u1", 2.0)], [("u0", 1.0), ("u1", 2.0)])
    assert picks["budget"] == picks["best_uniform"] and picks["budget"].plan == "u1"


def test_plan_times_record_medians_in_ms_and_the_load():
    t = PlanTimes({"a": (0.010, 0.012, 0.011), "b": (0.020, 0.018, 0.019)}, (2.5, 3.0))
    assert t.rounds == 3
    d = t.as_dict()
    assert d["rounds"] == 3 and d["load_1min"] == [2.5, 3.0] and list(d["step_ms"]) == ["a", "b"]
    assert d["step_ms"]["a"] == pytest.approx([11.0, 10.0, 12.0])


def test_plans_of_one_name_are_refused():
    with pytest.raises(ValueError, match="distinct names"):
        time_plans("torch", CFG, {}, None, [parse_plan("full"), parse_plan("full")])


def test_whole_steps_are_timed_interleaved_through_the_framework_door():
    # JAX's door is run by tests/parity/test_budget_plan.py's plan command (its paired timing)
    framework = "torch"
    params = init_params(CFG)
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 9))
    plans = [parse_plan("none"), parse_plan("full")]
    t = time_plans(framework, CFG, params, tokens, plans, rounds=2, min_sample_s=0.005)
    assert list(t.times_s) == ["none", "full"] and t.rounds == 2
    assert all(s > 0 for v in t.times_s.values() for s in v)
    assert t.ratio("full", "none").rounds == 2 and len(t.load_1min) == 2
