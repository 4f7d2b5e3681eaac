"""parity.cases.sweep: a tiny depth sweep in both frameworks, its predictions, slopes, files and CLI."""

import json

import pytest

from jaxremat.models import TransformerConfig
from parity.cli.run import main
from parity.cases.sweep import SWEEP_SCHEMA_VERSION, SweepConfig, fit_slope, run_sweep

TINY = TransformerConfig(vocab_size=64, n_layer=2, d_model=16, n_head=2, d_ff=32, max_seq_len=8)


@pytest.fixture(scope="module")
def report():
    sweep = SweepConfig(depths=(2, 4), plans=("none", "full"), config=TINY, batch_size=2, seq_len=8,
                        frontier_depth=None, timing_repeats=1)
    return run_sweep(sweep)


def test_saved_bytes_equal_the_model_in_both_frameworks(report):
    cases = [c for c in report["cases"] if not c["error"]]
    assert len(cases) == 8 and report["schema"] == SWEEP_SCHEMA_VERSION == 4
    for c in cases:
        assert c["status"] == "measured" and c["compared_with"] == (None if c["plan"] == "none" else "none")
        assert c["saved_bytes"] == c["predicted_saved_bytes"], c
        assert c["peak_activation_bytes"] > 0 and c["step_time_s"] > 0 and c["peak_source"]
        assert c["peak_activation_source"] and c["offloaded_bytes"] == 0
        assert c["peak_bytes"] > c["peak_activation_bytes"]  # parameters and gradients on top
    for fw in ("jax", "torch"):
        assert report["block"][fw]["tensor_by_tensor_match"]
        assert sum(report["block"][fw]["bytes_by_name"].values()) == report["block"][fw]["measured_bytes"]


def test_slopes_and_reduction_reported(report):
    s = report["slopes"]
    for fw in ("jax", "torch"):
        assert s[fw]["none"]["saved"] > s[fw]["full"]["saved"]
        assert s[fw]["none"]["depths"] == [2, 4]
    assert report["sqrt_reduction"]["n_layer"] == 4 and report["sqrt_reduction"]["unit_model"] == 5 / 4


def test_time_ratios_come_with_their_spread(report):
    for c in report["cases"]:
        assert len(c["step_times_s"]) == 1 and c["step_time_s"] == c["step_times_s"][0]
        lo, hi = c["time_overhead_range"]
        assert lo <= c["time_overhead"] <= hi
        if c["plan"] == "none":
            assert lo == hi == 1.0


def test_markdown_rows_keep_their_columns_with_an_odd_error(report):
    import copy

    from parity.cli.sweep import markdown

    odd = copy.deepcopy(report)
    odd["cases"][1]["error"] = "RuntimeError: a | b\nsecond line"
    md = markdown(odd, {"memory_vs_depth": "m.png", "block_bytes": "b.png"})
    header = next(line for line in md.splitlines() if line.startswith("| framework | N | plan |"))
    assert "| time/none | time/none range |" in header
    rows = [line for line in md.splitlines() if line.startswith(f"| {odd['cases'][1]['framework']} | ")]
    error_row = next(r for r in rows if "error: " in r)
    assert "second line" not in md and "a \\| b" in error_row
    assert error_row.replace("\\|", "").count("|") == header.count("|")


def test_a_plan_is_measured_when_none_fails_at_its_depth(monkeypatch):
    """The sweep is a case set of the one case loop that measures: none's failure is recorded, the rest run."""
    from parity.runners.framework import get_framework

    torch_fw = get_framework("torch")
    measured = torch_fw.measure_plan

    def none_does_not_fit(cfg, tokens, plan, repeats):
        if plan.name == "none" and cfg.n_layer == 2:
            raise MemoryError("none does not fit at N=2")
        return measured(cfg, tokens, plan, repeats)

    monkeypatch.setattr(torch_fw, "measure_plan", none_does_not_fit)
    got = run_sweep(SweepConfig(depths=(1, 2), plans=("none", "full"), frameworks=("torch",), config=TINY,
                                batch_size=2, seq_len=8, frontier_depth=None, timing_repeats=1))
    by = {(c["n_layer"], c["plan"]): c for c in got["cases"]}
    assert [(c["n_layer"], c["plan"]) for c in got["cases"]] == [(1, "none"), (1, "full"), (2, "none"), (2, "full")]
    assert by[2, "none"]["status"] == "error" and by[2, "none"]["error"] == "MemoryError: none does not fit at N=2"
    assert by[2, "full"]["status"] == "measured" and by[2, "full"]["saved_bytes"] > 0
    assert "time_overhead" not in by[2, "full"] and by[1, "full"]["time_overhead"] > 0
    assert got["slopes"]["torch"]["none"]["depths"] == [1]


def test_fit_slope():
    assert fit_slope([4, 16, 64], [8, 32, 128]) == pytest.approx(1.0)
    assert fit_slope([4, 16, 64], [2, 4, 8]) == pytest.approx(0.5)
    assert fit_slope([4], [1]) is None


def test_bad_sweep_config_raises():
    with pytest.raises(ValueError, match="depths"):
        SweepConfig(depths=(4,))
    with pytest.raises(ValueError, match="frameworks"):
        SweepConfig(frameworks=("tf",))
    with pytest.raises(ValueError):
        SweepConfig(plans=("nonsense",))


def test_cli_sweep_writes_json_markdown_and_plots(tmp_path):
    rc = main(["sweep", "--depths", "1,2", "--schedules", "full", "--frameworks", "torch", "--frontier-depth", "2",
               "--frontier-plans", "full", "--repeats", "1", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert set(data["slopes"]["torch"]) == {"none", "full"}
    md = (tmp_path / "sweep.md").read_text()
    assert "report-data" in (tmp_path / "report.html").read_text()
    assert ("- not assessed: no framework of this sweep compiles a program (--frameworks torch)" in md
            and "realized" not in md)
    assert data["complete"] is True and data["environment"]["versions"]["torch"]
    for png in ("memory_vs_depth.png", "frontier.png", "block_bytes.png"):
        assert (tmp_path / png).stat().st_size > 1000 and f"({png})" in md
    assert main(["sweep", "--depths", "x"]) == 2


def test_sweep_plans_checked_against_every_depth_before_running(tmp_path):
    with pytest.raises(ValueError, match="at depth 1"):
        SweepConfig(depths=(1, 2), plans=("segments(2)",))
    SweepConfig(depths=(4, 8), plans=("nested(sqrt,every_k(2))",), frontier_depth=None)
    assert main(["sweep", "--depths", "1,2", "--schedules", "segments(2)", "--out", str(tmp_path / "a")]) == 2
    target = tmp_path / "file"
    target.write_text("mine")
    assert main(["sweep", "--depths", "1,2", "--out", str(target)]) == 2
    assert target.read_text() == "mine"
