"""``python -m parity plan``: the planner's plan for a memory budget, measured in both frameworks.

For each budget (``--budget 50%``: of ``none``'s measured peak activation bytes in each
framework; or bytes, ``--budget 12MiB``) the suite runs three cases per framework -- ``none``,
``budget(BUDGET)`` (the planner) and ``best_uniform(BUDGET)`` (the uniform plan of least cost
that fits; ``--cost time``, the default for a GPT: measured time -- in PyTorch each block option's, in JAX a
handful of candidate plans timed whole (:attr:`parity.runners.framework.FrameworkInfo.time_cost`) --, ``--cost
flops``: the recompute FLOPs) -- through the one case loop (:mod:`parity.cases.budget_plan`), JAX under ``jit`` and
PyTorch eager: gradients and trained weights checked byte for byte against ``none``, saved and
peak activation bytes measured beside the prediction. ``--frontier`` sweeps budgets (10%..100%
by default) and adds PyTorch's compiler-assisted remat, ``torch.compile`` with
``torch._functorch.config.activation_memory_budget`` at the same fractions
(:mod:`torchref.compiled`; :meth:`parity.runners.framework.Framework.compiler_budget_points`), then writes
``frontier.png`` (recompute and measured step time, with its range, against measured peak activation).
The planner's plan and the uniform plan are then timed against each other, interleaved
(:func:`parity.cli.plan_choice.paired_times`), and each row says which plan to use (:mod:`parity.cli.plan_choice`;
a time ratio marked noise never decides).

Writes ``plan.json`` (the suite report plus ``plan_rows``, one row per framework and budget, and
``compiled`` points), ``plan.md``, ``report.html`` (:mod:`parity.report.html`), and with ``--frontier`` ``frontier.png``. Exit codes: 0 every
case passed (bitwise, within its budget), 1 a check failed, a case errored or went over budget,
2 bad input or an output directory that cannot take the files, 130 interrupted.
"""

from __future__ import annotations

# Deferred imports: matplotlib (the frontier plot) loads once the plans have run, so --help and bad input
# answer fast.

import dataclasses

from jaxremat.models import get_model
from jaxremat.spec.planner import COSTS, parse_budget

from parity.cases.suite import SuiteConfig, run_suite
from parity.checks.verdict import report_passed
from parity.cli import checks as cc
from parity.cli.budget import check_fits, run_estimate
from parity.cli import plan_choice as pc
from parity.cli.command import checked, claimed, make_console
from parity.cli.util import ascii_int
from parity.inputs.model_preset import with_shape
from parity.inputs.presets import PRESETS, get_preset
from parity.inputs.pretrained import preset_inputs
from parity.report.environment import environment_info
from parity.report.files import atomic_write, json_text
from parity.report.html import HTML_NAME, write_html
from parity.report.plan_report import markdown, no_fit, passed_line, print_summary
from parity.report.terminal import terminal_console
from parity.runners.framework import FRAMEWORK_NAMES, FRAMEWORKS, get_framework

PLAN_FILES = ("plan.json", "plan.md", "frontier.png", HTML_NAME)
TIMED_FAMILIES = ("gpt",)
"""Model families whose block options the frameworks time (``planner_chain(..., cost="time")``)."""
KINDS = ("budget", "best_uniform")
"""The two cases of each budget: the planner's plan, the best uniform plan (:mod:`parity.cases.budget_plan`)."""
DEFAULT_FRONTIER = tuple(f"{p}%" for p in range(10, 101, 10))
PLAN_SCHEMA_VERSION = 5
"""plan.json schema (each version's changes: docs/report-schema.md): 5 gives each plan row the ``cost`` planned on
where a case errored too, and per plan ``candidate_rule`` and ``candidate_ratio``; 4 ``paired`` and ``candidates``;
3 ``cost``, ``option_times``, ``choice``; 2 ``budget(50%)``."""


def add_parser(sub) -> None:
    """Register the ``plan`` subcommand on an argparse subparsers object."""
    p = sub.add_parser("plan", help="the planner's plan for a memory budget, measured in JAX and PyTorch",
                       description="Plan the remat plan of least measured time (or recompute) within a budget of peak activation memory, "
                       "run it beside none and the best uniform plan in JAX and PyTorch, and write plan.json, plan.md and report.html.")
    p.add_argument("--budget", default="50%",
                   help="the budget: a percentage of none's measured peak activation bytes (50%%) or bytes with a "
                   "unit (12MiB, 800KB); several, comma-separated (default: 50%%)")
    p.add_argument("--frontier", action="store_true",
                   help=f"sweep the budgets {DEFAULT_FRONTIER[0]}%..{DEFAULT_FRONTIER[-1]}% (or --budget's list if given) "
                   "and add torch.compile's activation_memory_budget at the same fractions; writes frontier.png")
    p.add_argument("--inductor", action="store_true",
                   help="compile the torch.compile points with inductor (minutes per budget here) instead of "
                   "aot_eager_decomp_partition (the same partitioner, seconds)")
    p.add_argument("--cost", choices=COSTS, default=None,
                   help="what the planner (and the best uniform plan) minimize: time, measured once per shape (the "
                   "default for a GPT: in PyTorch each block option's forward and backward time, in JAX a handful of "
                   "candidate plans timed whole), or flops, the recompute FLOPs (the default for a model whose blocks "
                   "are not timed)")
    p.add_argument("--model", default="gpt-small",
                   help="model preset: " + ", ".join(PRESETS) + " (budget plans run dropout 0; --frontier: a GPT one)")
    p.add_argument("--batch-size", type=ascii_int, default=None, help="B, sequences per step (default: the model's)")
    p.add_argument("--seq-len", type=ascii_int, default=None, help="T, tokens per sequence (default: the model's)")
    p.add_argument("--frameworks", default=",".join(FRAMEWORK_NAMES),
                   help=f"comma-separated subset of {','.join(FRAMEWORK_NAMES)} (default: all)")
    p.add_argument("--repeats", type=ascii_int, default=None,
                   help="timed training steps per case, median reported (default: the model's, else 5)")
    p.add_argument("--out", default="plan-report",
                   help="output directory (default: plan-report/); a previous plan there is moved to "
                   "previous/<timestamp>/ unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace a previous plan in --out instead of keeping it")
    p.add_argument("--no-progress", action="store_true", help="do not show progress lines")
    p.add_argument("--wide", action="store_true", help="print every column of the plan table (plan.md has them all)")


def plan_suite_from_args(args):
    """The suite of a ``plan`` command (:class:`parity.cases.suite.SuiteConfig`); raises ValueError."""
    args.out = cc.out_path("--out", args.out)
    budgets = cc.unique_items("--budget", args.budget, canonical=lambda s: parse_budget(s).text)
    if args.frontier and args.budget == "50%":
        budgets = DEFAULT_FRONTIER
    frameworks = cc.frameworks_option(args.frameworks)
    if args.inductor and not args.frontier:
        raise ValueError("--inductor chooses the backend of the --frontier's torch.compile points; add --frontier")
    if args.frontier and any(parse_budget(b).fraction is None for b in budgets):
        raise ValueError("--frontier compares with torch.compile's activation_memory_budget, a fraction: give its "
                         "budgets as percentages (--budget 20%,50%)")
    preset = with_shape(get_preset(args.model), args.batch_size, args.seq_len)
    spec = get_model(preset.config.arch)
    if spec.jax_planner_chain is None or spec.torch_planner_chain is None:
        raise ValueError(f"--model {args.model}: model family {spec.name!r} has no planner chain "
                         "(ModelSpec.jax_planner_chain / torch_planner_chain)")
    if args.frontier and preset.config.arch != "gpt":
        raise ValueError(f"--frontier: its torch.compile points are measured on the GPT; --model {args.model} is "
                         f"{preset.config.arch!r} (give --budget without --frontier, or a GPT preset: "
                         f"{', '.join(n for n, q in PRESETS.items() if q.config.arch == 'gpt')})")
    cost = args.cost or ("time" if preset.config.arch in TIMED_FAMILIES else "flops")
    if cost == "time" and preset.config.arch not in TIMED_FAMILIES:
        raise ValueError(f"--cost time: block options are timed for the {', '.join(TIMED_FAMILIES)} family only; "
                         f"--model {args.model} is {preset.config.arch!r}: give --cost flops")
    # budget plans are planned from menus measured without dropout: a preset's other rates are left out
    preset = dataclasses.replace(preset, dropouts=None, eager_dropouts=None, config=preset.config.replace(dropout=0.0))
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    plans = tuple(f"{kind}({b})" for b in budgets for kind in KINDS)
    check_fits(*run_estimate(preset.config, preset.batch_size, preset.seq_len, frameworks, ("float32",),
                             kept_cases=len(frameworks) * (len(plans) + 1)), "this plan run")
    suite = SuiteConfig(name="plan", preset=preset, plans=plans, frameworks=frameworks,
                        timing_repeats=args.repeats or preset.repeats or 5,
                        modes=tuple((f, FRAMEWORKS[f].measured_mode) for f in frameworks), planner_cost=cost,
                        **({"hparams": preset.hparams} if preset.hparams is not None else {}))
    suite.plan_list()
    cc.check_platforms(frameworks)
    return suite, budgets


def plan_rows(report: dict, budgets, suite=None) -> list[dict]:
    """One row per framework and budget: the planner's case beside the best uniform plan's; with ``suite``, the
    two plans' steps timed against each other (:func:`parity.cli.plan_choice.paired_times`) before the choice.
    A row's ``cost`` is the suite's ``planner_cost`` (else the cases' own, None where neither says)."""
    by = {(c["framework"], c["plan"]): c for c in report["cases"]}
    rows = []
    for fw in dict.fromkeys(c["framework"] for c in report["cases"]):
        for b in budgets:
            p, u = (by.get((fw, f"{kind}({b})")) for kind in KINDS)
            if p is None:
                continue
            cost = suite.planner_cost if suite is not None else p.get("planner_cost") or (u or {}).get("planner_cost")
            row = {"framework": fw, "budget": b, "budget_bytes": p.get("budget_bytes"), "cost": cost,
                   "option_times": p.get("option_times")}
            for key, c in (("planner", p), ("uniform", u)):
                row[key] = None if c is None else {
                    "status": c["status"], "plan": c.get("resolved_plan"), "error": c.get("error"),
                    "predicted_peak_activation_bytes": c.get("predicted_peak_activation_bytes"),
                    "peak_activation_bytes": c.get("peak_activation_bytes"),
                    "predicted_saved_bytes": c.get("predicted_saved_bytes"), "saved_bytes": c.get("saved_bytes"),
                    "within_budget": c.get("within_budget"), "grads_bitwise_equal": c.get("grads_bitwise_equal"),
                    "weights_bitwise_equal": c.get("weights_bitwise_equal"),
                    "recompute_flops": c.get("planned_recompute_flops"), "time_overhead": c.get("time_overhead"),
                    "time_overhead_range": c.get("time_overhead_range"), "attempts": len(c.get("budget_attempts") or []),
                    "predicted_step_time_s": c.get("planned_step_time_s"),
                    **_candidates(c)}
            pf = (row["planner"] or {}).get("recompute_flops")
            uf = (row["uniform"] or {}).get("recompute_flops")
            row["recompute_vs_uniform"] = (None if pf is None or uf is None else
                                           "less" if pf < uf else "equal" if pf == uf else "more")
            rows.append(row)
    if suite is not None:
        pc.paired_times(suite, rows)
    for row in rows:
        t = pc.time_vs_uniform(row)
        row["time_vs_uniform"] = None if t is None else t.as_dict()
        row["choice"], row["choice_reason"] = pc.choose(row)
    return rows


def _candidates(case: dict) -> dict:
    """The candidates a case's last plan was chosen from, timed whole (:func:`parity.cases.budget_plan.candidate_plans`)."""
    last = (case.get("budget_attempts") or [{}])[-1]
    if not last.get("candidates"):
        return {}
    return {"candidates": last["candidates"], "candidate_choice": last.get("choice_reason"),
            "candidate_rule": last.get("choice_rule"), "candidate_ratio": last.get("choice_ratio"),
            "candidate_timing": last.get("timing")}


def plan_passed(report: dict, frontier: bool) -> bool:
    """Every case passed; on the frontier a budget that no plan fits is reported, not failed (a budget
    asked for by itself, ``--budget 10%``, that nothing fits is a failure)."""
    if not frontier:
        return report_passed(report)
    skip = {c["plan"] for c in report["cases"] if no_fit(c)}
    kept = {**report, "cases": [c for c in report["cases"] if c["plan"] not in skip],
            "cross_framework": [x for x in report["cross_framework"] if x["plan"] not in skip]}
    return report_passed(kept)


def _compiled_points(suite, budgets, backend: str, console, progress: bool) -> list[dict]:
    """Each framework's compiler-assisted remat at the budgets' fractions
    (:meth:`parity.runners.framework.Framework.compiler_budget_points`; PyTorch's ``torch.compile`` with
    ``activation_memory_budget``), measured like the eager plans; a point that fails is recorded."""
    cfg, params, tokens = preset_inputs(suite.preset, "float32", suite.seed)
    fractions = {b: parse_budget(b).fraction for b in budgets}
    points = []
    for fw in suite.frameworks:
        for b, frac in fractions.items():
            if progress:
                cc.note(console, f"{fw} compiler remat, {backend}: memory budget {frac:g}")
            points += [{**p, "framework": fw, "budget": b} for p in
                       get_framework(fw).compiler_budget_points(cfg, params, tokens, (frac,), backend=backend,
                                                                repeats=suite.timing_repeats)]
    return points


def cmd_plan(args) -> int:
    """Run the plan command; returns the exit code."""
    console = make_console()
    suite, budgets = checked(console, plan_suite_from_args, args)
    with claimed(console, args.out, args.overwrite, PLAN_FILES) as claim:
        return _plan(args, suite, budgets, console, claim, environment_info(suite.frameworks))


def _plan(args, suite, budgets, console, claim, env) -> int:
    def partial(rep: dict) -> None:
        atomic_write(args.out / "plan.json", json_text({**rep, "schema": PLAN_SCHEMA_VERSION, "suite_schema": rep["schema"],
                                                        "complete": False, "environment": env}))

    def on_start(label: str) -> None:
        if not args.no_progress:
            cc.note(console, label)

    try:
        report = run_suite(suite, on_start=on_start, on_partial=partial)
        report["plan_rows"] = plan_rows(report, budgets, suite)
        report["compiled"] = []
        if args.frontier:
            report["compiled"] = _compiled_points(suite, budgets, "inductor" if args.inductor else
                                                  "aot_eager_decomp_partition", console, not args.no_progress)
    except KeyboardInterrupt:
        claim.interrupted(f"interrupted: {args.out / 'plan.json'} holds the finished cases (complete: false)")
    report.update(schema=PLAN_SCHEMA_VERSION, suite_schema=report["schema"], complete=True, environment=env,
                  budgets=list(budgets))
    if args.frontier:
        from parity.report.plots import plot_budget_frontier

        report["frontier_plot"] = plot_budget_frontier(report, args.out / "frontier.png").name
    atomic_write(args.out / "plan.json", json_text(report))
    atomic_write(args.out / "plan.md", markdown(report))
    write_html(report, args.out)
    print_summary(report, terminal_console(args.wide), args.wide)
    cc.note(console, f"wrote {args.out / 'plan.json'}, {args.out / 'plan.md'}, {args.out / HTML_NAME}"
            + (f", {args.out / 'frontier.png'}" if args.frontier else ""))
    compiled_ok = all(p.get("error") is None for p in report["compiled"])
    if plan_passed(report, frontier=args.frontier) and compiled_ok:
        cc.note(console, passed_line(report), "green")
        return 0
    cc.note(console, "some plan failed a check, went over its budget or errored (see plan.md)", "bold red")
    return 1
