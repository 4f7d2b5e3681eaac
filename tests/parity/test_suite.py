"""The suite survives a crashing case, and two runs agree on every number except timings."""

import pytest

from jaxremat.spec.plan import parse_plan
from parity.runners import torch_runner
from parity.inputs.presets import get_preset
from parity.cases.record import new_case, overhead_range
from parity.cases.suite import SuiteConfig, run_suite
from parity.checks.verdict import report_passed

TIMING_KEYS = {"step_time_s", "step_times_s", "time_overhead", "time_overhead_range", "case_wall_s"}


def _suite(**kw):
    return SuiteConfig(name="quick", preset=get_preset("gpt-tiny"), plans=("full", "every_k(2)", "sqrt"),
                       frameworks=("torch",), timing_repeats=1, **kw)


def test_crashing_case_is_recorded_and_the_rest_still_run(monkeypatch):
    real = torch_runner.run_plan

    def flaky(mode, cfg, params, tokens, plan, options):
        if plan.name == "every_k(2)":
            raise RuntimeError("simulated crash inside one case")
        return real(mode, cfg, params, tokens, plan, options)

    monkeypatch.setattr(torch_runner, "run_plan", flaky)
    report = run_suite(_suite())
    status = {c["plan"]: c["status"] for c in report["cases"]}
    assert status == {"none": "pass", "full": "pass", "every_k(2)": "error", "sqrt": "pass"}
    crashed = next(c for c in report["cases"] if c["plan"] == "every_k(2)")
    assert "simulated crash" in crashed["error"]
    assert not report_passed(report)


def test_two_runs_give_identical_numbers_except_timings():
    a, b = run_suite(_suite()), run_suite(_suite())
    strip = lambda r: [{k: v for k, v in c.items() if k not in TIMING_KEYS} for c in r["cases"]]  # noqa: E731
    assert strip(a) == strip(b)
    assert report_passed(a)


@pytest.mark.parametrize("plan", ["full+save_everything", "every_k(2)+save_everything"])
def test_case_of_a_policy_that_saves_everything_reports_no_recompute(plan):
    p = parse_plan(plan)
    case = new_case("torch", "eager", p.name, p, get_preset("gpt-tiny").config, "gpt-tiny")
    assert case["recomputed_blocks"] == 0 and case["predicted_unit_ratio"] == 1.0
    full = parse_plan("full")
    assert new_case("torch", "eager", "full", full, get_preset("gpt-tiny").config, "gpt-tiny")["recomputed_blocks"] == 4


def test_overhead_range_spans_every_pair_of_timed_steps():
    assert overhead_range([2.0, 3.0, 2.5], [1.0, 2.0]) == [1.0, 3.0]
    assert overhead_range([], [1.0]) is None
