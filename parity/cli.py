"""Command line of the parity harness: ``python -m parity run`` and ``python -m parity sweep``.

Exit codes: 0 every check passed; 1 a parity check failed or a case errored; 2 bad input
(options, output directory); 130 interrupted (the finished cases are in the report).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from jaxremat.spec import DEFAULT_SCHEDULES, SCHEDULE_NAMES, SUPPORTED_DTYPES
from jaxremat.spec.policies import POLICY_NAMES

from .cli_util import split_list
from .models import PRESETS, get_preset

SUITES = ("quick", "full", "stress")


def _split(text: str) -> tuple[str, ...]:
    """Split at commas outside parentheses: ``nested(sqrt,sqrt),full`` -> two items."""
    return split_list(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m parity",
        description="Rematerialization parity between JAX/Flax and PyTorch: gradients and trained weights of "
        "every remat schedule against no remat, byte for byte, in each framework; the two frameworks "
        "compared within a tolerance table; saved-activation and peak memory beside the analytic model.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the parity suite and write report.json and report.md",
                         description="Run the parity suite and write report.json / report.md into --out.")
    run.add_argument("--suite", default="quick", choices=SUITES,
                     help="which plans to run when --schedules is not given: 'quick' = the segment schedules; "
                     "'full' = every schedule, every named policy and nested schedule, and combinations; 'stress' = bf16 mixed "
                     "precision, frozen parameters, running statistics and dropout with a second random op, under "
                     "every schedule kind (float32 only) (default: quick)")
    run.add_argument("--model", default="gpt-small",
                     help="model preset: " + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values()))
    run.add_argument("--schedules", default=None,
                     help=f"comma-separated plans SCHEDULE or SCHEDULE+POLICY to check against 'none' (schedules: "
                     f"{', '.join(SCHEDULE_NAMES)}; policies: {', '.join(POLICY_NAMES)}; the '+' needs no quoting); "
                     f"default: the --suite's list (quick: the model's list, else {','.join(DEFAULT_SCHEDULES)})")
    run.add_argument("--checkpoint", default=None, type=Path, metavar="DIR",
                     help="run on a local Hugging Face checkpoint directory instead of --model (config.json, "
                     "model.safetensors, tokenizer.json; BERT: contrastive fine-tuning on the bundled sentence "
                     "pairs; GPT-2: next-token training on the bundled corpus)")
    run.add_argument("--dtype", default="float32",
                     help=f"comma-separated dtypes among {', '.join(SUPPORTED_DTYPES)} (default: float32)")
    run.add_argument("--frameworks", default="jax,torch", help="comma-separated subset of jax,torch (default: both)")
    run.add_argument("--out", default="parity-report", type=Path,
                     help="output directory for report.json and report.md (default: parity-report/); a previous "
                     "report there is moved to previous/<timestamp>/ unless --overwrite")
    run.add_argument("--overwrite", action="store_true", help="replace a previous report in --out instead of keeping it")
    run.add_argument("--repeats", type=int, default=None,
                     help="timed training steps per case, median reported (default: the model's, else 5)")
    run.add_argument("--seed", type=int, default=0, help="seed of the weights and token windows (default: 0)")
    run.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    from .sweep_report import add_parser as add_sweep_parser

    add_sweep_parser(sub)
    return parser


def _suite_from_args(args):
    from jaxremat.spec.plan import parse_plan

    from .suite import SUITE_PLANS, SuiteConfig

    if args.checkpoint is not None:
        from .pretrained import checkpoint_preset

        preset = checkpoint_preset(args.checkpoint)
    else:
        preset = get_preset(args.model)
    if preset.checkpoint is not None:
        preset.checkpoint()  # a missing checkpoint is bad input (exit 2 with the install command)
    dtypes = tuple(dict.fromkeys(_split(args.dtype)))
    bad = [d for d in dtypes if d not in SUPPORTED_DTYPES]
    if bad or not dtypes:
        raise ValueError(f"--dtype: unknown dtype {bad or args.dtype!r}; valid: {', '.join(SUPPORTED_DTYPES)}")
    frameworks = tuple(dict.fromkeys(_split(args.frameworks)))
    badf = [f for f in frameworks if f not in ("jax", "torch")]
    if badf or not frameworks:
        raise ValueError(f"--frameworks: unknown framework {badf or args.frameworks!r}; valid: jax, torch")
    if args.schedules is not None:
        schedules = _split(args.schedules)
    else:
        schedules = (preset.schedules or SUITE_PLANS["quick"]) if args.suite == "quick" else SUITE_PLANS[args.suite]
    if not schedules:
        raise ValueError(f"--schedules is empty; valid forms: {', '.join(SCHEDULE_NAMES)}")
    for s in schedules:
        parse_plan(s)
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed must be an integer in [0, 2**32), got {args.seed}")
    if args.repeats is None:
        args.repeats = preset.repeats or 5
    if args.suite == "stress" and dtypes != ("float32",):
        raise ValueError("--suite stress runs float32 parameters (its bf16 case computes in bfloat16 from them); "
                         "leave out --dtype")
    if args.suite == "stress" and preset.config.arch != "gpt":
        raise ValueError(f"--suite stress runs GPT presets; --model {preset.name} is arch {preset.config.arch!r}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    suite = SuiteConfig(name=args.suite, preset=preset, schedules=schedules, dtypes=dtypes,
                        frameworks=frameworks, timing_repeats=args.repeats, seed=args.seed,
                        **({"hparams": preset.hparams} if preset.hparams is not None else {}))
    suite.schedule_objects()  # validates schedule parameters against the model depth
    return suite


def cmd_run(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .report import OutputDirError, prepare_out_dir, print_tables, write_report
    from .suite import count_cases, report_passed, run_suite

    console = Console(stderr=True, soft_wrap=True)
    try:
        suite = _suite_from_args(args)
        kept = prepare_out_dir(args.out, args.overwrite)
    except (ValueError, OutputDirError) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        return 2
    if kept:
        console.print(kept)
    total = count_cases(suite)

    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=console, disable=args.no_progress, transient=True)
    with progress:
        task = progress.add_task("starting", total=total)

        def on_start(label: str) -> None:
            progress.update(task, description=label)

        written = {"cases": 0}

        def write_partial(partial_report: dict) -> None:
            write_report({**partial_report, "complete": False}, args.out)
            written["cases"] = len(partial_report["cases"])

        def on_case(case: dict) -> None:
            progress.advance(task)

        try:
            report = run_suite(suite, on_case=on_case, on_start=on_start, on_partial=write_partial)
        except KeyboardInterrupt:
            if written["cases"]:
                console.print(f"[yellow]interrupted[/]: {args.out / 'report.json'} holds the finished cases")
            else:
                console.print("[yellow]interrupted[/] before any case finished: no report was written")
            # Leave without interpreter teardown: XLA's threads can crash it after an interrupt.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
    report["complete"] = True
    paths = write_report(report, args.out)
    print_tables(report)
    console.print("wrote " + ", ".join(str(p) for p in paths))
    if report_passed(report):
        console.print("[green]all parity checks passed[/]")
        return 0
    console.print("[bold red]parity checks failed[/] (see the report's failed checks and errors)")
    return 1


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "sweep":
        from .sweep_report import cmd_sweep

        return cmd_sweep(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
