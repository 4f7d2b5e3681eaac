"""How every report writes numbers and tables: one byte formatter, the ratio and gap formatters, one
Markdown table writer.

Every command's output (report.md, sweep.md, plan.md, gpu_pass.md, the terminal tables, the one-line
messages) formats bytes with :func:`fmt_bytes` and writes Markdown tables with :func:`md_table`, so a
number reads the same everywhere and a ``|`` inside a cell never breaks a table.
"""

from __future__ import annotations

import math

from parity.checks.timing import RatioSpread

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(n, digits: int = 1) -> str:
    """``n`` bytes for people: ``"123 B"``, ``"900.2 KiB"``, ``"10.4 MiB"``, ``"1.5 GiB"`` (binary units, up
    to PiB; ``digits`` decimals past bytes); ``"-"`` for None."""
    if n is None:
        return "-"
    x = float(n)
    for unit in _UNITS:
        if abs(x) < 1024 or unit == _UNITS[-1]:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.{digits}f} {unit}"
        x /= 1024
    return f"{n} B"  # unreachable: the last unit returns


def fmt_ratio(x, fmt: str = "{:.2f}") -> str:
    """A ratio (or any float) with two decimals; ``"-"`` for None or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt.format(x)


def fmt_range(r) -> str:
    """A ``[low, high]`` ratio range as ``"0.95-1.06"``; ``"-"`` for None or empty."""
    return "-" if not r else f"{r[0]:.2f}-{r[1]:.2f}"


def fmt_time_ratio(ratio, rng, with_range: bool = True) -> str:
    """A step-time ratio to ``none`` beside its ``[low, high]`` range: ``"1.27 [1.21-1.35]"``, or
    ``"noise (1.03 [0.91-1.20])"`` when the range is wider than the ratio's distance from 1
    (:attr:`parity.checks.timing.RatioSpread.noise`; no range counts as noise). ``with_range=False``
    gives ``"1.27"`` or ``"noise"`` (for a table with its own range column); ``"-"`` for None."""
    if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)):
        return "-"
    spread = RatioSpread(float(ratio), *(map(float, rng) if rng else (ratio, ratio)), 2 if rng else 1)
    if not with_range:
        return "noise" if spread.noise else f"{ratio:.2f}"
    core = f"{ratio:.2f}" + (f" [{rng[0]:.2f}-{rng[1]:.2f}]" if rng else "")
    return f"noise ({core})" if spread.noise else core


def fmt_gap(g, limit: float) -> str:
    """A prediction's relative gap to its measurement, ``"+12%"``, marked ``" !"`` above ``limit``; ``"-"`` for None."""
    if g is None:
        return "-"
    return f"{g:+.0%}" + (" !" if abs(g) > limit else "")


def fmt_bit(x) -> str:
    """A check's outcome: ``"yes"``, ``"NO"``, or ``"-"`` where it was not made (None)."""
    return "-" if x is None else ("yes" if x else "NO")


def md_cell(text) -> str:
    """One Markdown table cell: the first line of ``text``, its ``|`` escaped."""
    lines = str(text).strip().splitlines() or [""]
    return lines[0].replace("|", "\\|")


def md_table(columns, rows) -> str:
    """A Markdown table: a header of ``columns``, then one line per row (cells through :func:`md_cell`)."""
    lines = ["| " + " | ".join(md_cell(c) for c in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
