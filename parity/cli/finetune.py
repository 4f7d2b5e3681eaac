"""``python -m parity finetune``: a real fine-tuning run under every plan, step by step against ``none``.

Writes ``finetune.json`` (after every finished case; ``complete: false`` until the end),
``finetune.md``, ``loss_curve.png`` and ``report.html`` into ``--out``, and ``none``'s trained weights
under ``--out/finetune/``. Exit codes: 0 every plan's losses and trained weights bitwise equal to
``none``'s in each framework, lower peak activation, and JAX within its bounds of PyTorch; 1 a check
failed or a case errored; 2 bad input or an output folder that cannot take the files (or an
interrupted run there with other settings); 130 interrupted (the finished cases are kept and the
same command continues from them).
"""

from __future__ import annotations

# Deferred imports: matplotlib (the loss curve) loads once the run has finished, so --help and bad input answer
# fast.

import dataclasses
import json
import time
from pathlib import Path

from jaxremat.spec.plan import parse_plan

from parity.cases.finetune import (FINETUNE_PLANS, SCHEMA_VERSION, FinetuneCases, FinetuneConfig, cross_rows,
                                   load_none_weights, resumable)
from parity.cases.loop import Callbacks, run_cases
from parity.checks.verdict import report_passed
from parity.cli import checks as cc
from parity.cli.command import checked, claimed, fail, make_console
from parity.cli.util import ascii_int
from parity.inputs.presets import PRESETS, get_preset
from parity.inputs.pretrained import FINE_TUNE, checkpoint_preset, preset_batches
from parity.report.environment import environment_info
from parity.report.files import atomic_write, json_text
from parity.report.finetune_report import finetune_markdown, print_finetune
from parity.report.html import HTML_NAME, write_html
from parity.report.terminal import terminal_console
from parity.runners.framework import FRAMEWORK_NAMES, FRAMEWORKS, loss_term_scale

DEFAULT_MODEL = "minilm-l6"
DEFAULT_STEPS = 6
"""Steps of the default run: 6m14s of CPU time for every plan in both frameworks at minilm-l6's B=8, T=128, chosen
to keep a quiet 2-core run within about ten minutes (docs/finetune.md)."""
FILES = ("finetune.json", "finetune.md", "loss_curve.png", HTML_NAME, "finetune/")


def add_parser(sub) -> None:
    """Register the ``finetune`` subcommand on an argparse subparsers object."""
    p = sub.add_parser("finetune", help="a real fine-tuning run under every plan, losses and weights against none",
                       description="Fine-tune a real checkpoint for N AdamW steps under every plan in JAX and PyTorch; "
                       "every step's loss and the trained weights bitwise against none; JAX against PyTorch; peak "
                       "memory and step time; writes finetune.json, finetune.md, loss_curve.png, report.html.")
    p.add_argument("--model", default=None,
                   help=f"a preset with a real checkpoint (default: {DEFAULT_MODEL}): "
                   + ", ".join(n for n, q in PRESETS.items() if q.checkpoint is not None))
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="fine-tune a local Hugging Face checkpoint directory instead (config.json, model.safetensors, "
                   "tokenizer.json), at its own dropout rate")
    p.add_argument("--steps", type=ascii_int, default=DEFAULT_STEPS,
                   help=f"AdamW steps, one fixed batch each (default: {DEFAULT_STEPS})")
    p.add_argument("--schedules", default=",".join(FINETUNE_PLANS),
                   help=f"comma-separated plans (default: {','.join(FINETUNE_PLANS)})")
    p.add_argument("--frameworks", default=",".join(FRAMEWORK_NAMES),
                   help=f"comma-separated subset of {','.join(FRAMEWORK_NAMES)} (default: all)")
    p.add_argument("--seed", type=ascii_int, default=0, help="dropout seed and the first batch's group (default: 0)")
    p.add_argument("--out", default="finetune-report",
                   help="output directory (default: finetune-report/); an interrupted run there of the same "
                   "settings is continued; a finished one is moved to previous/<timestamp>/ unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="start again, replacing what --out holds")
    p.add_argument("--no-progress", action="store_true", help="do not print a line per step")
    p.add_argument("--wide", action="store_true", help="print every column of the case table (finetune.md has them all)")


def config_from_args(args) -> FinetuneConfig:
    """The run's :class:`parity.cases.finetune.FinetuneConfig`; raises ValueError (one line) on bad input."""
    args.out = cc.out_path("--out", args.out)
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    cc.check_seed(args.seed)
    if args.checkpoint is not None and args.model is not None:
        raise ValueError("--checkpoint and --model both given; a checkpoint brings its own model: drop --model")
    if args.checkpoint is not None:
        if not args.checkpoint.strip():
            raise ValueError("--checkpoint is empty; give a checkpoint directory")
        preset = checkpoint_preset(Path(args.checkpoint))
    else:
        preset = get_preset(args.model or DEFAULT_MODEL)
    if preset.checkpoint is None:
        raise ValueError(f"--model {args.model} has random weights; fine-tuning runs a real checkpoint: "
                         + ", ".join(n for n, q in PRESETS.items() if q.checkpoint is not None))
    preset.checkpoint()  # a missing checkpoint is bad input (the message gives the install command)
    frameworks = cc.frameworks_option(args.frameworks)
    plans = cc.parsed_items("--schedules", args.schedules, parse_plan)
    config = FinetuneConfig(preset=preset, plans=plans, frameworks=frameworks, steps=args.steps,
                            hparams=preset.hparams or FINE_TUNE, seed=args.seed)
    config.plan_list()
    cc.check_platforms(frameworks)
    return config


def _fingerprint(config: FinetuneConfig, cfg) -> dict:
    return json.loads(json_text({"model": config.preset.name, "config": dataclasses.asdict(cfg),
                                 "batch_size": config.preset.batch_size, "seq_len": config.preset.seq_len,
                                 "steps": config.steps, "hparams": dataclasses.asdict(config.hparams),
                                 "seed": config.seed, "plans": [n for n, _ in config.plan_list()],
                                 "frameworks": list(config.frameworks)}))


def _previous(out) -> dict | None:
    path = out / "finetune.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def cmd_finetune(args) -> int:
    """Run the fine-tuning command; returns the exit code."""
    console = make_console()
    config = checked(console, config_from_args, args)
    cfg, params, batches = checked(console, preset_batches, config.preset, "float32", config.seed, config.steps)
    cfg = cfg.replace(dropout=config.dropout)
    fingerprint = _fingerprint(config, cfg)
    finished, why_not = ({}, None) if args.overwrite else resumable(_previous(args.out), fingerprint)
    if why_not:
        fail(console, f"--out {args.out}: {why_not}; pass --overwrite to start again, or another --out")
    files = () if finished else FILES  # continuing: what the interrupted run wrote stays
    with claimed(console, args.out, args.overwrite and not finished, files) as claim:
        if finished:
            cc.note(console, f"continuing the interrupted run in {args.out}: {len(finished)} finished cases kept")
        return _finetune(args, config, cfg, params, batches, fingerprint, finished, console, claim)


def _finetune(args, config, cfg, params, batches, fingerprint, finished, console, claim) -> int:
    env = environment_info(config.frameworks)
    report = {"schema": SCHEMA_VERSION, "command": "finetune", **fingerprint, "cases": [], "cross_framework": [],
              "complete": False, "environment": env}
    t0 = time.perf_counter()

    def save(extra=None):
        atomic_write(args.out / "finetune.json", json_text({**report, "cases": report["cases"] + (extra or [])}))

    def on_start(label):
        if not args.no_progress:
            cc.note(console, label)

    def progress(case):
        save([case])
        if not args.no_progress:
            cc.note(console, f"  step {len(case['losses'])}/{config.steps}: loss {case['losses'][-1]:.6f}")

    modes = [(f, FRAMEWORKS[f].measured_mode) for f in config.frameworks]
    plans = config.plan_list()
    runs = {}
    passes = [(cfg.dropout, plans)]
    if cfg.dropout > 0 and len(config.frameworks) > 1:  # the cross-framework runs: none without dropout
        passes.append((0.0, plans[:1]))
    try:
        for dropout, rate_plans in passes:
            rate_cfg = cfg.replace(dropout=dropout)
            cases = FinetuneCases(config, rate_cfg, params, batches, args.out / "finetune", finished, progress)
            got = run_cases(report, rate_plans, modes, cases, Callbacks(on_start=on_start, on_partial=lambda r: save()))
            runs[dropout] = got
        report["cross_framework"] = _cross(config, cfg, params, batches, runs, args.out / "finetune")
    except KeyboardInterrupt:
        save()
        claim.interrupted(f"interrupted: {args.out / 'finetune.json'} holds the {len(report['cases'])} finished cases; "
                          "the same command continues from them")
    report.update(complete=True, wall_time_s=time.perf_counter() - t0)
    return _write(args, report, console)


def _cross(config, cfg, params, batches, runs, weights_dir) -> list[dict]:
    if len(config.frameworks) < 2:
        return []
    rate = 0.0 if 0.0 in runs else cfg.dropout
    if rate != 0.0:
        return []  # a model without dropout: its runs at its rate are the dropout-free ones
    losses, trained = {}, {}
    for fw in config.frameworks:
        mode = FRAMEWORKS[fw].measured_mode
        res = runs[rate].get((fw, mode, "none"))
        if res is None:
            continue
        losses[fw] = getattr(res, "losses", None)
        if losses[fw] is None:  # finished in an interrupted run: its record and its weights file
            losses[fw] = res.record["losses"]
        trained[fw] = getattr(res, "trained", None) or load_none_weights(weights_dir, fw, mode, rate)
    scale = loss_term_scale(cfg.replace(dropout=0.0), params, batches[0])
    return cross_rows(losses, trained, cfg, scale, config.steps)


def _write(args, report: dict, console) -> int:
    from parity.report.plots import plot_loss_curves

    report["loss_curve"] = plot_loss_curves(report, args.out / "loss_curve.png").name
    atomic_write(args.out / "finetune.json", json_text(report))
    atomic_write(args.out / "finetune.md", finetune_markdown(report))
    write_html(report, args.out)
    print_finetune(report, terminal_console(args.wide), args.wide)
    cc.note(console, f"wrote {args.out / 'finetune.json'}, {args.out / 'finetune.md'}, {args.out / 'loss_curve.png'}, "
            f"{args.out / HTML_NAME}")
    if report_passed(report):
        cc.note(console, "every plan's losses and trained weights are bitwise those of none", "green")
        return 0
    cc.note(console, "some check failed or a case errored (see finetune.md)", "bold red")
    return 1
