"""The planner's time cost, framework-neutral part (jaxremat.spec.option_time): per-block slopes and
segment intercepts from timed segments, the interleaved timing loop (with an injected clock)."""

import pytest

from jaxremat.spec.option_time import measure_options, option_time, options_with_times, time_rounds, times_table
from jaxremat.spec.planner import BlockOption, chain_time_s, plan_for_budget


def test_option_time_is_the_slope_and_intercept_per_round():
    # segments of 2 and 4 blocks: forward 2 + 1/block, step 5 + 3/block in round 0; noisier in round 1
    t = option_time("store", (2, 4), {2: [4.0, 4.4], 4: [6.0, 6.0]}, {2: [11.0, 12.0], 4: [17.0, 17.0]})
    assert t.forward.median_s == pytest.approx(0.9) and (t.forward.low_s, t.forward.high_s) == (pytest.approx(0.8), 1.0)
    assert t.backward.low_s == pytest.approx(1.7) and t.backward.high_s == pytest.approx(2.0)  # step 3/2.5 less forward
    assert t.segment.low_s == pytest.approx(5.0) and t.segment.high_s == pytest.approx(7.0)  # 11 - 2*3, 12 - 2*2.5
    assert t.step_time_s == pytest.approx(0.9 + 1.85) and t.rounds == 2 and t.lengths == (2, 4)
    d = times_table({"store": t})["store"]
    assert d["forward_ms"] == pytest.approx([900.0, 800.0, 1000.0]) and d["lengths"] == [2, 4]


def test_negative_medians_cost_nothing_and_bad_samples_are_refused():
    t = option_time("x", (2, 4), {2: [3.0], 4: [2.0]}, {2: [6.0], 4: [20.0]})  # forward slope < 0, intercept < 0
    assert t.forward.median_s < 0 and t.segment.median_s < 0
    assert t.segment_time_s == 0.0 and t.step_time_s == pytest.approx(7.0)
    with pytest.raises(ValueError, match="1 <= L1 < L2"):
        option_time("x", (3, 3), {3: [1.0]}, {3: [1.0]})
    with pytest.raises(ValueError, match="same number"):
        option_time("x", (2, 4), {2: [1.0], 4: [1.0, 2.0]}, {2: [1.0], 4: [1.0]})


def test_time_rounds_interleaves_every_call_and_rotates_the_order():
    order, now = [], [0.0]
    cost = {"a": 1.0, "b": 3.0, "c": 4.0}

    def call(key):
        def fn():
            order.append(key)
            now[0] += cost[key]
        return fn

    got = time_rounds({k: call(k) for k in cost}, rounds=3, min_sample_s=2.0, clock=lambda: now[0])
    assert got == {"a": [1.0] * 3, "b": [3.0] * 3, "c": [4.0] * 3}  # seconds per call, one per round
    timed = order[6:]  # a warm-up and a calibration call each first
    # a: 2 calls per sample (1 s each, 2 s asked); round 1 rotated by one and reversed, round 2 rotated by two
    assert timed == ["a", "a", "b", "c", "a", "a", "c", "b", "c", "a", "a", "b"]


def test_measured_times_plan_like_any_cost():
    now = [0.0]

    def segment_calls(name, length):
        per_block = {"store": 1.0, "save_nothing": 2.0}[name]

        def run(scale):
            def fn():
                now[0] += scale * (0.5 + per_block * length)
            return fn
        return run(0.4), run(1.0)

    times = measure_options(segment_calls, ["store", "save_nothing"], rounds=2, clock=lambda: now[0])
    assert times["save_nothing"].step_time_s == pytest.approx(2.0) and times["store"].segment_time_s == pytest.approx(0.5)
    menu = options_with_times([BlockOption("store", False, kept_bytes=10, working_bytes=10),
                               BlockOption("save_nothing", True, "save_nothing", 0, 10, recompute_flops=1.0)], times)
    r = plan_for_budget([menu] * 4, 40, 1, cost="time")
    segs = list(zip([seg.length for seg in r.plan.segments], r.segment_options))
    assert r.step_time_s == pytest.approx(chain_time_s([menu] * 4, segs))
    assert r.plan.name.startswith("plan(") and r.peak_bytes <= 40
    with pytest.raises(ValueError, match="no measured time for options"):
        options_with_times(menu, {"store": times["store"]})
