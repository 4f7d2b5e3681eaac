"""``python -m parity estimate``: a training step's memory under each remat plan at any size, nothing allocated.

The model is a preset (``--model``: the real sizes ``gpt2-124m``, ``gpt2-350m``, ``gpt-1.3b``, and every
run preset such as ``gpt-small`` or ``minilm-l6``), a Hugging Face ``config.json`` (``--config``) or
explicit sizes (``--n-layer --d-model --n-head [--d-ff --vocab] --seq-len --batch-size``); explicit sizes
override a preset's or a config's fields (:func:`parity.inputs.real_sizes.resolve_shape`). Each framework
estimates every plan through its ``estimate_plans`` verb (:meth:`parity.runners.framework.Framework.estimate_plans`):
JAX compiles ``jit(value_and_grad(loss))`` from abstract arguments and reads XLA's buffer assignment,
PyTorch runs the step under fake tensors and counts its live storages. ``--budget`` adds the planner's
plan for a budget (``24GiB``, or ``50%`` of ``none``'s total peak), checked on its own estimate.

``--check`` (shapes that run here) also runs each plan for real and compares, through
``check_estimates``: in JAX the compile from arrays must equal the compile from shapes in every field;
in PyTorch the real step's MemTracker peak must be within ``torch_estimate.CHECK_MARGIN_BYTES`` of the fake one.

Writes ``estimate.json`` (schema :data:`SCHEMA_VERSION`: ``shape``, ``rows``, ``checks``, ``errors``),
``estimate.md`` and ``report.html`` into ``--out`` and prints a table of at most 100 columns
(:mod:`parity.runners.estimate_table`). Exit codes: 0 every estimate made (and, with ``--check``,
within its margin; with ``--budget``, a plan within the budget); 1 a check failed, no plan met the
budget or a framework's estimate failed; 2 bad input (before any compile) or an output folder that
cannot take the files; 130 interrupted.
"""

from __future__ import annotations

import dataclasses
import textwrap
import time

from jaxremat.spec.plan import parse_plan
from jaxremat.spec.planner import parse_budget

from parity.cli import checks as cc
from parity.cli.command import checked, claimed, make_console
from parity.cli.util import ascii_int
from parity.inputs.real_sizes import ESTIMATE_PRECISIONS, EstimateShape, estimate_presets, resolve_shape
from parity.report.environment import available_memory_bytes, environment_info
from parity.report.files import atomic_write, json_text
from parity.report.format import fmt_bytes
from parity.report.html import HTML_NAME, write_html
from parity.report.terminal import terminal_width
from parity.runners.estimate_budget import BudgetNotMet
from parity.runners.estimate_table import markdown_table, terminal_table
from parity.runners.framework import FRAMEWORK_NAMES, get_framework

SCHEMA_VERSION = 1
"""estimate.json schema (docs/report-schema.md)."""
DEFAULT_MODEL = "gpt2-124m"
DEFAULT_PLANS = ("none", "every_k(2)", "sqrt", "full", "full+attention_only")
ATTENTIONS = ("materialized", "fused")
FILES = ("estimate.json", "estimate.md", HTML_NAME)
CHECK_MEMORY_SHARE = 0.5
"""``--check`` runs the step for real: it is refused when ``none``'s estimated total peak exceeds this share
of the memory available to the process (the real step's peak, its compile and the estimate's own buffers
must fit beside each other)."""


def add_parser(sub) -> None:
    """Register the ``estimate`` subcommand on an argparse subparsers object."""
    p = sub.add_parser("estimate", help="a training step's memory under each plan at any size, nothing allocated",
                       description="Estimate parameters, gradients, AdamW state, activation peak and total peak of one "
                       "training step under each remat plan, in JAX (compiled from shapes) and PyTorch (fake tensors), "
                       "at real sizes, without allocating the model; writes estimate.json, estimate.md, report.html.")
    presets = estimate_presets()
    p.add_argument("--model", default=None,
                   help=f"a preset (default: {DEFAULT_MODEL} unless --config or explicit sizes): " + ", ".join(presets))
    p.add_argument("--config", default=None, metavar="PATH",
                   help="a Hugging Face config.json (GPT-2 or BERT keys), or its directory, instead of --model")
    for opt, what in (("--n-layer", "layers"), ("--d-model", "model width"), ("--n-head", "attention heads"),
                      ("--d-ff", "MLP width (default 4 x d_model for explicit sizes)"),
                      ("--vocab", "vocabulary (default 50257 for explicit sizes)"),
                      ("--seq-len", "T, tokens per sequence"), ("--batch-size", "B, sequences per step")):
        p.add_argument(opt, type=ascii_int, default=None, help=what + " (overrides the preset's or config's)")
    p.add_argument("--dtype", default="float32", choices=ESTIMATE_PRECISIONS,
                   help="float32, or bfloat16 mixed precision (float32 weights and AdamW, bfloat16 compute)")
    p.add_argument("--attention", default="materialized", choices=ATTENTIONS,
                   help="materialized (the scores as a B x H x T x T tensor: the default, the bitwise reference) or "
                   "fused (jax.nn.dot_product_attention / F.scaled_dot_product_attention)")
    p.add_argument("--plans", default=",".join(DEFAULT_PLANS),
                   help=f"comma-separated plans (default: {','.join(DEFAULT_PLANS)}); none is always estimated")
    p.add_argument("--budget", default=None,
                   help="add the planner's plan for this budget of total peak memory: bytes with a unit (24GiB) or a "
                   "percentage of none's (50%%)")
    p.add_argument("--check", action="store_true",
                   help="also run each plan for real (shapes that fit here) and compare with its estimate")
    p.add_argument("--frameworks", default=",".join(FRAMEWORK_NAMES),
                   help=f"comma-separated subset of {','.join(FRAMEWORK_NAMES)} (default: all)")
    p.add_argument("--out", default="estimate-report",
                   help="output directory (default: estimate-report/); a previous estimate there is moved to "
                   "previous/<timestamp>/ unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace a previous estimate in --out instead of keeping it")


@dataclasses.dataclass(frozen=True)
class EstimateRequest:
    """One ``estimate`` command, checked: the shape, the plans, the budget, the frameworks."""

    shape: EstimateShape
    plans: tuple[str, ...]
    budget: str | None
    frameworks: tuple[str, ...]
    check: bool


def request_from_args(args) -> EstimateRequest:
    """The command's :class:`EstimateRequest`; raises ValueError (one line) on bad input, before any compile."""
    args.out = cc.out_path("--out", args.out)
    sizes = {k: getattr(args, k) for k in ("n_layer", "d_model", "n_head", "d_ff", "vocab", "seq_len", "batch_size")}
    explicit = any(v is not None for k, v in sizes.items() if k not in ("seq_len", "batch_size"))
    if args.model is not None and args.config is not None:
        raise ValueError("--model and --config both given; a config brings its own model: drop one")
    model = args.model if args.model is not None or args.config is not None or explicit else DEFAULT_MODEL
    if model is not None and model not in estimate_presets():
        raise ValueError(f"--model {model!r} is not a preset; choose one of {', '.join(estimate_presets())}, or give "
                         "--config or explicit sizes")
    shape = resolve_shape(model, config_path=args.config, precision=args.dtype, attention=args.attention, **sizes)
    plans = tuple(p.name for p in cc.parsed_items("--plans", args.plans, parse_plan))
    for name in plans:
        parse_plan(name).segments_for(shape.config.n_layer)  # a plan invalid at this depth: bad input
    budget = None if args.budget is None else parse_budget(args.budget).text
    frameworks = cc.frameworks_option(args.frameworks)
    cc.check_platforms(frameworks)
    return EstimateRequest(shape, plans, budget, frameworks, args.check)


def cmd_estimate(args) -> int:
    """Run the estimate command; returns the exit code."""
    console = make_console()
    req = checked(console, request_from_args, args)
    with claimed(console, args.out, args.overwrite, FILES) as claim:  # a refused --out ends here, before the note
        cc.note(console, f"estimating {req.shape.describe()}")
        try:
            report = _estimate(req, console)
        except KeyboardInterrupt:
            claim.interrupted(f"interrupted: nothing was written to {args.out}")
        return _write(args.out, report, console)


def _shape_record(shape: EstimateShape) -> dict:
    return {"name": shape.name, "config": dataclasses.asdict(shape.config), "batch_size": shape.batch_size,
            "seq_len": shape.seq_len, "precision": shape.precision, "parameters": shape.parameter_count,
            "description": shape.describe()}


def _estimate(req: EstimateRequest, console) -> dict:
    shape, t0 = req.shape, time.perf_counter()
    report = {"schema": SCHEMA_VERSION, "command": "estimate", "shape": _shape_record(shape),
              "model": shape.name, "config": dataclasses.asdict(shape.config), "batch_size": shape.batch_size,
              "seq_len": shape.seq_len, "plans": list(req.plans), "budget": req.budget,
              "frameworks": list(req.frameworks), "rows": [], "checks": [], "errors": []}
    for fw in req.frameworks:
        framework = get_framework(fw)
        cc.note(console, f"{framework.info.label}: estimating {len(req.plans) + (req.budget is not None)} plan(s)")
        try:
            rows = framework.estimate_plans(shape.config, shape.batch_size, shape.seq_len, req.plans,
                                            budget=req.budget)
        except BudgetNotMet as exc:
            rows = exc.rows
            report["errors"].append({"framework": fw, "error": str(exc), "kind": "budget"})
        except (ValueError, RuntimeError, MemoryError) as exc:  # recorded; the other framework still runs
            report["errors"].append({"framework": fw, "error": f"{type(exc).__name__}: {exc}", "kind": "estimate"})
            continue
        report["rows"] += [{**r, "framework": fw} for r in rows]
        if req.check:
            report["checks"] += _check(framework, shape, rows, req.plans, report["errors"], console)
    report["wall_time_s"] = time.perf_counter() - t0
    report["environment"] = environment_info(req.frameworks)
    return report


def _check(framework, shape: EstimateShape, rows: list[dict], plans, errors: list, console) -> list[dict]:
    fw = framework.info.name
    need = next(r["total_peak_bytes"] for r in rows if r["plan"] == "none")
    have = available_memory_bytes()
    if have is not None and need > CHECK_MEMORY_SHARE * have:
        errors.append({"framework": fw, "kind": "check", "error": (
            f"--check runs the step for real: none's estimated peak is {fmt_bytes(need)}, over "
            f"{CHECK_MEMORY_SHARE:.0%} of the {fmt_bytes(have)} available here; check a smaller shape "
            "(--batch-size, --seq-len) or drop --check")})
        return []
    cc.note(console, f"{framework.info.label}: running {len(plans)} plan(s) for real to check the estimates")
    try:
        return framework.check_estimates(shape.config, shape.batch_size, shape.seq_len, plans)
    except (ValueError, RuntimeError, MemoryError) as exc:
        errors.append({"framework": fw, "kind": "check", "error": f"{type(exc).__name__}: {exc}"})
        return []


def passed(report: dict) -> bool:
    """Every framework estimated every plan, every check within its margin, every budget met."""
    return not report["errors"] and all(c["within_margin"] for c in report["checks"])


def checks_markdown(checks: list[dict]) -> str:
    """The ``--check`` rows as a Markdown table (bytes exact)."""
    if not checks:
        return ""
    lines = ["| fw | plan | estimate bytes | real bytes | difference | margin | ok |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {c['framework']} | `{c['plan']}` | {c['estimated_peak_bytes']} | {c['measured_peak_bytes']} | "
              f"{c['difference_bytes']:+d} | {c['margin_bytes']} | {'yes' if c['within_margin'] else 'NO'} |"
              for c in checks]
    whats = dict.fromkeys(f"- {c['framework']}: {c['what']}" for c in checks)
    return "\n".join([*lines, "", *whats])


def markdown(report: dict) -> str:
    """estimate.md: the shape, the table, the checks, the errors."""
    parts = [f"# Memory estimate: {report['shape']['description']}", ""]
    if report["rows"]:
        parts += [markdown_table(report["rows"]), ""]
    if report["checks"]:
        parts += ["## Checked against the step run for real", "", checks_markdown(report["checks"]), ""]
    parts += [f"- {e['framework']}: {e['error']}" for e in report["errors"]]
    return "\n".join(parts).rstrip() + "\n"


def _terminal_checks(checks: list[dict]) -> str:
    """The ``--check`` rows on the terminal: a header, a row per plan (bytes exact), then what each framework compared."""
    width = max([len("plan")] + [len(c["plan"]) for c in checks])
    out = ["check: the step's peak estimated, then measured on the step run for real (bytes)",
           f"{'fw':<6} {'plan':<{width}} {'estimate':>14} {'real':>14} {'difference':>10}  ok"]
    for c in checks:
        out.append(f"{c['framework']:<6} {c['plan']:<{width}} {c['estimated_peak_bytes']:>14} "
                   f"{c['measured_peak_bytes']:>14} {c['difference_bytes']:>+10}  "
                   f"{'yes' if c['within_margin'] else 'OVER MARGIN'}")
    out += [textwrap.fill(f"{fw}: {what}", terminal_width(), subsequent_indent="  ")
            for fw, what in dict.fromkeys((c["framework"], c["what"]) for c in checks)]
    return "\n".join(out)


def _write(out, report: dict, console) -> int:
    atomic_write(out / "estimate.json", json_text(report))
    atomic_write(out / "estimate.md", markdown(report))
    write_html(report, out)
    if report["rows"]:
        print(terminal_table(report["rows"]))
    if report["checks"]:
        print(_terminal_checks(report["checks"]))
    for e in report["errors"]:
        cc.error(console, f"{e['framework']}: {e['error']}")
    ok = passed(report)
    cc.note(console, f"wrote {out / 'estimate.json'}, {out / 'estimate.md'}, {out / HTML_NAME} "
            f"({report['wall_time_s']:.0f} s){'' if ok else '; FAILED (see above)'}")
    return 0 if ok else 1
