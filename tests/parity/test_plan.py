"""The plan command's rows (parity.cli.plan): one source for each row's cost, in plan.json and plan.md."""

import types

from parity.cli.plan import plan_rows
from parity.report.plan_report import COLUMNS, table_rows


def _errored(plan: str) -> dict:
    return {"framework": "jax", "plan": plan, "status": "error", "error": "NoPlanFits: no plan fits"}


def test_an_errored_row_carries_the_cost_planned_on_in_plan_json_and_plan_md():
    report = {"model": "gpt-tiny", "cases": [_errored("budget(10%)"), _errored("best_uniform(10%)")],
              "cross_framework": []}
    rows = plan_rows(report, ["10%"], types.SimpleNamespace(planner_cost="time"))
    assert len(rows) == 1 and rows[0]["cost"] == "time" and rows[0]["choice"] == "none"
    cells = table_rows(rows)  # plan.md's table (parity.report.plan_report.markdown) and the terminal's
    assert [c[COLUMNS.index("cost")] for c in cells] == ["time", "time"]
    # without the suite the cases' own record is the source, and a row that has none says so
    assert plan_rows(report, ["10%"])[0]["cost"] is None
    assert table_rows(plan_rows(report, ["10%"]))[0][COLUMNS.index("cost")] == "-"
