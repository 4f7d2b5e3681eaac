"""The main job end to end on the tiny preset: a valid report, exit codes, kept reports, bad input."""

import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from parity.cli.run import build_parser, main
from parity.report.suite_report import CASE_COLUMNS
from parity.report.suite_report import SCHEMA_VERSION

REQUIRED_CASE_KEYS = {
    "framework", "model", "plan", "n_layer", "dtype", "mode", "grads_bitwise_equal", "weights_bitwise_equal",
    "max_ulp", "max_abs_diff", "saved_bytes", "peak_bytes", "predicted_peak_units", "step_time_s",
    "time_overhead", "status", "error",
}
REQUIRED_CROSS_KEYS = {"plan", "dtype", "max_rel_err_loss", "max_rel_err_grads", "tolerance", "ok"}


# Segment plans (plan(...), gpt-tiny, N=4): bitwise, names per policy, predictions or "-".
STORED_TAIL = "plan(2,2:store)"  # no policy: the activation account predicts its saved bytes
MIXED = "plan(2+save_dots,2+mlp_only)"  # a policy per segment: the account has no prediction ("-")
UNIFORM = ("every_k(2)", "every_k(2)+save_qkv_proj")


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    """One run of the tiny preset serves every report test: two uniform plans and two segment plans."""
    out = tmp_path_factory.mktemp("report")
    rc = main(["run", "--model", "gpt-tiny", "--schedules", ",".join([*UNIFORM, STORED_TAIL, MIXED]), "--repeats", "1",
               "--no-progress", "--out", str(out)])
    return rc, out


def test_cli_run_writes_valid_report(tiny_report):
    rc, out = tiny_report
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == SCHEMA_VERSION and report["complete"] is True
    assert "report-data" in (out / "report.html").read_text()  # the page: docs/report-html.md
    cases = [c for c in report["cases"] if c["plan"] in ("none", *UNIFORM)]  # the segment plans: below
    assert {(c["framework"], c["mode"]) for c in cases} == {("jax", "jit"), ("jax", "eager"), ("torch", "eager")}
    assert {c["plan"] for c in report["cases"]} == {"none", *UNIFORM, STORED_TAIL, MIXED}
    for c in cases:
        assert REQUIRED_CASE_KEYS <= set(c), c
        # every_k(2)+save_qkv_proj saves in JAX too: its policy segments run layer by layer
        # (jaxremat.layer_pass), without the k-layer parameter slice jax.checkpoint took
        assert c["status"] == "pass", c
        assert c["grads_bitwise_equal"] is True
        if (c["framework"], c["mode"]) == ("jax", "eager"):  # training is checked under jit
            assert c["weights_bitwise_equal"] is None and c["step_time_s"] is None
        else:
            assert c["weights_bitwise_equal"] is True and c["step_time_s"] > 0
        assert c["peak_bytes"] > 0 and c["saved_bytes"] > 0
        assert not {"residual_bytes", "residual_ratio"} & set(c) and "saved_ratio" in c  # one name per quantity
        if c["plan"] != "none":  # none is the reference: it promises no saving and has no "saving" entry
            assert "residual_ratio" not in c["saving"] and "saved_ratio" in c["saving"]
    for x in report["cross_framework"]:
        assert REQUIRED_CROSS_KEYS <= set(x) and x["ok"], x
    assert rc == 1  # MIXED's JAX no_saving cases fail the run (the segment-plan test below)
    md = (out / "report.md").read_text()
    assert "| framework |" in md and "JAX vs PyTorch" in md


def test_cli_report_shows_verdict_spread_and_environment(tiny_report):
    _, out = tiny_report
    report = json.loads((out / "report.json").read_text())
    verdict = (out / "report.md").read_text().splitlines()[2]
    # 5 plans x 3 (framework, mode); MIXED saves nothing in JAX (jit and eager)
    assert verdict.startswith("**Verdict: FAIL** - 13 of 15 cases passed, 2 saved no memory; "
                              "JAX vs PyTorch within tolerance in 5 of 5"), verdict
    env = report["environment"]
    assert env["cpu_count"] == os.cpu_count() and env["platform"] and env["cpu_model"]
    assert {"jax", "jaxlib", "flax", "torch", "numpy"} <= set(env["versions"]) and env["versions"]["jax"]
    import jax

    assert env["devices"] == {"jax": [f"{d.platform}: {d.device_kind}" for d in jax.devices()], "torch": ["cpu"]}
    for c in report["cases"]:
        if c["step_time_s"] is None:
            assert c["time_overhead_range"] is None
            continue
        lo, hi = c["time_overhead_range"]
        assert len(c["step_times_s"]) == 1 and lo <= c["time_overhead"] <= hi, c
    row = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("| jax | jit |"))
    assert row.count("|") == len(CASE_COLUMNS) + 1


def test_report_doc_case_tables_have_the_report_columns():
    docs = Path(__file__).parents[2] / "docs"
    headers = [line for path in sorted(docs.glob("*.md")) for line in path.read_text().splitlines()
               if line.startswith("| framework | mode | dtype |")]
    names = tuple(c.header for c in CASE_COLUMNS)
    with_dropout = names[:3] + ("dropout",) + names[3:]
    allowed = {"| " + " | ".join(cols) + " |" for cols in (names, with_dropout)}
    assert headers and set(headers) <= allowed, headers
    assert "| " + " | ".join(names) + " |" in (docs / "report.md").read_text()


def _readme_commands():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    inline = re.findall(r"`((?:python -m parity|pip install)[^`]*)`", readme)
    options = ["python -m parity run " + o for o in re.findall(r"`(--[a-z][^` ]* [^`]+)`", readme)]  # `--dtype float32`
    return [c.strip() for c in blocks + inline + options]


@pytest.mark.parametrize("command", _readme_commands())
def test_readme_commands_are_valid_bash_and_options(command):
    assert subprocess.run(["bash", "-n", "-c", command], capture_output=True).returncode == 0, command
    for part in command.split("&&"):
        words = shlex.split(part)
        if words[:3] == ["python", "-m", "parity"] and len(words) > 3 and not {"--no-deps", "--help"} & set(words):
            build_parser().parse_args(words[3:])  # every option exists and takes its value


def test_cli_remat_saves_less_than_none(tiny_report):
    _, out = tiny_report
    cases = json.loads((out / "report.json").read_text())["cases"]
    for fw, mode in (("jax", "jit"), ("torch", "eager")):
        by = {c["plan"]: c for c in cases if c["framework"] == fw and c["mode"] == mode}
        assert by["every_k(2)"]["saved_bytes"] < by["none"]["saved_bytes"], fw
        sel = by["every_k(2)+save_qkv_proj"]
        assert by["every_k(2)"]["saved_bytes"] < sel["saved_bytes"] < by["none"]["saved_bytes"], fw
        assert sel["names_ok"] is True and sel["block_names"]["kept"] == ["qkv_proj"], fw


def test_cli_keeps_previous_report(tmp_path, monkeypatch):
    (tmp_path / "report.json").write_text('{"mine": 1}')
    monkeypatch.chdir(tmp_path.parent)  # --out as a user gives it: a relative folder
    monkeypatch.setenv("COLUMNS", "80")
    terminal = io.StringIO()  # standard output and standard error in the order a terminal shows them
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    # progress left on: to a file or a pipe it draws nothing, and leaves no empty line before the verdict
    rc = main(["run", "--model", "gpt-tiny", "--schedules", "full", "--frameworks", "torch", "--repeats", "1",
               "--out", tmp_path.name])
    assert rc == 0
    kept = list((tmp_path / "previous").glob("*/report.json"))
    assert len(kept) == 1 and kept[0].read_text() == '{"mine": 1}'
    lines = terminal.getvalue().splitlines()
    assert max(map(len, lines)) <= 80, [x for x in lines if len(x) > 80]  # the notice folds to the terminal's width, as the tables do
    assert lines[0].startswith("Verdict: PASS"), lines[:3]  # the verdict first; the notice at the end
    notice = " ".join(" ".join(lines).split()).split("previous report kept in", 1)
    assert "Verdict" in notice[0] and "JAX vs PyTorch" not in notice[1], lines
    assert notice[1].startswith(f" {tmp_path.name}/previous/{kept[0].parent.name} (use --overwrite"), notice[1]
    assert (tmp_path / "report.json").stat().st_mode & 0o044 == 0o044  # readable by others, not 0600
    assert json.loads((tmp_path / "report.json").read_text())["schema"] == SCHEMA_VERSION


@pytest.mark.parametrize("args, message", [
    (["--schedules", "every_k(0)"], "k"),
    (["--schedules", "segments(9)", "--model", "gpt-tiny"], "s"),
    (["--schedules", "sqrtt"], "valid schedules"),
    (["--schedules", "full+save_dotz"], "valid policies"),
    (["--schedules", "full+save_names(qkv)"], "known names"),
    (["--schedules", "none+save_dots"], "no effect"),
    (["--schedules", "nested(sqrt)"], "two schedules"),
    (["--schedules", "full,,sqrt"], "empty item"),
    (["--schedules", "segments(1)+save_dots"], "checkpoints no segment"),
    (["--schedules", "full+save_names(block_input)"], "cannot keep 'block_input'"),
    (["--dtype", "float16"], "dtype"),
    (["--model", "gpt-huge"], "valid models"),
    (["--frameworks", "mxnet"], "framework"),
    (["--seed", "-1"], "--seed"),
])
def test_cli_bad_input_exits_2_without_traceback(tmp_path, args, message, capsys):
    # in process (an exception escaping main would fail the test); test_cli_unwritable_out_dir runs the real process
    assert main(["run", "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()  # refused before any work


def test_cli_unwritable_out_dir(tmp_path, capsys):
    # in process (a fresh `python -m parity` costs ~5 s of imports before this check); the entry point's
    # one-line errors without a traceback are checked in subprocesses by tests/parity/test_cli_faults.py
    target = tmp_path / "file"
    target.write_text("not a dir")
    assert main(["run", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert "not a directory" in err and "Traceback" not in err and err.count("\n") == 1
    assert target.read_text() == "not a dir"


def test_cli_cannot_keep_previous_report_is_an_error_not_a_loss(tmp_path, capsys):
    # in process, as the bad-input cases above; test_cli_unwritable_out_dir runs the real process
    (tmp_path / "report.json").write_text('{"mine": 1}')
    (tmp_path / "previous").write_text("a file where the archive folder would go")
    assert main(["run", "--frameworks", "torch", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "previous report" in err and len(err.strip().splitlines()) == 1, err
    assert (tmp_path / "report.json").read_text() == '{"mine": 1}'


def test_segment_plans_run_bitwise_with_their_policies_checked(tiny_report):
    rc, out = tiny_report
    report, md = json.loads((out / "report.json").read_text()), (out / "report.md").read_text()
    cases = [c for c in report["cases"] if c["plan"] in ("none", STORED_TAIL, MIXED)]
    assert {c["plan"] for c in cases} == {"none", STORED_TAIL, MIXED}
    for c in cases:
        assert c["grads_bitwise_equal"] is True and c["loss_bitwise_equal"] is True, c
        assert c["weights_bitwise_equal"] is (None if (c["framework"], c["mode"]) == ("jax", "eager") else True), c
        if c["plan"] == MIXED:
            assert c["policy"] == "save_dots,mlp_only" and c["names_ok"] is True
            assert [b["policy"] for b in c["block_names"]] == ["save_dots", "mlp_only"]
            assert [e["policy"] for e in c["expected_names"]] == ["save_dots", "mlp_only"]
            assert c["predicted_saved_bytes"] is None  # the account does not model policies: "-"
            assert c["recomputed_blocks"] == 4 and c["predicted_peak_units"] == 4
        if c["plan"] == MIXED and c["framework"] == "jax":
            # measured: on gpt-tiny a policy segment's 2-layer parameter slice and gradient slice outweigh what
            # the policies save (as for every_k(2)+save_qkv_proj in tests/parity/test_cli.py)
            assert c["status"] == "no_saving" and c["saving"]["cause"], c
        else:
            assert c["status"] == "pass", c
        if c["plan"] == STORED_TAIL:
            assert c["policy"] == "save_nothing" and c["saved_bytes"] == c["predicted_saved_bytes"], c
    cross = [x for x in report["cross_framework"] if x["plan"] in ("none", STORED_TAIL, MIXED)]
    assert all(x["ok"] for x in cross) and len(cross) == 3
    assert rc == 1  # the JAX no_saving cases fail the run
    assert "| mlp_only | torch | yes |" in md and "| save_dots | jax | yes |" in md


def test_segment_plan_that_does_not_fit_the_model_is_refused_before_running(tmp_path, capsys):
    rc = main(["run", "--model", "gpt-tiny", "--schedules", "plan(3,3)", "--no-progress", "--out", str(tmp_path)])
    assert rc == 2
    assert "the segment lengths sum to 6 blocks but the stack has n_layer=4" in capsys.readouterr().err
