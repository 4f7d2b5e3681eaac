"""parity.checks.timing: paired ratios, their spread, and when a ratio is noise (no timing is measured)."""

import importlib.util
from pathlib import Path

import pytest

from parity.checks.timing import MEASURE_COMMAND, RatioSpread, load_average_1min, paired_ratios, ratio_spread

ROOT = Path(__file__).resolve().parents[2]


def test_paired_ratios_divides_round_by_round():
    assert paired_ratios([2.0, 3.0, 5.0], [1.0, 2.0, 4.0]) == [2.0, 1.5, 1.25]


@pytest.mark.parametrize("times, ref", [([], []), ([1.0], [1.0, 2.0]), ([1.0], [0.0])])
def test_paired_ratios_refuses_bad_series(times, ref):
    with pytest.raises(ValueError, match="paired ratios|positive"):
        paired_ratios(times, ref)


def test_ratio_spread_median_min_max():
    rs = ratio_spread([1.2, 1.3, 1.25, 1.4, 1.22], [1.0] * 5)
    assert (rs.median, rs.low, rs.high, rs.rounds) == (1.25, 1.2, 1.4, 5)
    assert rs.spread == pytest.approx(0.2)


def test_ratio_spread_is_noise_when_spread_exceeds_effect():
    clear = RatioSpread(1.30, 1.25, 1.36, 7)  # spread 0.11 < effect 0.30
    noisy = RatioSpread(1.05, 0.95, 1.20, 7)  # spread 0.25 > effect 0.05
    faster = RatioSpread(0.90, 0.88, 0.93, 7)  # an effect below 1 counts by its distance too
    assert (clear.noise, noisy.noise, faster.noise) == (False, True, False)
    assert clear.text() == "1.30x [1.25-1.36]"
    assert noisy.text() == "noise (1.05x [0.95-1.20])"
    assert noisy.as_dict() == {"median": 1.05, "min": 0.95, "max": 1.20, "rounds": 7, "noise": True}


def test_ratio_spread_single_round_is_noise():
    assert RatioSpread(1.5, 1.5, 1.5, 1).noise


def test_load_average_is_a_number_here():
    load = load_average_1min()
    assert load is None or (isinstance(load, float) and load >= 0)


def _bench():
    spec = importlib.util.spec_from_file_location("bench_overhead", ROOT / "scripts" / "bench_overhead.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_summarize_pairs_rounds_with_none_and_plain_torch():
    bench = _bench()
    run = {"framework": "torch", "core": 0, "resolved": {}, "load_1min": [3.0, 5.0, 4.0],
           "pairs": [{"reference": "none", "candidate": "full", "reference_s": [1.0, 2.0, 1.0], "candidate_s": [1.3, 2.6, 1.2]},
                     {"reference": "none", "candidate": "plain:full", "reference_s": [1.0, 2.0, 1.0],
                      "candidate_s": [1.25, 2.5, 1.2]},
                     {"reference": "plain:full", "candidate": "full", "reference_s": [1.25, 2.5, 1.2],
                      "candidate_s": [1.3, 2.6, 1.2]}]}
    for p in run["pairs"]:
        p["reference_cpu_s"], p["candidate_cpu_s"] = p["reference_s"], [2 * t for t in p["candidate_s"]]
    s = bench.summarize(run, "wall")
    assert bench.summarize(run, "cpu")["ratios"]["full"].median == pytest.approx(2.6)
    assert set(s["ratios"]) == {"full", "plain:full"}
    assert (s["ratios"]["full"].median, s["ratios"]["full"].low, s["ratios"]["full"].high) == (1.3, 1.2, 1.3)
    assert list(s["vs_plain"]) == ["full / plain:full"]
    assert s["vs_plain"]["full / plain:full"].median == pytest.approx(1.04)
    assert s["load"] == "load 4.0 [3.0-5.0]" and s["none_step_time_s"] == 1.0
    assert MEASURE_COMMAND.split()[-1] == "scripts/bench_overhead.py" and (ROOT / MEASURE_COMMAND.split()[-1]).is_file()


def test_bench_help_prints(capsys):
    with pytest.raises(SystemExit) as e:
        _bench().main(["--help"])
    assert e.value.code == 0 and "--planner" in capsys.readouterr().out


def test_bench_refuses_unknown_size(capsys):
    assert _bench().main(["--sizes", "huge"]) == 2
    assert "unknown ['huge']" in capsys.readouterr().err


def test_bench_pairs_every_plan_with_none_and_torchref_with_plain_torch():
    pairs = _bench()._pairs(["none", "full", "sqrt", "plain:full", "plain:sqrt"])
    assert pairs == [("none", "full"), ("none", "sqrt"), ("none", "plain:full"), ("none", "plain:sqrt"),
                     ("plain:full", "full"), ("plain:sqrt", "sqrt")]


def test_bench_interleave_times_both_steps_of_every_pair_each_round():
    calls = []
    steps = {n: (lambda n=n: calls.append(n)) for n in ("none", "full", "sqrt")}
    run = _bench()._interleave(steps, rounds=3)
    assert calls[:3] == ["none", "full", "sqrt"]  # one warm-up step each
    assert calls[3:7] == ["none", "full", "none", "sqrt"]  # round 0: A B, A B
    assert calls[7:11] == ["sqrt", "none", "full", "none"]  # round 1: pairs rotated, B A
    assert [(p["reference"], p["candidate"], len(p["reference_s"]), len(p["candidate_cpu_s"])) for p in run["pairs"]] == [
        ("none", "full", 3, 3), ("none", "sqrt", 3, 3)]
    assert len(run["load_1min"]) == 3


def test_fmt_time_ratio_shows_noise_when_the_range_is_wider_than_the_effect():
    from parity.report.format import fmt_time_ratio

    assert fmt_time_ratio(1.27, [1.21, 1.35]) == "1.27 [1.21-1.35]"
    assert fmt_time_ratio(4.32, [1.08, 12.99]) == "noise (4.32 [1.08-12.99])"  # issue 37's plan under load
    assert fmt_time_ratio(0.79, [0.09, 6.19], with_range=False) == "noise"
    assert fmt_time_ratio(1.27, [1.21, 1.35], with_range=False) == "1.27"
    assert fmt_time_ratio(1.27, None) == "noise (1.27)"  # one timed step: no spread to judge by
    assert fmt_time_ratio(None, [1.0, 2.0]) == "-"


def test_bench_planner_chooses_jax_time_plans_among_whole_plans_timed_once():
    from jaxremat.models.config import TransformerConfig
    from jaxremat.spec.planner import BlockOption
    from parity.cases.plan_timing import PlanTimes
    from parity.experiments.overhead_plans import choose_plans, plan_timer

    bench = _bench()
    cfg = TransformerConfig(vocab_size=64, n_layer=4, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
    menu = [BlockOption("store", False, None, 10, 10), BlockOption("save_nothing", True, "save_nothing", 0, 10, 5),
            BlockOption("save_dots", True, "save_dots", 4, 10, 3)]
    chain = {"options_per_block": [menu] * cfg.n_layer, "boundary_bytes": 2, "invariant_bytes": 0, "fixed_bytes": 0}
    timed = []

    def time_plans(plans):  # the last candidate is 20% faster in every round
        timed.append([p.name for p in plans])
        return PlanTimes({p.name: (0.8,) * 3 if i == len(plans) - 1 else (1.0,) * 3 for i, p in enumerate(plans)})

    def chains(cost):
        assert cost == "flops"  # whole plans: no segment-timed chain is measured
        return chain

    plans = ["none", "budget(50%)", "budget(50%):time", "best_uniform(50%):time", "plain:full"]
    chosen, cands = choose_plans(plans, chains, cfg.n_layer, time_plans, bench.TORCH_REFERENCES)
    assert set(chosen) == {"none", "budget(50%)", "budget(50%):time", "best_uniform(50%):time"}
    assert timed[0] == timed[1] and chosen["budget(50%):time"].name == timed[0][-1]
    assert chosen["best_uniform(50%):time"].name == timed[0][-1]  # the uniform candidates are the planner's too
    assert list(cands) == ["budget(50%):time", "best_uniform(50%):time"]
    rows = cands["budget(50%):time"]["candidates"]
    assert rows[0]["plan"] == chosen["budget(50%)"].name and rows[0]["vs_model_choice"]["median"] == 1.0
    assert cands["budget(50%):time"]["choice_reason"].startswith("fastest beyond noise: ")
    assert plan_timer("torch", cfg, {}, None) is None and plan_timer("jax", cfg, {}, None) is not None
