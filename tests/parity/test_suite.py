"""The suite survives a crashing case, and two runs agree on every number except timings."""

from parity import torch_runner
from parity.models import get_preset
from parity.suite import SuiteConfig, report_passed, run_suite

TIMING_KEYS = {"step_time_s", "time_overhead", "case_wall_s"}


def _suite(**kw):
    return SuiteConfig(name="quick", preset=get_preset("gpt-tiny"), schedules=("full", "every_k(2)", "sqrt"),
                       frameworks=("torch",), timing_repeats=1, **kw)


def test_crashing_case_is_recorded_and_the_rest_still_run(monkeypatch):
    real = torch_runner.run_schedule

    def flaky(cfg, params, tokens, schedule, **kw):
        if schedule.name == "every_k(2)":
            raise RuntimeError("simulated crash inside one case")
        return real(cfg, params, tokens, schedule, **kw)

    monkeypatch.setattr(torch_runner, "run_schedule", flaky)
    report = run_suite(_suite())
    status = {c["schedule"]: c["status"] for c in report["cases"]}
    assert status == {"none": "pass", "full": "pass", "every_k(2)": "error", "sqrt": "pass"}
    crashed = next(c for c in report["cases"] if c["schedule"] == "every_k(2)")
    assert "simulated crash" in crashed["error"]
    assert not report_passed(report)


def test_two_runs_give_identical_numbers_except_timings():
    a, b = run_suite(_suite()), run_suite(_suite())
    strip = lambda r: [{k: v for k, v in c.items() if k not in TIMING_KEYS} for c in r["cases"]]  # noqa: E731
    assert strip(a) == strip(b)
    assert report_passed(a)
