"""The plan command's report: plan.md, the terminal's tables and lines (:mod:`parity.cli.plan` runs the command).

A plan row (:func:`parity.cli.plan.plan_rows`) holds one framework and budget: the planner's case and the best uniform
plan's; ``compiled`` points are PyTorch's ``torch.compile`` with ``activation_memory_budget``.
"""

from __future__ import annotations

import re

from rich.console import Console
from rich.text import Text

from parity.checks.timing import MEASURE_COMMAND
from parity.cli import plan_choice as pc
from parity.report.format import fmt_bit, fmt_bytes, fmt_ratio, fmt_time_ratio, md_table
from parity.report.suite_report import markdown as suite_markdown
from parity.report.terminal import fitted_table, name_table

KINDS_WHO = ("planner", "uniform")
"""A plan row's two cases, the planner's plan and the uniform plan (:func:`parity.cli.plan.plan_rows`)."""

NO_FIT = "NoPlanFits"


def no_fit(case: dict) -> bool:
    """A budget case that no plan of the space is predicted to fit (its error says what would)."""
    return case["status"] == "error" and (case.get("error") or "").startswith(NO_FIT)


def unfit_budgets(report: dict) -> list[str]:
    """The budgets of the plan rows that no plan fits (the frontier reports them; :func:`plan_passed`)."""
    return list(dict.fromkeys(r["budget"] for r in report.get("plan_rows", ()) for who in KINDS_WHO
                              if r[who] is not None and r[who]["plan"] is None and no_fit(r[who])))


def passed_line(report: dict) -> str:
    """The last line of a plan run that passed: what fits, and on the frontier the budgets nothing fits."""
    unfit = unfit_budgets(report)
    if not unfit:
        return "every plan fits its budget, gradients and weights bitwise equal to none"
    return (f"every plan found fits its budget, gradients and weights bitwise equal to none; no plan fits "
            f"{', '.join(unfit)} (the least reachable peak is in the table's error lines)")


def _short_error(error) -> str:
    """A budget no plan fits, in a few words (the case's error has the whole sentence)."""
    m = re.search(r"(?:about|the least reachable is) (\d+) bytes, (\d+)% of none's", error or "")
    if error and error.startswith(NO_FIT) and m:
        return f"no plan fits: the least reachable is {fmt_bytes(int(m.group(1)))} ({m.group(2)}% of none's)"
    return error or "-"


def _mflop(n) -> str:
    return "-" if n is None else f"{n / 1e6:.1f} M"


COLUMNS = ("framework", "budget", "budget bytes", "cost", "who", "plan", "status", "grads bitwise", "peak act pred",
           "peak act", "within", "recompute FLOPs", "stack ms pred", "time/none", "chosen", "tries")


TIME_NOTE = f"step times here are a few steps, not interleaved; measure the overhead with `{MEASURE_COMMAND}`"


def table_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        for who in KINDS_WHO:
            c = r[who]
            if c is None:
                continue
            pred_s = c.get("predicted_step_time_s")
            out.append([r["framework"], r["budget"], fmt_bytes(r["budget_bytes"]), r.get("cost") or "-", who,
                        c["plan"] or _short_error(c["error"]), c["status"], fmt_bit(c["grads_bitwise_equal"]),
                        fmt_bytes(c["predicted_peak_activation_bytes"]), fmt_bytes(c["peak_activation_bytes"]),
                        fmt_bit(c["within_budget"]), _mflop(c["recompute_flops"]),
                        "-" if pred_s is None else f"{1e3 * pred_s:.1f}",
                        fmt_time_ratio(c["time_overhead"], c.get("time_overhead_range")),
                        "yes" if r.get("choice") == who else "", str(c["attempts"])])
    return out


def _grads(check: dict | None) -> str:
    """A gradient check against eager none: bitwise, ok (within its bound), WRONG, or - (not run)."""
    if not check or check.get("grads_ok") is None:
        return "-"
    if check.get("grads_bitwise_equal"):
        return "bitwise"
    return f"ok (<= {check['grads_rel_bound']:g})" if check["grads_ok"] else "WRONG"


def compiled_rows(points: list[dict]) -> list[list[str]]:
    return [[f"{p['activation_memory_budget']:g}", p.get("backend", "-"), fmt_bytes(p.get("saved_bytes")),
             fmt_bytes(p.get("peak_activation_bytes")), _mflop(p.get("recompute_flops")), fmt_ratio(p.get("time_overhead")),
             _grads(p), "-" if p.get("max_rel_err") is None else f"{p['max_rel_err']:.1e}",
             _grads(p.get("random_op_check")) + (f" (dropout {p['random_op_check']['dropout']:g})"
                                                 if p.get("random_op_check") else ""), p.get("error") or ""]
            for p in points]


COMPILED_COLUMNS = ("activation_memory_budget", "backend", "saved", "peak act", "recompute FLOPs", "time/none",
                    "grads vs eager none", "max rel err", "grads with random ops", "error")


def markdown(report: dict) -> str:
    """plan.md: the plan rows, the torch.compile points, the frontier plot, then the suite report of every case."""
    parts = [f"# Remat plans for a memory budget: {report['model']}", "",
             "Each budget is a percentage of `none`'s measured peak activation bytes in the same framework (or "
             "bytes). `planner`: the plan of least cost (`cost`) in the planner's space predicted to fit, run and measured "
             "(re-planned with the target lowered by the overshoot when the measurement exceeds the budget: "
             "`tries`); `uniform`: the uniform plan of least cost predicted to fit, measured the same way. "
             "Recompute FLOPs are the menu's (XLA's cost analysis in JAX, FlopCounterMode in PyTorch). "
             "`cost`: what both plans minimize (`time`: measured time, in PyTorch the blocks' measured times, `stack ms "
             "pred` their sum for the plan, in JAX candidate plans timed whole; `flops`: the recompute FLOPs). "
             f"`time/none` is `noise` where its range is wider than its distance from 1 ({TIME_NOTE}). `chosen`: "
             "the plan to use (`parity.cli.plan_choice.choose`: the planner's, unless its case failed or it measured "
             "slower than the uniform plan beyond the noise, the two timed against each other; a noise ratio decides "
             "nothing).", "",
             md_table(COLUMNS, table_rows(report["plan_rows"])), "",
             *[f"- {line}" for line in pc.choice_lines(report["plan_rows"])],
             *pc.paired_markdown(report["plan_rows"]), *pc.candidates_markdown(report["plan_rows"]),
             *pc.options_markdown(report["plan_rows"])]
    if report.get("compiled"):
        parts += ["", "## torch.compile with activation_memory_budget (PyTorch's own compiler-assisted remat)", "",
                  "Random ops are never recomputed (`torchref.compiled_random`: below 1.0 torch's own partition "
                  "redraws dropout masks in the backward). Each point's loss and gradients are checked against eager "
                  "`none`, on the model and on it with dropout (bitwise, or within the bound of "
                  "`torchref.compiled_random.GRADS_REL_BOUND`); a point that fails says why under error and is not "
                  "plotted as an option.", "",
                  md_table(COMPILED_COLUMNS, compiled_rows(report["compiled"]))]
    if report.get("frontier_plot"):
        parts += ["", f"![frontier]({report['frontier_plot']})"]
    parts += ["", "## Every case", "", suite_markdown(report)]
    return "\n".join(parts) + "\n"


TERMINAL_COLUMNS = ("framework", "budget", "who", "plan", "status", "peak act", "time/none", "chosen")
"""The plan table's columns on the terminal without ``--wide`` (a subset of :data:`COLUMNS`; ``status`` pass is
bitwise and within the budget; ``framework`` is headed ``fw``; ``time/none`` without its range). Below the table:
each row's choice with the paired ratio and why (:func:`parity.cli.plan_choice.choice_lines`), then errors."""


def print_summary(report: dict, console: Console, wide: bool = False) -> None:
    """The plan rows (``wide``: every column of :data:`COLUMNS`), plan names broken only after ``+`` or ``,``
    (:func:`parity.report.terminal.name_table`), the choices and errors, and the torch.compile points, within the
    terminal's width."""
    keep = [i for i, c in enumerate(COLUMNS) if wide or c in TERMINAL_COLUMNS]
    rows, cases = table_rows(report["plan_rows"]), [(r, w) for r in report["plan_rows"] for w in KINDS_WHO if r[w]]
    plan, status, time = COLUMNS.index("plan"), COLUMNS.index("status"), COLUMNS.index("time/none")
    shown = [[("-" if r[w]["plan"] is None else row[i]) if i == plan else row[i] if wide or i != time else
              fmt_time_ratio(r[w]["time_overhead"], r[w].get("time_overhead_range"), False) for i in keep]
             for row, (r, w) in zip(rows, cases)]  # time/none's range: --wide and plan.md
    heads = [COLUMNS[i] if wide or COLUMNS[i] != "framework" else "fw" for i in keep]
    console.print(name_table(console, f"remat plans for a budget: {report['model']}", heads, shown,
                             [keep.index(plan)], left=[True] * 5, styles=[None if row[status] == "pass" else "red"
                                                                       for row in rows]))
    for line in pc.choice_lines(report["plan_rows"]):
        console.print(Text(line))
    for r, who in cases:
        if r[who]["plan"] is None:
            console.print(Text(f"{r['framework']} {r['budget']} {who}: {_short_error(r[who]['error'])}", style="red"))
    if any(row[COLUMNS.index("time/none")].startswith("noise") for row in rows):
        console.print(Text(f"time/none: noise where its range is wider than its distance from 1; {TIME_NOTE}"))
    if report.get("compiled"):
        print_compiled(report["compiled"], console, wide)


COMPILED_TERMINAL = {"activation_memory_budget": "memory budget", "saved": "saved", "peak act": "peak act",
                     "recompute FLOPs": "recompute", "time/none": "time/none", "grads vs eager none": "grads vs none",
                     "grads with random ops": "with dropout"}
"""The torch.compile table's columns on the terminal without ``--wide`` and their headers there (the backend goes
in the title, a point's error on a line of its own below)."""


def print_compiled(points: list[dict], console: Console, wide: bool = False) -> None:
    """The torch.compile points within the terminal's width (``wide``: every column of :data:`COMPILED_COLUMNS`)."""
    rows = compiled_rows(points)
    backends = list(dict.fromkeys(p.get("backend", "-") for p in points))
    keep = [i for i, c in enumerate(COMPILED_COLUMNS)
            if wide or c in COMPILED_TERMINAL or (c == "backend" and len(backends) > 1)]
    heads = [COMPILED_COLUMNS[i] if wide else COMPILED_TERMINAL.get(COMPILED_COLUMNS[i], COMPILED_COLUMNS[i])
             for i in keep]
    console.print(fitted_table(f"torch.compile ({', '.join(backends)}), activation_memory_budget", heads,
                               [[row[i] for i in keep] for row in rows], left=[True],
                               styles=[None if p.get("error") is None else "red" for p in points]))
    if not wide:
        for p in points:
            if p.get("error"):
                console.print(Text(f"torch.compile {p['activation_memory_budget']:g}: {p['error']}", style="red"))
