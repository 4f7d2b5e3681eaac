"""Command line of the parity harness: ``python -m parity run`` and ``python -m parity sweep``.

Exit codes: 0 every check passed; 1 a parity check failed or a case errored; 2 bad input
(options, checkpoint files, a run too large for memory) or an output directory that cannot take
the report (not a directory, locked by another run, full disk); 130 interrupted (the finished
cases are in the report). Every message is one line of plain text; docs/cli.md lists them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from jaxremat.models import SUPPORTED_DTYPES, get_model, registered_models
from jaxremat.spec import DEFAULT_SCHEDULES, SCHEDULE_NAMES
from jaxremat.spec.policies import POLICY_NAMES

from parity.cases.budget_plan import parse_case_plan
from parity.cases.suite import SUITE_PLANS, SuiteConfig, count_cases, run_suite
from parity.cli import checks as cc
from parity.cli.budget import check_device_fits, check_fits, run_estimate
from parity.cli.checks import out_path, unique_items
from parity.cli.command import CommandExit, checked, claimed, fail, make_console
from parity.cli.distributed import cmd_distributed
from parity.cli.estimate import add_parser as add_estimate_parser
from parity.cli.estimate import cmd_estimate
from parity.cli.finetune import add_parser as add_finetune_parser
from parity.cli.finetune import cmd_finetune
from parity.cli.plan import add_parser as add_plan_parser
from parity.cli.plan import cmd_plan
from parity.cli.sweep import add_parser as add_sweep_parser
from parity.cli.sweep import cmd_sweep
from parity.cli.util import OneLineParser, ascii_int, split_list
from parity.inputs.checkpoints import check_weights_file
from parity.inputs.model_preset import with_shape
from parity.inputs.presets import PRESETS, get_preset
from parity.inputs.pretrained import checkpoint_preset
from parity.report.environment import environment_info
from parity.report.suite_report import REPORT_FILES, write_report
from parity.runners.framework import FRAMEWORK_NAMES, framework_modes

DEFAULT_MODEL = "gpt-small"

SUITES = ("quick", "full", "stress", "distributed")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m parity",
        description="Rematerialization parity between JAX/Flax and PyTorch: gradients and trained weights of "
        "every remat schedule against no remat, byte for byte, in each framework; the two frameworks "
        "compared within a tolerance table; saved-activation and peak memory beside the analytic model.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the parity suite and write report.json, report.md and report.html",
                         description="Run the parity suite and write report.json, report.md and report.html into --out.")
    run.add_argument("--suite", default="quick", choices=SUITES,
                     help="which plans to run when --schedules is not given: 'quick' = the segment schedules; "
                     "'full' = every schedule, every named policy and nested schedule, and combinations; 'stress' = bf16 mixed "
                     "precision, frozen parameters, running statistics and dropout with a second random op, under "
                     "every schedule kind (float32 only); 'distributed' = the plans on JAX meshes (data parallel, fully sharded, "
                     "data x model) and PyTorch ranks, per-device memory (docs/sharding.md) (default: quick)")
    run.add_argument("--devices", type=ascii_int, default=None,
                     help="distributed suite: JAX devices (CPU: simulated host devices; default 4)")
    run.add_argument("--processes", type=ascii_int, default=None,
                     help="distributed suite: also run each JAX mesh spread over this many processes "
                     "(jax.distributed over 127.0.0.1, gloo CPU collectives), checked against the one-process run "
                     "(default 1: one process)")
    run.add_argument("--mesh", default=None,
                     help="distributed suite: ';'-separated JAX meshes, e.g. 'data=2,model=2' (default: "
                     "data=2;fsdp=4;data=2,model=2)")
    run.add_argument("--model", default=None,
                     help=f"model preset (default: {DEFAULT_MODEL}): "
                     + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values()))
    run.add_argument("--schedules", default=None,
                     help=f"comma-separated plans SCHEDULE or SCHEDULE+POLICY to check against 'none' (schedules: "
                     f"{', '.join(SCHEDULE_NAMES)}; policies: {', '.join(POLICY_NAMES)}; in bash, quote a value with "
                     f"parentheses: --schedules 'every_k(2),sqrt'); "
                     f"default: the --suite's list (quick: the model's list, else {','.join(DEFAULT_SCHEDULES)})")
    run.add_argument("--checkpoint", default=None, metavar="DIR",
                     help="run on a local Hugging Face checkpoint directory instead of a --model preset (config.json, "
                     "model.safetensors, tokenizer.json; BERT: contrastive fine-tuning on the bundled sentence "
                     "pairs; GPT-2: next-token training on the bundled corpus)")
    run.add_argument("--batch-size", type=ascii_int, default=None,
                     help="B, sequences per step (default: the model's; sentences for a sentence-pair model)")
    run.add_argument("--seq-len", type=ascii_int, default=None,
                     help="T, tokens per sequence (default: the model's); the run is refused when it would not fit "
                     "in memory here (python -m parity estimate answers for any size)")
    run.add_argument("--dtype", default="float32",
                     help=f"comma-separated dtypes among {', '.join(SUPPORTED_DTYPES)} (default: float32)")
    run.add_argument("--frameworks", default=",".join(FRAMEWORK_NAMES),
                     help=f"comma-separated subset of {','.join(FRAMEWORK_NAMES)} (default: all)")
    run.add_argument("--out", default="parity-report",
                     help="output directory for report.json, report.md and report.html (default: parity-report/); a previous "
                     "report there is moved to previous/<timestamp>/ unless --overwrite")
    run.add_argument("--overwrite", action="store_true", help="replace a previous report in --out instead of keeping it (--suite distributed also "
                     "removes the distributed/ folder its previous run wrote, never one it did not write)")
    run.add_argument("--repeats", type=ascii_int, default=None,
                     help="timed training steps per case, median reported (default: the model's, else 5)")
    run.add_argument("--seed", type=ascii_int, default=0, help="seed of the weights and token windows (default: 0)")
    run.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    run.add_argument("--wide", action="store_true", help="print every column of the case table (report.md has them all)")

    add_sweep_parser(sub)
    add_plan_parser(sub)
    add_finetune_parser(sub)
    add_estimate_parser(sub)
    return parser


def _options(args) -> tuple[tuple[str, ...], tuple[str, ...], tuple | None]:
    """dtypes, frameworks and the user's plans, parsed once (None: the suite's), each checked; raises ValueError."""

    args.out = out_path("--out", args.out)
    if args.model is not None and not args.model.strip():
        raise ValueError(f"--model is empty; give a preset ({', '.join(PRESETS)}) or leave it out for {DEFAULT_MODEL}")
    if args.checkpoint is not None and args.model is not None:
        raise ValueError("--checkpoint and --model both given; a checkpoint brings its own model: drop --model")
    if args.checkpoint is not None:
        if not args.checkpoint.strip():
            raise ValueError("--checkpoint is empty; give a checkpoint directory")
        args.checkpoint = Path(args.checkpoint)
    dtypes = unique_items("--dtype", args.dtype)
    bad = [d for d in dtypes if d not in SUPPORTED_DTYPES]
    if bad:
        raise ValueError(f"--dtype: unknown dtype {bad[0]!r}; valid: {', '.join(SUPPORTED_DTYPES)}")
    frameworks = cc.frameworks_option(args.frameworks)
    plans = None
    if args.schedules is not None:
        if not split_list(args.schedules):
            raise ValueError(f"--schedules is empty; valid forms: {', '.join(SCHEDULE_NAMES)}")
        plans = cc.parsed_items("--schedules", args.schedules, parse_case_plan)
    cc.check_seed(args.seed)
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    return dtypes, frameworks, plans


def _preset(args, dtypes):
    """The model preset; a checkpoint's files are checked against its config.json first."""

    if args.checkpoint is not None:

        preset = checkpoint_preset(args.checkpoint)
    else:
        preset = get_preset(args.model or DEFAULT_MODEL)
    preset = with_shape(preset, args.batch_size, args.seq_len)
    file_bytes = 0
    if preset.checkpoint is not None:
        path = preset.checkpoint()  # a missing checkpoint is bad input (exit 2 with the install command)
        file_bytes = check_weights_file(path, preset.config, dtypes)
    return preset, file_bytes


def _suite_from_args(args):
    """The :class:`parity.cases.suite.SuiteConfig` of the options, every check done before any work."""
    dtypes, frameworks, plans = _options(args)
    preset, file_bytes = _preset(args, dtypes)
    if plans is None:
        plans = (preset.schedules or SUITE_PLANS["quick"]) if args.suite == "quick" else SUITE_PLANS[args.suite]
    if args.repeats is None:
        args.repeats = preset.repeats or 5
    if args.suite == "stress" and dtypes != ("float32",):
        raise ValueError("--suite stress runs float32 parameters (its bf16 case computes in bfloat16 from them); "
                         "leave out --dtype")
    if args.suite == "stress" and not get_model(preset.config.arch).stress_suite:
        runs = ", ".join(a for a in registered_models() if get_model(a).stress_suite)
        raise ValueError(f"--suite stress runs {runs} presets; --model {preset.name} is arch {preset.config.arch!r}")
    modes = len(framework_modes(frameworks))  # results are kept per dtype and dropout rate
    check_fits(*run_estimate(preset.config, preset.batch_size, preset.seq_len, frameworks, dtypes,
                             kept_cases=modes * (len(plans) + 1), extra_host_bytes=file_bytes), "this run")
    suite = SuiteConfig(name=args.suite, preset=preset, plans=plans, dtypes=dtypes,
                        frameworks=frameworks, timing_repeats=args.repeats, seed=args.seed,
                        **({"hparams": preset.hparams} if preset.hparams is not None else {}))
    suite.plan_list()  # checks every plan against the model depth and the frameworks
    cc.check_platforms(frameworks)
    check_device_fits(preset.config, preset.batch_size, preset.seq_len, dtypes, frameworks)
    return suite


def cmd_run(args) -> int:
    """``python -m parity run``: check everything, lock --out, run the suite, write the report."""
    console = make_console()
    if args.suite == "distributed":
        return cmd_distributed(args, console)
    if args.devices is not None or args.mesh is not None or args.processes is not None:
        fail(console, "--devices, --mesh and --processes belong to --suite distributed; add --suite distributed "
                      "or drop them")
    suite = checked(console, _suite_from_args, args)
    with claimed(console, args.out, args.overwrite, REPORT_FILES) as claim:
        env = environment_info(suite.frameworks)
        progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                            TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console,
                            disable=args.no_progress or not console.is_terminal, transient=True)
        # (not to a file or a pipe: there rich draws no bar, but ends it with an empty line before the verdict)
        with progress:
            task = progress.add_task("starting", total=count_cases(suite))
            written = {"cases": 0}

            def write_partial(partial_report: dict) -> None:
                write_report({**partial_report, "complete": False, "environment": env}, args.out)
                written["cases"] = len(partial_report["cases"])

            try:
                report = run_suite(suite, on_case=lambda case: progress.advance(task),
                                   on_start=lambda label: progress.update(task, description=label),
                                   on_partial=write_partial)
            except KeyboardInterrupt:
                claim.interrupted(f"interrupted: {args.out / 'report.json'} holds the {written['cases']} finished cases"
                                  if written["cases"] else "interrupted before any case finished: no report was written")
        report["complete"] = True
        report["environment"] = env
        return cc.finish_report(console, report, args.out, "the report's failed checks and errors", wide=args.wide)


COMMANDS = {"run": cmd_run, "sweep": cmd_sweep, "plan": cmd_plan, "finetune": cmd_finetune, "estimate": cmd_estimate}


def main(argv=None) -> int:
    """Parse the command line and run the subcommand; its exit code (docs/cli.md)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except CommandExit as exc:
        return exc.code

