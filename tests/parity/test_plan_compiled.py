"""``plan --frontier``'s torch.compile points: a point whose gradients fail their check is shown failing
(table and plan.md) and left off the frontier's line (drawn apart), from a recorded report."""

import copy
import json
from pathlib import Path

import parity.report.plots as plots
from parity.report.plan_report import COMPILED_COLUMNS, compiled_rows, markdown

REPORT = json.loads((Path(__file__).parent / "data" / "plan_frontier.json").read_text())
CHECK_OK = {"dropout": 0.1, "random_ops": "save", "random_ops_in_graph": 25, "random_ops_recomputed": 0,
            "grads_bitwise_equal": False, "max_ulp": 1476952064, "max_rel_err": 4.1e-7, "grads_rel_bound": 1e-4,
            "grads_ok": True}
WRONG = "gradients wrong with dropout 0.1: max rel err 0.68 against eager none, bound 0.0001"


def _report_with_one_failing_point() -> dict:
    report = copy.deepcopy(REPORT)
    for p in report["compiled"]:
        p.update(grads_ok=True, grads_rel_bound=1e-4, random_op_check=dict(CHECK_OK))
    bad = report["compiled"][3]
    bad["random_op_check"].update(random_ops_recomputed=25, max_rel_err=0.68, grads_ok=False)
    bad["error"] = WRONG
    return report


def test_failing_point_is_shown_failing_in_the_table_and_plan_md():
    report = _report_with_one_failing_point()
    rows = compiled_rows(report["compiled"])
    col = {c: i for i, c in enumerate(COMPILED_COLUMNS)}
    assert [r[col["grads with random ops"]] for r in rows[2:5]] == ["ok (<= 0.0001) (dropout 0.1)", "WRONG (dropout 0.1)",
                                                                  "ok (<= 0.0001) (dropout 0.1)"]
    assert rows[3][col["error"]] == WRONG and rows[2][col["error"]] == ""
    assert rows[2][col["grads vs eager none"]] == "ok (<= 0.0001)"
    assert WRONG in markdown(report)


def test_failing_point_is_not_on_the_frontier_line(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    report = _report_with_one_failing_point()
    plots.plot_budget_frontier(report, tmp_path / "frontier.png")
    ax = figures[0].axes[0]
    (line,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("torch.compile")]
    bad = report["compiled"][3]
    assert len(line.get_xdata()) == len(report["compiled"]) - 1
    assert bad["peak_activation_bytes"] / 2**20 not in list(line.get_xdata())
    (wrong,) = [c for c in ax.collections if "gradients wrong" in c.get_label()]
    assert wrong.get_offsets().tolist() == [[bad["peak_activation_bytes"] / 2**20, bad["recompute_flops"] / 1e6]]
