"""The fine-tuning run's report: finetune.md and the terminal tables (``python -m parity finetune``).

The case table is one tuple of :class:`parity.report.suite_report.Column` (as the suite's), the
cross-framework row per step, the verdict first. Bytes through :func:`parity.report.format.fmt_bytes`,
tables through :func:`parity.report.format.md_table`.
"""

from __future__ import annotations

from rich.text import Text

from parity.checks.verdict import report_passed
from parity.report.terminal import fitted_table
from parity.report.format import fmt_bit, fmt_bytes, fmt_range, fmt_ratio, md_table
from parity.report.suite_report import Column

FINETUNE_COLUMNS: tuple[Column, ...] = (
    Column("framework", "framework", left=True),
    Column("mode", "mode", left=True),
    Column("dropout", "dropout", lambda v: f"{v:g}", left=True),
    Column("plan", "plan", left=True),
    Column("status", "status", left=True),
    Column("steps", lambda c: len(c.get("losses") or []), str, "steps run"),
    Column("losses bitwise", "losses_bitwise_equal", fmt_bit,
           "every step's loss has the raw bits of `none`'s (same framework, mode and dropout rate)"),
    Column("weights bitwise", "weights_bitwise_equal", fmt_bit, "so do the weights after the last step"),
    Column("max ULP", "weights_max_ulp", lambda v: "-" if v is None else str(v),
           "where the weights differ, the largest distance in units in the last place"),
    Column("final loss", lambda c: (c.get("losses") or [None])[-1], lambda v: "-" if v is None else f"{v:.6f}"),
    Column("peak", "peak_bytes", fmt_bytes, "peak bytes of one steady-state step, AdamW state held"),
    Column("peak act", "peak_activation_bytes", fmt_bytes, "that peak less parameters, gradients and optimizer state"),
    Column("peak act/none", "peak_activation_ratio", fmt_ratio),
    Column("step ms", "step_time_s", lambda v: "-" if v is None else f"{1e3 * v:.0f}",
           "median step time, the first step (which compiles) left out"),
    Column("time/none", "time_overhead", fmt_ratio),
    Column("time/none range", "time_overhead_range", fmt_range,
           "the lowest and highest ratio any pair of timed steps gives: a range that holds 1.00 is noise"),
)
"""The case table of finetune.md and the terminal."""


def verdict(report: dict) -> str:
    """One line: passed or not, cases, the cross-framework check."""
    cases = report["cases"]
    head = "INCOMPLETE" if report.get("complete") is False else "PASS" if report_passed(report) else "FAIL"
    passed = sum(c["status"] == "pass" for c in cases)
    parts = [f"{passed} of {len(cases)} runs bitwise equal to none at every step"]
    for x in report.get("cross_framework") or []:
        parts.append("JAX vs PyTorch " + ("within" if x["ok"] else "NOT within") + " its bounds over "
                     f"{x['steps']} steps" + (f" ({x['error']})" if x.get("error") else ""))
    return f"**Verdict: {head}** - " + "; ".join(parts) + "."


def _cross_table(rows: list[dict]) -> str:
    out = []
    for x in rows:
        per_step = x.get("loss_err_per_step") or []
        out.append(md_table(("step", "loss err (over the term scale)", "bound"),
                            [[str(i + 1), f"{e:.2e}", f"{x['tolerance_loss']:.2e}"] for i, e in enumerate(per_step)]))
        if x.get("trained_max_rel_err") is not None:
            out.append(f"\nTrained weights after {x['steps']} steps: largest relative error per tensor "
                       f"{x['trained_max_rel_err']:.2e}, bound {x['tolerance_trained']:.2e} "
                       f"(parity.cases.finetune.trained_bound; docs/finetune.md). "
                       f"{'ok' if x['ok'] else 'NOT ok'}.")
        if x.get("error"):
            out.append(f"\n{x['error']}")
    return "\n".join(out)


def finetune_markdown(report: dict) -> str:
    """finetune.md: the verdict, the settings, the case table and its legend, the cross-framework rows, the
    peer, the loss curve."""
    cfg = report["config"]
    parts = [f"# Fine-tuning {report['model']} under every plan", "", verdict(report), "",
             f"{report['steps']} AdamW steps (lr {report['hparams']['learning_rate']:g}) of {cfg['n_layer']} layers, "
             f"d_model {cfg['d_model']}, on {report['batch_size']} x {report['seq_len']} tokens per step, one fixed "
             f"batch per step; dropout {cfg['dropout']:g}; seed {report['seed']}.", "",
             "Each run trains from the same weights on the same batches; every plan is compared with `none` in the "
             "same framework and mode, step by step: " + "; ".join(f"`{c.header}` = {c.doc}" for c in FINETUNE_COLUMNS
                                                                   if c.doc) + ".", "",
             md_table([c.header for c in FINETUNE_COLUMNS], [[c.cell(x) for c in FINETUNE_COLUMNS] for x in report["cases"]]),
             ""]
    if report.get("cross_framework"):
        parts += ["## JAX vs PyTorch (none, dropout off)", "",
                  "The frameworks draw different dropout masks, so they are compared on `none` without dropout: the "
                  "loss of every step over the term scale of the first batch, and the trained weights.", "",
                  _cross_table(report["cross_framework"]), ""]
    for row in report.get("peer") or []:
        parts += ["## Hugging Face gradient checkpointing beside torchref", "", f"- {row.get('note', '')}", ""]
    errors = [c for c in report["cases"] if c["status"] == "error"]
    if errors:
        parts += ["## Errors", ""] + [f"- {c['framework']} {c['plan']} dropout {c['dropout']:g}: `{c['error']}`"
                                      for c in errors] + [""]
    if report.get("loss_curve"):
        parts += [f"![loss per step]({report['loss_curve']})", ""]
    return "\n".join(parts)


TERMINAL_HEADERS = ("framework", "mode", "dropout", "plan", "status", "losses bitwise", "weights bitwise",
                    "peak act/none", "time/none")
"""The case table's columns on the terminal without ``--wide`` (finetune.md has every column)."""


def print_finetune(report: dict, console, wide: bool = False) -> None:
    """The verdict, then the case table within the terminal's width (``wide``: every column)."""
    console.print(Text(verdict(report).replace("**", "")))
    cols = [c for c in FINETUNE_COLUMNS if wide or c.header in TERMINAL_HEADERS]
    console.print(fitted_table(f"fine-tuning {report['model']}: {report['steps']} steps", [c.header for c in cols],
                               ([c.cell(x) for c in cols] for x in report["cases"]), left=[c.left for c in cols],
                               styles=[None if x["status"] == "pass" else "red" for x in report["cases"]]))
