"""``python -m parity sweep``: options, sweep.json, sweep.md and the plots.

Exit codes: 0 the sweep ran and every case measured; 1 a case errored; 2 bad input (options, a
sweep too large for memory) or an output directory that cannot take the files (not a directory,
locked by another run, full disk); 130 interrupted (sweep.json holds the finished cases,
``"complete": false``). Every file is written atomically; sweep.json is strict JSON.
"""

from __future__ import annotations

# Deferred imports: matplotlib (the plots) loads once the sweep has run, so --help and bad input answer fast.

import dataclasses

from jaxremat.spec.plan import parse_plan

from parity.cases.sweep import (DEFAULT_DEPTHS, DEFAULT_SCHEDULES, FRONTIER_PLANS, SWEEP_CONFIG, SWEEP_SCHEMA_VERSION,
                                SweepConfig, run_sweep)
from parity.cli import checks as cc
from parity.cli.budget import check_fits, run_estimate
from parity.cli.checks import out_path, plain_ints
from parity.cli.command import checked, claimed, make_console
from parity.cli.util import ascii_int
from parity.report.environment import environment_info
from parity.report.files import atomic_write, json_text
from parity.report.format import fmt_bytes, fmt_range, fmt_ratio, fmt_time_ratio, md_table
from parity.report.html import HTML_NAME, write_html
from parity.runners.framework import FRAMEWORK_NAMES


def add_parser(sub) -> None:
    """Register the ``sweep`` subcommand on an argparse subparsers object."""
    p = sub.add_parser("sweep", help="depth sweep: activation memory and step time vs depth, slopes, plots",
                       description="Measure saved and peak activation bytes and step time at each depth for each "
                       "schedule in JAX and PyTorch; fit log-log slopes; write sweep.json, sweep.md, report.html and PNG plots.")
    p.add_argument("--depths", default=",".join(map(str, DEFAULT_DEPTHS)),
                   help=f"comma-separated depths N (default: {','.join(map(str, DEFAULT_DEPTHS))})")
    p.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES),
                   help=f"comma-separated plans for the depth sweep (default: {','.join(DEFAULT_SCHEDULES)})")
    p.add_argument("--frameworks", default=",".join(FRAMEWORK_NAMES),
                   help=f"comma-separated subset of {','.join(FRAMEWORK_NAMES)} (default: all)")
    p.add_argument("--frontier-depth", type=ascii_int, default=16,
                   help="depth of the time-vs-memory frontier of schedules and policies; 0 skips it (default: 16)")
    p.add_argument("--frontier-plans", default=",".join(FRONTIER_PLANS),
                   help="comma-separated plans (SCHEDULE or SCHEDULE+POLICY) on the frontier")
    p.add_argument("--repeats", type=ascii_int, default=3, help="timed steps per case, median reported (default: 3)")
    p.add_argument("--out", default="sweep-report",
                   help="output directory (default: sweep-report/); a previous sweep there is moved to "
                   "previous/<timestamp>/ unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace a previous sweep in --out instead of keeping it")




def sweep_from_args(args) -> SweepConfig:
    """A :class:`SweepConfig` from parsed options; raises ValueError with what is wrong.

    Every list is checked as ``run`` checks it (not empty, each item once, plans parsed), and the
    memory of the deepest case is estimated before any plan is resolved at a depth.
    """

    args.out = out_path("--out", args.out)
    depths = plain_ints("--depths", args.depths)
    if args.frontier_depth < 0:
        raise ValueError(f"--frontier-depth must be >= 0, got {args.frontier_depth}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    plans = cc.parsed_items("--schedules", args.schedules, parse_plan)
    frameworks = cc.frameworks_option(args.frameworks)
    frontier = cc.parsed_items("--frontier-plans", args.frontier_plans, parse_plan) if args.frontier_depth else ()
    deepest = max(*depths, args.frontier_depth)
    if deepest >= 1:
        check_fits(*run_estimate(SWEEP_CONFIG.replace(n_layer=deepest), SweepConfig.batch_size, SweepConfig.seq_len,
                                 frameworks, (SWEEP_CONFIG.dtype,),
                                 kept_cases=0), f"the sweep's deepest case (N={deepest})")
    cc.check_platforms(frameworks)
    return SweepConfig(depths=depths, plans=_with_none(plans), frameworks=frameworks,
                       frontier_depth=args.frontier_depth or None, frontier_plans=_with_none(frontier),
                       timing_repeats=args.repeats)


def _with_none(plans) -> tuple[str, ...]:
    """The plans' names with ``none`` first (the reference of every depth)."""
    return ("none", *(p.name for p in plans if p.name != "none"))


SWEEP_COLUMNS = ("framework", "N", "plan", "saved", "predicted", "gap", "peak act.", "predicted", "gap", "time/none",
                 "time/none range", "peak act. source", "flags")


def _pct(g) -> str:
    return fmt_ratio(g, "{:+.1%}")


def _case_row(c: dict) -> list[str]:
    """One sweep case in :data:`SWEEP_COLUMNS` order (an error fills the rest of its row)."""
    head = [c["framework"], str(c["n_layer"]), c["plan"]]
    if c["error"]:
        return head + [f"error: {c['error']}"] + [""] * (len(SWEEP_COLUMNS) - 4)
    return head + [fmt_bytes(c["saved_bytes"]), fmt_bytes(c["predicted_saved_bytes"]), _pct(c["saved_gap"]),
                   fmt_bytes(c["peak_activation_bytes"]), fmt_bytes(c["predicted_peak_activation_bytes"]),
                   _pct(c["peak_gap"]), fmt_time_ratio(c.get("time_overhead"), c.get("time_overhead_range"), with_range=False),
                   fmt_range(c.get("time_overhead_range")),
                   c["peak_activation_source"], "; ".join(c["flags"]) or "-"]


def markdown(report: dict, plots: dict[str, str]) -> str:
    """The sweep report as markdown (tables, warnings, links to the plots)."""
    cfg = report["config"]
    lines = ["# Depth sweep", "",
             f"Model: d_model {cfg['d_model']}, {cfg['n_head']} heads, d_ff {cfg['d_ff']}, vocab {cfg['vocab_size']}, "
             f"{cfg['dtype']}; batch {report['batch_size']} x {report['seq_len']} tokens. Depths "
             f"{', '.join(map(str, report['depths']))}.", ""]
    lines += ["## Slopes of activation memory vs depth (log-log fit)", "",
              md_table(("framework", "plan", "saved slope", "peak activation slope"),
                       [[fw, plan, fmt_ratio(s["saved"]), fmt_ratio(s["peak_activation"])]
                        for fw, plans in report["slopes"].items() for plan, s in plans.items()])]
    red = report["sqrt_reduction"]
    units = f"{red['unit_model']:.2f}x ({red['n_layer'] + 1}/{round((red['n_layer'] + 1) / red['unit_model'])})"
    lines += ["", f"## sqrt vs none at N={red['n_layer']}", "",
              md_table(("framework", "measured peak-activation reduction", "per-layer model", "unit model",
                        "measured saved-bytes reduction"),
                       [[fw, f"{red[fw]['measured']:.2f}x", f"{red[fw]['per_layer_model']:.2f}x", units,
                         f"{red[fw]['measured_saved']:.2f}x"] for fw in report["frameworks"] if fw in red])]
    lines += ["", f"![memory vs depth]({plots['memory_vs_depth']})", ""]
    lines += ["## Every case: predicted vs measured", "",
              f"Gaps above {report['gap_limit']:.0%} are flagged. Saved bytes are predicted tensor by tensor "
              "(jaxremat.models.gpt.activation); peak activation bytes by the chain model in bytes. `time/none range` = "
              "the lowest and highest ratio any pair of timed steps gives: a range that holds 1.00 is noise at these "
              "repeats.", "", md_table(SWEEP_COLUMNS, [_case_row(c) for c in report["cases"]])]
    warnings = [c["survival"]["warning"] for c in report["cases"] if c.get("survival") and c["survival"]["warning"]]
    lines += ["", "## Remat survival (compiled programs: JAX)", ""]
    assessed = [c for c in report["cases"] if c.get("survival")]
    if not assessed and not any("dots_before" in c for c in report["cases"]):
        lines += ["- not assessed: no framework of this sweep compiles a program (--frameworks "
                  + ",".join(report["frameworks"]) + ")"]
    elif not assessed:
        lines += ["- not assessed: no JAX schedule case finished beside a `none` case at the same depth"]
    else:
        lines += [f"- **warning**: {w}" for w in warnings] or [
            f"- each of the {len(assessed)} JAX schedule cases' compiled programs realized at least half of the "
            "saving its residuals promise"]
    if "frontier" in plots:
        lines += ["", f"## Frontier at N={report['frontier_depth']}", "", f"![frontier]({plots['frontier']})"]
    lines += ["", "## One block, tensor by tensor", ""]
    for fw in report["frameworks"]:
        b = report["block"][fw]
        lines.append(f"- {fw}: measured {b['measured_bytes']:,} B, model {b['predicted_bytes']:,} B, tensor-by-tensor "
                     f"match: {'yes' if b['tensor_by_tensor_match'] else 'NO'}")
    lines += [f"- Korthikanti et al. 2022 (no dropout, this dtype): {report['korthikanti_layer_bytes']:,} B per layer; "
              f"the chain unit (one layer in a stack): " + ", ".join(f"{fw} {v:,} B" for fw, v in report["layer_bytes"].items()),
              "", f"![saved bytes by name]({plots['block_bytes']})", ""]
    return "\n".join(lines)


SWEEP_FILES = ("sweep.json", "sweep.md", "memory_vs_depth.png", "frontier.png", "block_bytes.png", HTML_NAME)


def cmd_sweep(args) -> int:
    """Run the sweep and write its files; returns the exit code."""
    console = make_console()
    sweep = checked(console, sweep_from_args, args)
    with claimed(console, args.out, args.overwrite, SWEEP_FILES) as claim:
        return _sweep(args, sweep, console, claim, environment_info(sweep.frameworks))


def _sweep(args, sweep: SweepConfig, console, claim, env) -> int:
    from parity.report.plots import write_plots

    done: list[dict] = []

    def on_case(c: dict) -> None:
        done.append(c)
        atomic_write(args.out / "sweep.json", json_text(
            {"schema": SWEEP_SCHEMA_VERSION, "complete": False, "nonfinite_encoding": "string", "environment": env,
             "config": dataclasses.asdict(sweep.config), "depths": list(sweep.depths), "plans": list(sweep.plans),
             "frameworks": list(sweep.frameworks), "cases": done}, indent=1))
        status = c["error"] or f"saved {fmt_bytes(c['saved_bytes'])}, peak act. {fmt_bytes(c['peak_activation_bytes'])}"
        cc.note(console, f"{c['framework']:5s} N={c['n_layer']:<3d} {c['plan']:28s} {status}")

    try:
        report = run_sweep(sweep, on_case=on_case)
    except KeyboardInterrupt:
        claim.interrupted(f"interrupted: {args.out / 'sweep.json'} holds the {len(done)} finished cases (complete: false)"
                          if done else "interrupted before any case finished: no sweep.json was written")
    plots = write_plots(report, args.out)
    report.update(plots=plots, complete=True, nonfinite_encoding="string", environment=env)
    atomic_write(args.out / "sweep.json", json_text(report, indent=1))
    atomic_write(args.out / "sweep.md", markdown(report, plots))
    write_html(report, args.out)
    for fw, plans in report["slopes"].items():
        cc.note(console, fw + ": " + ", ".join(f"{p} saved {fmt_ratio(s['saved'])} peak {fmt_ratio(s['peak_activation'])}"
                                               for p, s in plans.items()))
    cc.note(console, f"wrote {args.out / 'sweep.json'}, {args.out / 'sweep.md'}, {args.out / HTML_NAME}, "
            + ", ".join(plots.values()))
    return 1 if any(c["error"] for c in report["cases"]) else 0
