"""The estimate's table, from both frameworks' rows: terminal text (at most 100 columns), Markdown and JSON.

The rows are :func:`parity.runners.jax_estimate.estimate_plans` and
:func:`parity.runners.torch_estimate.estimate_plans` (keys :data:`parity.runners.estimate_budget.ROW_KEYS`),
in any order; a command prints :func:`terminal_table`, writes :func:`markdown_table` and :func:`to_json`,
and stays thin. Bytes are shown in one unit for the whole table (GiB, or MiB when the largest total is
under 1 GiB: 1 GiB = 2^30 bytes), FLOPs in TFLOP, times in seconds; JSON keeps the raw numbers. Columns
are one tuple each, ``(header, key, formatter)`` (:func:`columns`). Imports neither JAX nor PyTorch.
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

__all__ = ["PLAN_WIDTH", "TERMINAL_WIDTH", "columns", "markdown_table", "terminal_table", "to_json", "unit_of"]

TERMINAL_WIDTH = 100
"""The terminal table's widest line (characters)."""

PLAN_WIDTH = 22
"""Plan names longer than this are shown as ``[1]``, ``[2]`` ... in the terminal, spelled out below it."""


def unit_of(rows: Sequence[dict]) -> tuple[str, int]:
    """``("GiB", 2**30)``, or ``("MiB", 2**20)`` when every total peak is under 1 GiB."""
    largest = max((r["total_peak_bytes"] for r in rows), default=0)
    return ("GiB", 2**30) if largest >= 2**30 else ("MiB", 2**20)


def _bytes(scale: int) -> Callable:
    return lambda v: "-" if v is None else f"{v / scale:.2f}"


def _ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _tflop(v) -> str:
    return "-" if v is None else f"{v / 1e12:.2f}" if v >= 1e10 else f"{v / 1e12:.4f}"


def _seconds(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def columns(unit: str, scale: int) -> tuple[tuple[str, str, Callable], ...]:
    """``(header, key, formatter)`` of every column, bytes in ``unit`` (``scale`` bytes each); the
    headers name the units (Markdown); the terminal shows them once, above the table."""
    b = _bytes(scale)
    return (("fw", "framework", str), ("plan", "plan", str), (f"params {unit}", "parameters_bytes", b),
            (f"grads {unit}", "gradients_bytes", b), (f"AdamW {unit}", "adamw_state_bytes", b),
            (f"act peak {unit}", "activation_peak_bytes", b), (f"total {unit}", "total_peak_bytes", b),
            ("x none", "ratio_to_none", _ratio), ("recompute TFLOP", "recompute_flops", _tflop),
            ("time s", "compile_time_s", _seconds))


def _budget_note(row: dict) -> str:
    b = row.get("budget")
    if not b:
        return ""
    state = "within" if b["within_budget"] else "OVER"
    return f" ({state} budget {b['budget']}, {len(b['attempts'])} attempt(s))"


TORCH_TOTAL_NOTE = "total: the step's peak; PyTorch's may be below its columns' sum (gradients appear as activations go)"
"""The last line under a table with PyTorch rows (after the long plans' ``[k]`` lines): their total is the step's
peak, which comes while the backward pass creates the gradients and frees the activations, so it can be less than
parameters + gradients + AdamW + activation peak (JAX's total is that sum: docs/real-sizes.md, "What a row holds")."""


def terminal_table(rows: Sequence[dict]) -> str:
    """The rows as a fixed-width table of at most :data:`TERMINAL_WIDTH` characters a line.

    Long plan names (the planner's) are replaced by ``[k]`` and listed under the table; a budget
    row says whether its estimate is within the budget.
    """
    unit, scale = unit_of(rows)
    cols = columns(unit, scale)
    notes, cells = [], []
    for r in rows:
        line = []
        for header, key, fmt in cols:
            text = fmt(r.get(key))
            if key == "plan" and len(text) > PLAN_WIDTH:
                notes.append(f"[{len(notes) + 1}] {text}{_budget_note(r)}")
                text = f"[{len(notes)}]"
            line.append(text)
        cells.append(line)
    headers = [h.replace(f" {unit}", "").replace(" TFLOP", "").replace(" s", "") for h, _, _ in cols]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    out = [f"bytes in {unit}, recompute in TFLOP, time (to estimate) in s; x none: total over none's total"]
    out += [" ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    out += [" ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
            for line in cells]
    out += [_wrap(n) for n in notes]
    if any(r.get("framework") == "torch" for r in rows):
        out.append(TORCH_TOTAL_NOTE)
    return "\n".join(out)


def _wrap(text: str) -> str:
    lines, rest = [], text
    while len(rest) > TERMINAL_WIDTH:
        cut = rest.rfind(",", 0, TERMINAL_WIDTH) + 1 or TERMINAL_WIDTH
        lines.append(rest[:cut])
        rest = "    " + rest[cut:]
    return "\n".join([*lines, rest])


def markdown_table(rows: Sequence[dict]) -> str:
    """The rows as a Markdown table (plan names in full, each framework's source listed under it, then
    :data:`TORCH_TOTAL_NOTE` when PyTorch rows are there)."""
    unit, scale = unit_of(rows)
    cols = columns(unit, scale)
    out = ["| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [fmt(r.get(k)) for _, k, fmt in cols]
        cells[1] = f"`{cells[1]}`" + _budget_note(r)
        out.append("| " + " | ".join(cells) + " |")
    sources = {}
    for r in rows:
        sources.setdefault(r["framework"], r["backend"])
    out += ["", *(f"- {fw}: {src}" for fw, src in sources.items())]
    if "torch" in sources:
        out += ["", TORCH_TOTAL_NOTE[0].upper() + TORCH_TOTAL_NOTE[1:] + "."]
    return "\n".join(out)


def to_json(rows: Sequence[dict], shape: dict | None = None) -> str:
    """``{"shape": shape, "rows": rows}`` as JSON text (raw bytes, FLOPs and seconds)."""
    return json.dumps({"shape": shape, "rows": list(rows)}, indent=2, sort_keys=False)
