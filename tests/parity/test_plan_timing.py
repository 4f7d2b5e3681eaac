"""Plans timed whole and paired (parity.cases.plan_timing): the choice rule, the record, the framework door."""

import numpy as np
import pytest

from jaxremat.models import init_params
from jaxremat.models.config import TransformerConfig
from jaxremat.spec.plan import parse_plan
from parity.cases.plan_timing import PlanTimes, fastest, time_plans

CFG = TransformerConfig(arch="gpt", vocab_size=64, n_layer=2, d_model=16, n_head=2, d_ff=32, max_seq_len=8)



def test_the_candidate_of_least_median_paired_ratio_is_chosen_and_its_noise_said():
    t = PlanTimes({"model": (1.0, 1.1, 0.9, 1.0), "fast": (0.80, 0.86, 0.73, 0.81), "slow": (1.3, 1.4, 1.2, 1.3)})
    who, why = fastest(t, "model")
    assert who == "fast" and why == "measured fastest of 3 candidates: 0.805x [0.782-0.811] of the model's choice model"
    r = t.ratio("fast", "model")  # paired round by round: 0.80, 0.782, 0.811, 0.81
    assert r.rounds == 4 and r.low == pytest.approx(0.86 / 1.1) and r.high == pytest.approx(0.811, abs=1e-3)
    assert fastest(t, "model", ["model", "slow"])[0] == "model"  # only the names given compete
    who, why = fastest(PlanTimes({"model": (1.0, 1.0, 1.0), "maybe": (0.95, 0.70, 1.05)}), "model")
    assert who == "maybe" and why.endswith("noise (0.950x [0.700-1.050]) of the model's choice model")


def test_the_model_choice_stays_when_nothing_measured_faster():
    who, why = fastest(PlanTimes({"model": (1.0, 1.0), "slower": (1.2, 1.3), "tie": (1.0, 1.0)}), "model")
    assert who == "model" and why.startswith("the model's choice, measured fastest of 3 candidates")
    assert fastest(PlanTimes({"model": (1.0,)}), "model") == ("model", "the only candidate")


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
