"""The plan command's choice between the planner's plan and the uniform plan (parity.cli.plan_choice)."""

from parity.cli.plan_choice import (candidate_rows, candidates_markdown, choice_lines, choose, option_rows,
                                   options_markdown, paired_markdown, time_vs_uniform)


def _row(ratio=None, p_status="pass", u_status="pass", cost="time", same=False):
    """A plan row; ``ratio``: the paired planner/uniform ratio as (median, min, max), 9 rounds."""
    row = {"framework": "torch", "budget": "50%", "cost": cost,
           "planner": {"status": p_status, "plan": "plan(2+save_nothing,2:store)"},
           "uniform": {"status": u_status, "plan": "plan(2+save_nothing,2:store)" if same else "segments(2)"}}
    row["paired"] = ({"same_plan": True, "plans": [row["planner"]["plan"]] * 2} if same else None if ratio is None else
                     {"plans": [row["planner"]["plan"], "segments(2)"], "rounds": 9, "load_1min": [1.0, 1.5],
                      "step_ms": {row["planner"]["plan"]: [20.0, 19.0, 22.0], "segments(2)": [21.0, 20.0, 23.0]},
                      "ratio": {"median": ratio[0], "min": ratio[1], "max": ratio[2], "rounds": 9, "noise": False}})
    return row


def test_the_paired_ratio_is_the_comparison_and_noise_never_decides():
    row = _row((1.05, 0.80, 1.30))  # spread 0.50, wider than the 0.05 from 1
    t = time_vs_uniform(row)
    assert (t.median, t.low, t.high, t.rounds) == (1.05, 0.80, 1.30, 9) and t.noise
    who, why = choose(row)
    assert who == "planner" and "noise decides nothing" in why and "by the time model" in why
    assert time_vs_uniform(_row()) is None and time_vs_uniform(_row(same=True)) is None


def test_a_measured_slowdown_beyond_the_noise_chooses_the_uniform_plan():
    who, why = choose(_row((1.58, 1.55, 1.62)))
    assert who == "uniform" and why.startswith("measured slower than the uniform plan (paired): 1.580x")
    who, why = choose(_row((0.80, 0.78, 0.83)))
    assert who == "planner" and why.startswith("measured no slower")
    assert choose(_row(same=True)) == ("planner", "the same plan as the uniform one")
    # slower in every round, by less than the spread: marked noise, so it decides nothing
    assert choose(_row((1.05, 1.01, 1.20)))[0] == "planner"


def test_a_failed_case_is_never_chosen():
    assert choose(_row((0.5, 0.5, 0.5), p_status="over_budget"))[0] == "uniform"
    assert choose(_row((2.0, 2.0, 2.0), u_status="fail"))[0] == "planner"
    assert choose(_row(p_status="error", u_status="fail"))[0] == "none"
    assert choose(_row(cost="flops")) == ("planner", "no paired step times; by the flops model")


def test_the_paired_table_has_each_plan_its_step_time_and_the_ratio():
    md = "\n".join(paired_markdown([_row((0.95, 0.93, 0.97)), _row(same=True), _row()]))
    assert "| torch | 50% | plan(2+save_nothing,2:store) | segments(2) | 20.000 [19.000-22.000] | 21.000 [20.000-23.000] " \
           "| 0.950x [0.930-0.970] | 9 | 1.0-1.5 |" in md
    assert "| the same plan |" in md and md.count("| torch |") == 2
    assert paired_markdown([_row()]) == []


def test_the_candidates_table_has_one_row_per_candidate_and_marks_the_chosen():
    row = _row((1.0, 0.9, 1.1))
    row["planner"].update(candidates=[
        {"plan": "plan(1*3+save_nothing,1:store)", "sources": ["planner (flops)"], "recompute_flops": 3e6,
         "predicted_peak_activation_bytes": 10, "step_ms": [10.0, 9.0, 11.0],
         "vs_model_choice": {"median": 1.0, "min": 1.0, "max": 1.0, "rounds": 7, "noise": False}},
        {"plan": "plan(2+save_nothing,2:store)", "sources": ["planner (flops, save_nothing only)", "x"],
         "recompute_flops": 2e6, "predicted_peak_activation_bytes": 12, "step_ms": [8.0, 7.5, 8.5],
         "vs_model_choice": {"median": 0.8, "min": 0.78, "max": 0.82, "rounds": 7, "noise": False}}],
        candidate_timing={"rounds": 7, "load_1min": [2.0, 2.5]})
    rows = candidate_rows([row])
    assert [r[3] for r in rows] == ["plan(1*3+save_nothing,1:store)", "plan(2+save_nothing,2:store)"]
    assert rows[1][4:] == ["planner (flops, save_nothing only); x", "2.0 M", "8.000 [7.500-8.500]",
                           "0.800x [0.780-0.820]", "yes"] and rows[0][-1] == ""
    md = "\n".join(candidates_markdown([row]))
    assert "over 7 rounds (process CPU time; load 2.0-2.5)" in md
    assert candidates_markdown([_row()]) == []


def test_the_choice_lines_give_the_paired_ratio_and_each_case_s_rule():
    row = _row((0.95, 0.93, 0.97))
    row["choice"], row["choice_reason"] = choose(row)
    row["planner"].update(candidate_rule="fastest beyond noise",
                          candidate_ratio={"median": 0.9, "min": 0.85, "max": 0.95, "rounds": 7, "noise": True})
    row["uniform"].update(candidate_rule="noise: least FLOPs kept",
                          candidate_ratio={"median": 0.97, "min": 0.9, "max": 1.1, "rounds": 7, "noise": True})
    assert choice_lines([row, _row(cost="flops") | {"choice": "planner", "choice_reason": "by the flops model"}]) == [
        "torch 50%: planner (measured no slower than the uniform plan (paired): 0.950x [0.930-0.970]); candidates "
        "timed whole: planner fastest beyond noise (0.900x [0.850-0.950] of the least-FLOPs candidate), uniform "
        "noise: least FLOPs kept (the least median: 0.970x [0.900-1.100])",
        "torch 50%: planner (by the flops model)"]


def test_the_measured_options_table_has_one_row_per_option_and_framework():
    times = {"store": {"forward_ms": [1.0, 0.9, 1.2], "backward_ms": [2.0, 1.9, 2.2], "segment_ms": [0.1, 0.0, 0.3],
                       "step_ms": 3.0, "rounds": 5, "lengths": [2, 4]}}
    rows = [{**_row(), "option_times": times}, {**_row(), "option_times": times}]
    assert option_rows(rows) == [["torch", "store", "1.000 [0.900-1.200]", "2.000 [1.900-2.200]",
                                  "0.100 [0.000-0.300]", "3.000"]]
    md = "\n".join(options_markdown(rows))
    assert "segments of 2 and 4 blocks, interleaved over 5 rounds" in md
    assert options_markdown([_row()]) == []
