"""The plan command's choice between the planner's plan and the uniform plan (parity.cli.plan_choice)."""

import pytest

from parity.checks.timing import ratio_between
from parity.cli.plan_choice import choose, option_rows, options_markdown, time_vs_uniform


def _row(p_time, p_range, u_time, u_range, p_status="pass", u_status="pass", cost="time"):
    return {"framework": "torch", "budget": "50%", "cost": cost,
            "planner": {"status": p_status, "time_overhead": p_time, "time_overhead_range": p_range},
            "uniform": {"status": u_status, "time_overhead": u_time, "time_overhead_range": u_range}}


def test_ratio_between_spreads_over_both_ranges():
    t = ratio_between(1.2, [1.1, 1.3], 1.5, [1.4, 1.6])
    assert t.median == pytest.approx(0.8) and t.low == pytest.approx(1.1 / 1.6) and t.high == pytest.approx(1.3 / 1.4)
    assert t.noise  # [0.69-0.93]: 0.24 wide, wider than the 0.20 from 1
    assert not ratio_between(1.2, [1.15, 1.25], 1.5, [1.45, 1.55]).noise  # [0.74-0.86]: 0.12 wide, 0.2 from 1
    assert ratio_between(1.2, None, 1.5, [1.4, 1.6]).noise  # no range: one round, noise
    with pytest.raises(ValueError, match="positive"):
        ratio_between(0.0, None, 1.0, None)


def test_a_noise_ratio_never_decides_the_choice():
    # the planner measured 1.6x none against the uniform plan's 1.2x, but the ranges overlap widely: noise
    row = _row(1.6, [0.9, 3.0], 1.2, [1.0, 1.5])
    assert time_vs_uniform(row).noise
    who, why = choose(row)
    assert who == "planner" and "noise decides nothing" in why and "by the time model" in why


def test_a_measured_slowdown_beyond_the_noise_chooses_the_uniform_plan():
    who, why = choose(_row(1.9, [1.85, 1.95], 1.2, [1.18, 1.22]))
    assert who == "uniform" and why.startswith("measured slower than the uniform plan: 1.58x")
    who, why = choose(_row(1.1, [1.08, 1.12], 1.5, [1.45, 1.55]))
    assert who == "planner" and why.startswith("measured no slower")


def test_a_failed_case_is_never_chosen():
    assert choose(_row(1.0, [1.0, 1.0], 2.0, [2.0, 2.0], p_status="over_budget"))[0] == "uniform"
    assert choose(_row(2.0, [2.0, 2.0], 1.0, [1.0, 1.0], u_status="fail"))[0] == "planner"
    assert choose(_row(1.0, None, 1.0, None, p_status="error", u_status="fail"))[0] == "none"
    assert choose(_row(None, None, None, None, cost="flops")) == ("planner", "no step times; by the flops model")


def test_the_measured_options_table_has_one_row_per_option_and_framework():
    times = {"store": {"forward_ms": [1.0, 0.9, 1.2], "backward_ms": [2.0, 1.9, 2.2], "segment_ms": [0.1, 0.0, 0.3],
                       "step_ms": 3.0, "rounds": 5, "lengths": [2, 4]}}
    rows = [{**_row(1, None, 1, None), "option_times": times}, {**_row(1, None, 1, None), "option_times": times}]
    assert option_rows(rows) == [["torch", "store", "1.000 [0.900-1.200]", "2.000 [1.900-2.200]",
                                  "0.100 [0.000-0.300]", "3.000"]]
    md = "\n".join(options_markdown(rows))
    assert "segments of 2 and 4 blocks, interleaved over 5 rounds" in md
    assert options_markdown([_row(1, None, 1, None)]) == []
