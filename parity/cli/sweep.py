"""``python -m parity sweep``: options, sweep.json, sweep.md and the plots.

Exit codes: 0 the sweep ran and every case measured; 1 a case errored; 2 bad input (options, a
sweep too large for memory) or an output directory that cannot take the files (not a directory,
locked by another run, full disk); 130 interrupted (sweep.json holds the finished cases,
``"complete": false``). Every file is written atomically; sweep.json is strict JSON.
"""

from __future__ import annotations

# Deferred imports: the sweep (which loads JAX and PyTorch) loads only once the options are valid, so --help
# and bad input answer fast.

import math

from parity.cli.util import ascii_int
from parity.cases.sweep import (DEFAULT_DEPTHS, DEFAULT_SCHEDULES, FRONTIER_PLANS, SWEEP_SCHEMA_VERSION, SweepConfig,
                                run_sweep)
from jaxremat.spec.plan import parse_plan
from parity.cases.sweep import SWEEP_CONFIG
from parity.cli import checks as cc
from parity.cli.budget import check_fits, run_estimate
from parity.cli.checks import check_jax_platform
from parity.cli.checks import out_path, plain_ints, unique_items
from parity.report.environment import environment_info
from parity.report.files import WriteError
from parity.report.files import atomic_write, json_text
from parity.report.html import HTML_NAME, write_html
from parity.report.suite_report import OutputDirError
from rich.console import Console
import dataclasses


def add_parser(sub) -> None:
    """Register the ``sweep`` subcommand on an argparse subparsers object."""
    p = sub.add_parser("sweep", help="depth sweep: activation memory and step time vs depth, slopes, plots",
                       description="Measure saved and peak activation bytes and step time at each depth for each "
                       "schedule in JAX and PyTorch; fit log-log slopes; write sweep.json, sweep.md, report.html and PNG plots.")
    p.add_argument("--depths", default=",".join(map(str, DEFAULT_DEPTHS)),
                   help=f"comma-separated depths N (default: {','.join(map(str, DEFAULT_DEPTHS))})")
    p.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES),
                   help=f"comma-separated plans for the depth sweep (default: {','.join(DEFAULT_SCHEDULES)})")
    p.add_argument("--frameworks", default="jax,torch", help="comma-separated subset of jax,torch (default: both)")
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
    plans = unique_items("--schedules", args.schedules, canonical=lambda s: parse_plan(s).name)
    frameworks = unique_items("--frameworks", args.frameworks)
    frontier = (unique_items("--frontier-plans", args.frontier_plans, canonical=lambda s: parse_plan(s).name)
                if args.frontier_depth else ())
    bad = [f for f in frameworks if f not in ("jax", "torch")]
    if bad:
        raise ValueError(f"--frameworks: unknown framework {bad[0]!r}; valid: jax, torch")
    deepest = max(*depths, args.frontier_depth)
    if deepest >= 1:
        check_fits(*run_estimate(SWEEP_CONFIG.replace(n_layer=deepest), SweepConfig.batch_size, SweepConfig.seq_len,
                                 frameworks, (SWEEP_CONFIG.dtype,),
                                 kept_cases=0), f"the sweep's deepest case (N={deepest})")
    if "jax" in frameworks:

        check_jax_platform()
    return SweepConfig(depths=depths, plans=_with_none(plans), frameworks=frameworks,
                       frontier_depth=args.frontier_depth or None, frontier_plans=_with_none(frontier),
                       timing_repeats=args.repeats)


def _with_none(plans) -> tuple[str, ...]:

    return ("none", *(p for p in plans if parse_plan(p).name != "none"))


def _range(r) -> str:
    return "-" if not r else f"{r[0]:.2f}-{r[1]:.2f}"


def _cell(text) -> str:
    """One table cell: the first line of ``text``, its ``|`` escaped."""
    lines = str(text).strip().splitlines() or [""]
    return lines[0].replace("|", "\\|")


def _b(n) -> str:
    if n is None:
        return "-"
    for unit, div in (("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def markdown(report: dict, plots: dict[str, str]) -> str:
    """The sweep report as markdown (tables, warnings, links to the plots)."""
    cfg = report["config"]
    lines = ["# Depth sweep", "",
             f"Model: d_model {cfg['d_model']}, {cfg['n_head']} heads, d_ff {cfg['d_ff']}, vocab {cfg['vocab_size']}, "
             f"{cfg['dtype']}; batch {report['batch_size']} x {report['seq_len']} tokens. Depths "
             f"{', '.join(map(str, report['depths']))}.", ""]
    lines += ["## Slopes of activation memory vs depth (log-log fit)", "",
              "| framework | plan | saved slope | peak activation slope |", "|---|---|---|---|"]
    for fw, plans in report["slopes"].items():
        for plan, s in plans.items():
            lines.append(f"| {fw} | {plan} | {_f(s['saved'])} | {_f(s['peak_activation'])} |")
    red = report["sqrt_reduction"]
    lines += ["", f"## sqrt vs none at N={red['n_layer']}", "",
              "| framework | measured peak-activation reduction | per-layer model | unit model | measured saved-bytes reduction |",
              "|---|---|---|---|---|"]
    for fw in report["frameworks"]:
        if fw in red:
            r = red[fw]
            lines.append(f"| {fw} | {r['measured']:.2f}x | {r['per_layer_model']:.2f}x | {red['unit_model']:.2f}x "
                         f"({red['n_layer'] + 1}/{round((red['n_layer'] + 1) / red['unit_model'])}) | {r['measured_saved']:.2f}x |")
    lines += ["", f"![memory vs depth]({plots['memory_vs_depth']})", ""]
    lines += ["## Every case: predicted vs measured", "",
              f"Gaps above {report['gap_limit']:.0%} are flagged. Saved bytes are predicted tensor by tensor "
              "(jaxremat.models.gpt.activation); peak activation bytes by the chain model in bytes. `time/none range` = "
              "the lowest and highest ratio any pair of timed steps gives: a range that holds 1.00 is noise at these "
              "repeats.", "",
              "| framework | N | plan | saved | predicted | gap | peak act. | predicted | gap | time/none | time/none range "
              "| peak act. source | flags |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in report["cases"]:
        if c["error"]:
            lines.append(f"| {c['framework']} | {c['n_layer']} | {c['plan']} | error: {_cell(c['error'])} ||||||||||")
            continue
        lines.append(
            f"| {c['framework']} | {c['n_layer']} | {c['plan']} | {_b(c['saved_bytes'])} | "
            f"{_b(c['predicted_saved_bytes'])} | {_f(c['saved_gap'], '{:+.1%}')} | {_b(c['peak_activation_bytes'])} | "
            f"{_b(c['predicted_peak_activation_bytes'])} | {_f(c['peak_gap'], '{:+.1%}')} | "
            f"{_f(c.get('time_overhead'))} | {_range(c.get('time_overhead_range'))} | {c['peak_activation_source']} | "
            f"{'; '.join(c['flags']) or '-'} |")
    warnings = [c["survival"]["warning"] for c in report["cases"] if c.get("survival") and c["survival"]["warning"]]
    lines += ["", "## Remat survival (JAX)", ""]
    assessed = [c for c in report["cases"] if c.get("survival")]
    if "jax" not in report["frameworks"]:
        lines += ["- not assessed: JAX did not run in this sweep (--frameworks " + ",".join(report["frameworks"]) + ")"]
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

    console = Console(stderr=True, soft_wrap=True, highlight=False)
    try:
        sweep = sweep_from_args(args)
        lock, kept = cc.claim_out_dir(args.out, args.overwrite, SWEEP_FILES)
    except (ValueError, OutputDirError) as exc:
        cc.error(console, exc)
        return 2
    previous = cc.install_interrupt_handler(lock)
    try:
        return _sweep_locked(args, sweep, console, kept, lock, environment_info(sweep.frameworks))
    except WriteError as exc:
        cc.error(console, f"{exc}; the sweep files already in {args.out} (if any) are kept whole; make room (or "
                 "raise the limit) and run again")
        return 2
    finally:
        cc.restore_interrupt_handler(previous)
        lock.release()


def _sweep_locked(args, sweep: SweepConfig, console, kept, lock, env) -> int:

    from parity.report.plots import write_plots

    if kept:
        cc.note(console, kept)
    done: list[dict] = []

    def on_case(c: dict) -> None:
        done.append(c)
        atomic_write(args.out / "sweep.json", json_text(
            {"schema": SWEEP_SCHEMA_VERSION, "complete": False, "nonfinite_encoding": "string", "environment": env,
             "config": dataclasses.asdict(sweep.config), "depths": list(sweep.depths), "plans": list(sweep.plans),
             "frameworks": list(sweep.frameworks), "cases": done}, indent=1))
        status = c["error"] or f"saved {_b(c['saved_bytes'])}, peak act. {_b(c['peak_activation_bytes'])}"
        cc.note(console, f"{c['framework']:5s} N={c['n_layer']:<3d} {c['plan']:28s} {status}")

    try:
        report = run_sweep(sweep, on_case=on_case)
    except KeyboardInterrupt:
        cc.note(console, f"interrupted: {args.out / 'sweep.json'} holds the {len(done)} finished cases (complete: false)"
                if done else "interrupted before any case finished: no sweep.json was written")
        cc.exit_interrupted(lock)
    plots = write_plots(report, args.out)
    report.update(plots=plots, complete=True, nonfinite_encoding="string", environment=env)
    atomic_write(args.out / "sweep.json", json_text(report, indent=1))
    atomic_write(args.out / "sweep.md", markdown(report, plots))
    write_html(report, args.out)
    for fw, plans in report["slopes"].items():
        cc.note(console, fw + ": " + ", ".join(f"{p} saved {_f(s['saved'])} peak {_f(s['peak_activation'])}"
                                               for p, s in plans.items()))
    cc.note(console, f"wrote {args.out / 'sweep.json'}, {args.out / 'sweep.md'}, {args.out / HTML_NAME}, "
            + ", ".join(plots.values()))
    return 1 if any(c["error"] for c in report["cases"]) else 0
