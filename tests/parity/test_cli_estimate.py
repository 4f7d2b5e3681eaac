"""``python -m parity estimate``: the table, the files, ``--check`` and ``--budget`` at a tiny explicit shape;
bad input is one line and exit 2 before any compile."""

import contextlib
import io
import json
import os
from unittest import mock

import pytest

from parity.cli import estimate as cli_estimate
from parity.cli.run import main
from parity.runners.framework import FRAMEWORK_NAMES

TINY = ["--n-layer", "4", "--d-model", "16", "--n-head", "2", "--vocab", "64", "--seq-len", "16", "--batch-size", "2"]


@pytest.fixture(scope="module")
def checked_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("estimate") / "est"
    with contextlib.redirect_stdout(io.StringIO()) as printed, mock.patch.dict(os.environ, {"COLUMNS": "100"}):
        code = main(["estimate", *TINY, "--plans", "none,full,every_k(2)", "--check", "--out", str(out)])
    return code, out, printed.getvalue()


def test_estimate_check_writes_both_frameworks_rows_and_exact_checks(checked_run, capsys):
    code, out, printed = checked_run
    assert code == 0
    report = json.loads((out / "estimate.json").read_text())
    assert report["schema"] == cli_estimate.SCHEMA_VERSION and report["command"] == "estimate"
    assert report["shape"]["batch_size"] == 2 and report["shape"]["config"]["n_layer"] == 4
    assert not report["errors"]
    by_fw = {fw: [r for r in report["rows"] if r["framework"] == fw] for fw in FRAMEWORK_NAMES}
    for fw, rows in by_fw.items():
        assert [r["plan"] for r in rows] == ["none", "full", "every_k(2)"], fw
        assert rows[0]["ratio_to_none"] == 1.0 and rows[1]["total_peak_bytes"] < rows[0]["total_peak_bytes"]
    checks = report["checks"]
    assert sorted({(c["framework"], c["plan"]) for c in checks}) == sorted(
        (fw, p) for fw in FRAMEWORK_NAMES for p in ("none", "full", "every_k(2)"))
    for c in checks:  # both margins are 0 bytes: the estimate is the real step's peak to the byte
        assert c["within_margin"] and c["difference_bytes"] == 0 and c["margin_bytes"] == 0, c
        assert c["estimated_peak_bytes"] == c["measured_peak_bytes"] > 0
    md = (out / "estimate.md").read_text()
    assert "| fw | plan |" in md and "Checked against the step run for real" in md
    assert "estimate_rows" in (out / "report.html").read_text()
    printed = printed.splitlines()
    head = next(i for i, x in enumerate(printed) if x.split()[:3] == ["fw", "plan", "estimate"])
    assert [x.split()[:2] for x in printed[head + 1:head + 7]] == [[fw, p] for fw in FRAMEWORK_NAMES
                                                                   for p in ("none", "full", "every_k(2)")]
    text = "\n".join(printed)
    assert "jax: the compiled jit(value_and_grad(loss))" in text and "AdamW's state is outside" in text
    assert any(x.startswith("torch: the step's peak (AdamW's state held)") for x in printed)
    assert max(len(x) for x in printed) <= 100  # what each framework compared, folded to the width


def test_the_terminal_table_fits_100_columns(tmp_path, capsys):
    code = main(["estimate", *TINY, "--plans", "none,full", "--frameworks", "jax", "--out", str(tmp_path / "e")])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and lines and max(len(x) for x in lines) <= 100
    assert any(x.split()[:2] == ["jax", "full"] for x in lines)


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt-13b"], "--model 'gpt-13b' is not a preset"),
    (["--n-layer", "4", "--d-model", "30", "--n-head", "4", "--seq-len", "8", "--batch-size", "2"],
     "n_head (4) must divide d_model (30)"),
    (["--n-layer", "4", "--d-model", "64", "--n-head", "4", "--seq-len", "8"], "need seq_len and batch_size"),
    (["--model", "gpt2-124m", "--seq-len", "4096"], "seq_len 4096 exceeds them"),
    (["--model", "gpt2-124m", "--batch-size", "100000000"], "no device comes near"),
    (["--model", "gpt2-124m", "--plans", "every_k(0)"], "every_k"),
    (["--model", "gpt2-124m", "--plans", "segments(13)"], "segments"),
    (["--model", "gpt2-124m", "--budget", "lots"], "budget"),
    (["--model", "gpt2-124m", "--config", "x.json"], "--model and --config both given"),
    (["--model", "gpt2-124m", "--frameworks", "mxnet"], "mxnet"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_compile(argv, message, tmp_path, capsys, monkeypatch):
    def no_compile(*a, **k):
        raise AssertionError("estimated despite bad input")

    monkeypatch.setattr(cli_estimate, "get_framework", no_compile)
    assert main(["estimate", *argv, "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and message in err, err
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("taken", ["out is a file", "a report file's name is a folder, --overwrite"])
def test_a_refused_out_ends_the_command_before_the_estimate_begins(taken, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_estimate, "get_framework", lambda *a, **k: pytest.fail("estimated despite a refused --out"))
    out, extra = tmp_path / "e", []
    if taken == "out is a file":
        out.write_text("a user's file")
    else:
        (out / "estimate.json").mkdir(parents=True)
        (out / "estimate.json" / "mine.txt").write_text("a user's file")
        extra = ["--overwrite"]
    assert main(["estimate", *TINY, "--plans", "none", "--out", str(out), *extra]) == 2
    printed = capsys.readouterr()
    assert "estimating" not in printed.out + printed.err and printed.err.startswith("error: "), printed
    assert printed.err.count("\n") == 1, printed.err
    mine = out if taken == "out is a file" else out / "estimate.json" / "mine.txt"
    assert mine.read_text() == "a user's file" and sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        p.name for p in [out, *([] if taken == "out is a file" else [out / "estimate.json", mine])])


def test_a_budget_below_the_floor_is_recorded_and_exits_1(tmp_path, capsys):
    code = main(["estimate", *TINY, "--plans", "none", "--budget", "1KiB", "--frameworks", "jax",
                 "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    report = json.loads((tmp_path / "e" / "estimate.json").read_text())
    assert code == 1 and "below anything a plan reaches" in err
    assert report["errors"][0]["framework"] == "jax" and "below anything a plan reaches" in report["errors"][0]["error"]


def test_check_is_refused_where_the_real_step_would_not_fit(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_estimate, "available_memory_bytes", lambda: 1000)
    code = main(["estimate", *TINY, "--plans", "none", "--check", "--frameworks", "jax", "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert code == 1 and "--check runs the step for real" in err and "drop --check" in err
