"""``python -m parity plan``: the planner's plan for a memory budget, measured in both frameworks.

For each budget (``--budget 50%``: of ``none``'s measured peak activation bytes in each
framework; or bytes, ``--budget 12MiB``) the suite runs three cases per framework -- ``none``,
``plan(BUDGET)`` (the planner) and ``best_uniform(BUDGET)`` (the uniform plan of least recompute
that fits) -- through the one case loop (:mod:`parity.cases.budget_plan`), JAX under ``jit`` and
PyTorch eager: gradients and trained weights checked byte for byte against ``none``, saved and
peak activation bytes measured beside the prediction. ``--frontier`` sweeps budgets (10%..100%
by default) and adds PyTorch's compiler-assisted remat, ``torch.compile`` with
``torch._functorch.config.activation_memory_budget`` at the same fractions
(:mod:`torchref.compiled`), then writes ``frontier.png`` (recompute against measured peak activation).

Writes ``plan.json`` (the suite report plus ``plan_rows``, one row per framework and budget, and
``compiled`` points), ``plan.md``, ``report.html`` (:mod:`parity.report.html`), and with ``--frontier`` ``frontier.png``. Exit codes: 0 every
case passed (bitwise, within its budget), 1 a check failed, a case errored or went over budget,
2 bad input or an output directory that cannot take the files, 130 interrupted.
"""

from __future__ import annotations

# Deferred imports: the suite, torch.compile and matplotlib load only once the options are valid, so --help and
# bad input answer fast.

import dataclasses
import re

from jaxremat.models import get_model
from jaxremat.spec.planner import parse_budget

from parity.checks.verdict import report_passed
from parity.cli import checks as cc
from parity.cli.checks import check_jax_platform, out_path, unique_items
from parity.cli.util import ascii_int
from parity.inputs.presets import PRESETS, get_preset
from parity.inputs.pretrained import preset_inputs
from parity.report.environment import environment_info
from parity.report.files import WriteError, atomic_write, json_text
from parity.report.html import HTML_NAME, write_html
from parity.report.suite_report import OutputDirError
from parity.report.suite_report import markdown as suite_markdown
from rich.console import Console
from rich.table import Table
from rich.text import Text

PLAN_FILES = ("plan.json", "plan.md", "frontier.png", HTML_NAME)
DEFAULT_FRONTIER = tuple(f"{p}%" for p in range(10, 101, 10))
PLAN_SCHEMA_VERSION = 1


def add_parser(sub) -> None:
    """Register the ``plan`` subcommand on an argparse subparsers object."""
    p = sub.add_parser("plan", help="the planner's plan for a memory budget, measured in JAX and PyTorch",
                       description="Plan the least-recompute remat plan within a budget of peak activation memory, "
                       "run it beside none and the best uniform plan in JAX and PyTorch, and write plan.json/plan.md.")
    p.add_argument("--budget", default="50%",
                   help="the budget: a percentage of none's measured peak activation bytes (50%%) or bytes with a "
                   "unit (12MiB, 800KB); several, comma-separated (default: 50%%)")
    p.add_argument("--frontier", action="store_true",
                   help=f"sweep the budgets {DEFAULT_FRONTIER[0]}%..{DEFAULT_FRONTIER[-1]}% (or --budget's list if given) "
                   "and add torch.compile's activation_memory_budget at the same fractions; writes frontier.png")
    p.add_argument("--inductor", action="store_true",
                   help="compile the torch.compile points with inductor (minutes per budget here) instead of "
                   "aot_eager_decomp_partition (the same partitioner, seconds)")
    p.add_argument("--model", default="gpt-small",
                   help="model preset: " + ", ".join(PRESETS) + " (budget plans run dropout 0; --frontier: a GPT one)")
    p.add_argument("--frameworks", default="jax,torch", help="comma-separated subset of jax,torch (default: both)")
    p.add_argument("--repeats", type=ascii_int, default=None,
                   help="timed training steps per case, median reported (default: the model's, else 5)")
    p.add_argument("--out", default="plan-report",
                   help="output directory (default: plan-report/); a previous plan there is moved to "
                   "previous/<timestamp>/ unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace a previous plan in --out instead of keeping it")
    p.add_argument("--no-progress", action="store_true", help="do not show progress lines")


def plan_suite_from_args(args):
    """The suite of a ``plan`` command (:class:`parity.cases.suite.SuiteConfig`); raises ValueError."""
    from parity.cases.suite import SuiteConfig

    args.out = out_path("--out", args.out)
    budgets = unique_items("--budget", args.budget, canonical=lambda s: parse_budget(s).text)
    bare = [b for b in budgets if re.fullmatch(r"\s*[0-9]+(\.[0-9]+)?\s*", b)]
    if bare:  # plan(4096) is the segment plan of one 4096-block segment: a byte budget needs its unit
        raise ValueError(f"--budget {bare[0]}: give a unit ({bare[0].strip()}B, 12MiB) or a percentage (50%)")
    if args.frontier and args.budget == "50%":
        budgets = DEFAULT_FRONTIER
    frameworks = unique_items("--frameworks", args.frameworks)
    bad = [f for f in frameworks if f not in ("jax", "torch")]
    if bad:
        raise ValueError(f"--frameworks: unknown framework {bad[0]!r}; valid: jax, torch")
    if args.inductor and not args.frontier:
        raise ValueError("--inductor chooses the backend of the --frontier's torch.compile points; add --frontier")
    if args.frontier and any(parse_budget(b).fraction is None for b in budgets):
        raise ValueError("--frontier compares with torch.compile's activation_memory_budget, a fraction: give its "
                         "budgets as percentages (--budget 20%,50%)")
    preset = get_preset(args.model)
    spec = get_model(preset.config.arch)
    if spec.jax_planner_chain is None or spec.torch_planner_chain is None:
        raise ValueError(f"--model {args.model}: model family {spec.name!r} has no planner chain "
                         "(ModelSpec.jax_planner_chain / torch_planner_chain)")
    if args.frontier and preset.config.arch != "gpt":
        raise ValueError(f"--frontier: its torch.compile points are measured on the GPT; --model {args.model} is "
                         f"{preset.config.arch!r} (give --budget without --frontier, or a GPT preset: "
                         f"{', '.join(n for n, q in PRESETS.items() if q.config.arch == 'gpt')})")
    # budget plans are planned from menus measured without dropout: a preset's other rates are left out
    preset = dataclasses.replace(preset, dropouts=None, eager_dropouts=None, config=preset.config.replace(dropout=0.0))
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    schedules = tuple(f"{kind}({b})" for b in budgets for kind in ("plan", "best_uniform"))
    suite = SuiteConfig(name="plan", preset=preset, schedules=schedules, frameworks=frameworks,
                        timing_repeats=args.repeats or preset.repeats or 5,
                        modes=(("jax", "jit"), ("torch", "eager")),
                        **({"hparams": preset.hparams} if preset.hparams is not None else {}))
    suite.schedule_objects()
    if "jax" in frameworks:
        check_jax_platform()
    return suite, budgets


def plan_rows(report: dict, budgets) -> list[dict]:
    """One row per framework and budget: the planner's case beside the best uniform plan's."""
    by = {(c["framework"], c["schedule"]): c for c in report["cases"]}
    rows = []
    for fw in dict.fromkeys(c["framework"] for c in report["cases"]):
        for b in budgets:
            p, u = by.get((fw, f"plan({b})")), by.get((fw, f"best_uniform({b})"))
            if p is None:
                continue
            row = {"framework": fw, "budget": b, "budget_bytes": p.get("budget_bytes")}
            for key, c in (("planner", p), ("uniform", u)):
                row[key] = None if c is None else {
                    "status": c["status"], "plan": c.get("resolved_plan"), "error": c.get("error"),
                    "predicted_peak_activation_bytes": c.get("predicted_peak_activation_bytes"),
                    "peak_activation_bytes": c.get("peak_activation_bytes"),
                    "predicted_saved_bytes": c.get("predicted_saved_bytes"), "saved_bytes": c.get("saved_bytes"),
                    "within_budget": c.get("within_budget"), "grads_bitwise_equal": c.get("grads_bitwise_equal"),
                    "weights_bitwise_equal": c.get("weights_bitwise_equal"),
                    "recompute_flops": c.get("planned_recompute_flops"), "time_overhead": c.get("time_overhead"),
                    "time_overhead_range": c.get("time_overhead_range"), "attempts": len(c.get("budget_attempts") or [])}
            pf = (row["planner"] or {}).get("recompute_flops")
            uf = (row["uniform"] or {}).get("recompute_flops")
            row["recompute_vs_uniform"] = (None if pf is None or uf is None else
                                           "less" if pf < uf else "equal" if pf == uf else "more")
            rows.append(row)
    return rows


NO_FIT = "NoPlanFits"


def no_fit(case: dict) -> bool:
    """A budget case that no plan of the space is predicted to fit (its error says what would)."""
    return case["status"] == "error" and (case.get("error") or "").startswith(NO_FIT)


def plan_passed(report: dict, frontier: bool) -> bool:
    """Every case passed; on the frontier a budget that no plan fits is reported, not failed (a budget
    asked for by itself, ``--budget 10%``, that nothing fits is a failure)."""
    if not frontier:
        return report_passed(report)
    skip = {c["schedule"] for c in report["cases"] if no_fit(c)}
    kept = {**report, "cases": [c for c in report["cases"] if c["schedule"] not in skip],
            "cross_framework": [x for x in report["cross_framework"] if x["schedule"] not in skip]}
    return report_passed(kept)


def _short_error(error) -> str:
    """A budget no plan fits, in a few words (the case's error has the whole sentence)."""
    m = re.search(r"about (\d+) bytes, (\d+)% of none's", error or "")
    if error and error.startswith(NO_FIT) and m:
        return f"no plan fits: the least is about {_mib(int(m.group(1)))} ({m.group(2)}% of none's)"
    return error or "-"


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.2f} MiB"


def _gflop(n) -> str:
    return "-" if n is None else f"{n / 1e6:.1f} M"


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}"


COLUMNS = ("framework", "budget", "budget bytes", "who", "plan", "status", "grads bitwise", "peak act pred",
           "peak act", "within", "recompute FLOPs", "time/none", "tries")


def table_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        for who in ("planner", "uniform"):
            c = r[who]
            if c is None:
                continue
            out.append([r["framework"], r["budget"], _mib(r["budget_bytes"]), who, c["plan"] or _short_error(c["error"]),
                        c["status"], {True: "yes", False: "NO", None: "-"}[c["grads_bitwise_equal"]],
                        _mib(c["predicted_peak_activation_bytes"]), _mib(c["peak_activation_bytes"]),
                        {True: "yes", False: "NO", None: "-"}[c["within_budget"]], _gflop(c["recompute_flops"]),
                        _ratio(c["time_overhead"]), str(c["attempts"])])
    return out


def _grads(check: dict | None) -> str:
    """A gradient check against eager none: bitwise, ok (within its bound), WRONG, or - (not run)."""
    if not check or check.get("grads_ok") is None:
        return "-"
    if check.get("grads_bitwise_equal"):
        return "bitwise"
    return f"ok (<= {check['grads_rel_bound']:g})" if check["grads_ok"] else "WRONG"


def compiled_rows(points: list[dict]) -> list[list[str]]:
    return [[f"{p['activation_memory_budget']:g}", p.get("backend", "-"), _mib(p.get("saved_bytes")), _mib(p.get("peak_activation_bytes")),
             _gflop(p.get("recompute_flops")), _ratio(p.get("time_overhead")), _grads(p),
             "-" if p.get("max_rel_err") is None else f"{p['max_rel_err']:.1e}",
             _grads(p.get("random_op_check")) + (f" (dropout {p['random_op_check']['dropout']:g})"
                                                 if p.get("random_op_check") else ""), p.get("error") or ""]
            for p in points]


COMPILED_COLUMNS = ("activation_memory_budget", "backend", "saved", "peak act", "recompute FLOPs", "time/none",
                    "grads vs eager none", "max rel err", "grads with random ops", "error")


def markdown(report: dict) -> str:
    def md(cols, rows):
        return "\n".join(["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|",
                          *("| " + " | ".join(x.replace("|", "\\|") for x in r) + " |" for r in rows)])

    parts = [f"# Remat plans for a memory budget: {report['model']}", "",
             "Each budget is a percentage of `none`'s measured peak activation bytes in the same framework (or "
             "bytes). `planner`: the least-recompute plan of the planner's space predicted to fit, run and measured "
             "(re-planned with the target lowered by the overshoot when the measurement exceeds the budget: "
             "`tries`); `uniform`: the uniform plan of least recompute predicted to fit, measured the same way. "
             "Recompute FLOPs are the menu's (XLA's cost analysis in JAX, FlopCounterMode in PyTorch).", "",
             md(COLUMNS, table_rows(report["plan_rows"]))]
    if report.get("compiled"):
        parts += ["", "## torch.compile with activation_memory_budget (PyTorch's own compiler-assisted remat)", "",
                  "Random ops are never recomputed (`torchref.compiled_random`: below 1.0 torch's own partition "
                  "redraws dropout masks in the backward). Each point's loss and gradients are checked against eager "
                  "`none`, on the model and on it with dropout (bitwise, or within the bound of "
                  "`torchref.compiled_random.GRADS_REL_BOUND`); a point that fails says why under error and is not "
                  "plotted as an option.", "",
                  md(COMPILED_COLUMNS, compiled_rows(report["compiled"]))]
    if report.get("frontier_plot"):
        parts += ["", f"![frontier]({report['frontier_plot']})"]
    parts += ["", "## Every case", "", suite_markdown(report)]
    return "\n".join(parts) + "\n"


def print_summary(report: dict, console: Console) -> None:
    t = Table(title=Text(f"remat plans for a budget: {report['model']}"))
    for col in COLUMNS:
        t.add_column(col)
    for row in table_rows(report["plan_rows"]):
        t.add_row(*map(Text, row), style=None if row[5] == "pass" else "red")
    console.print(t)
    if report.get("compiled"):
        t = Table(title=Text("torch.compile, activation_memory_budget"))
        for col in COMPILED_COLUMNS:
            t.add_column(col)
        for row in compiled_rows(report["compiled"]):
            t.add_row(*map(Text, row))
        console.print(t)


def _compiled_points(suite, budgets, backend: str, console, progress: bool) -> list[dict]:
    """One torch.compile point per budget, random ops saved; a point whose gradients (on the model and
    on it with dropout) are not within their bound of eager none gets its reason as ``error``."""
    from torchref.compiled import measure_compiled
    from torchref.compiled_random import compiled_problem

    cfg, params, tokens = preset_inputs(suite.preset, "float32", suite.seed)
    points = []
    for b in budgets:
        frac = parse_budget(b).fraction
        if progress:
            cc.note(console, f"torch.compile {backend} activation_memory_budget={frac:g}")
        try:
            r = dataclasses.asdict(measure_compiled(cfg, params, tokens, frac, backend=backend,
                                                    repeats=suite.timing_repeats))
            # against eager none timed in the same call (same process state, same threads)
            r["time_overhead"] = (r["step_time_s"] / r["eager_step_time_s"]
                                  if r.get("eager_step_time_s") and r.get("step_time_s") else None)
            points.append({**r, "budget": b, "activation_memory_budget": frac, "error": compiled_problem(r)})
        except Exception as exc:  # recorded, and the other budgets still run
            points.append({"budget": b, "activation_memory_budget": frac, "backend": backend,
                           "error": f"{type(exc).__name__}: {exc}"})
    return points


def cmd_plan(args) -> int:
    """Run the plan command; returns the exit code."""
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    try:
        suite, budgets = plan_suite_from_args(args)
        lock, kept = cc.claim_out_dir(args.out, args.overwrite, PLAN_FILES)
    except (ValueError, OutputDirError) as exc:
        cc.error(console, exc)
        return 2
    previous = cc.install_interrupt_handler(lock)
    try:
        return _plan_locked(args, suite, budgets, console, kept, lock, environment_info(suite.frameworks))
    except WriteError as exc:
        cc.error(console, f"{exc}; the files already in {args.out} (if any) are kept whole; make room and run again")
        return 2
    finally:
        cc.restore_interrupt_handler(previous)
        lock.release()


def _plan_locked(args, suite, budgets, console, kept, lock, env) -> int:
    from parity.cases.suite import run_suite

    if kept:
        cc.note(console, kept)

    def partial(rep: dict) -> None:
        atomic_write(args.out / "plan.json", json_text({**rep, "schema": PLAN_SCHEMA_VERSION, "suite_schema": rep["schema"],
                                                        "complete": False, "environment": env}))

    def on_start(label: str) -> None:
        if not args.no_progress:
            cc.note(console, label)

    try:
        report = run_suite(suite, on_start=on_start, on_partial=partial)
        report["plan_rows"] = plan_rows(report, budgets)
        report["compiled"] = []
        if args.frontier and "torch" in suite.frameworks:
            report["compiled"] = _compiled_points(suite, budgets, "inductor" if args.inductor else
                                                  "aot_eager_decomp_partition", console, not args.no_progress)
    except KeyboardInterrupt:
        cc.note(console, f"interrupted: {args.out / 'plan.json'} holds the finished cases (complete: false)")
        cc.exit_interrupted(lock)
    report.update(schema=PLAN_SCHEMA_VERSION, suite_schema=report["schema"], complete=True, environment=env,
                  budgets=list(budgets))
    if args.frontier:
        from parity.report.plots import plot_budget_frontier

        report["frontier_plot"] = plot_budget_frontier(report, args.out / "frontier.png").name
    atomic_write(args.out / "plan.json", json_text(report))
    atomic_write(args.out / "plan.md", markdown(report))
    write_html(report, args.out)
    print_summary(report, Console(width=240) if not console.is_terminal else Console())
    cc.note(console, f"wrote {args.out / 'plan.json'}, {args.out / 'plan.md'}, {args.out / HTML_NAME}"
            + (f", {args.out / 'frontier.png'}" if args.frontier else ""))
    compiled_ok = all(p.get("error") is None for p in report["compiled"])
    if plan_passed(report, frontier=args.frontier) and compiled_ok:
        cc.note(console, "every plan fits its budget, gradients and weights bitwise equal to none", "green")
        return 0
    cc.note(console, "some plan failed a check, went over its budget or errored (see plan.md)", "bold red")
    return 1
