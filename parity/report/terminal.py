"""Tables on the terminal: within the terminal's width (100 columns where there is none), nothing cut.

Every command prints its tables through :func:`terminal_console` and :func:`fitted_table`: the width is
the terminal's, else ``COLUMNS``, else :data:`DEFAULT_WIDTH` (a pipe or a CI log); ``--wide`` prints at
:data:`WIDE_WIDTH` at least, for the tables that then show every column. A cell too long for its
column folds onto the next line; a header is never cut (:data:`HEADER_OVERFLOW`). Plan names are never cut
mid-word: :func:`name_table` breaks them only after a ``+`` or a ``,`` (:func:`break_name`), at the line width
that keeps every word whole within the terminal's width and folds the fewest lines (the case table of ``run`` and
the plan table alike). report.md, report.json and report.html keep every column whatever
the terminal.
"""

from __future__ import annotations

import io
import os
import re
from typing import Iterable, Mapping, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["DEFAULT_WIDTH", "NAME_BREAKS", "WIDE_WIDTH", "break_name", "fitted_table", "name_pieces", "name_table",
           "terminal_console", "terminal_width"]

DEFAULT_WIDTH = 100
"""Columns of output where neither a terminal nor ``COLUMNS`` gives a width."""
WIDE_WIDTH = 400
"""The least width of ``--wide`` output: every column of the case table at its natural width (about 270)."""
HEADER_OVERFLOW = "fold"
NAME_BREAKS = "+,"
"""The characters of a plan name after which :func:`break_name` may break a line (``full+save_dots``,
``plan(2+save_nothing,3:store)``)."""
_PIECE = re.compile(r"[^+,]*[+,]|[^+,]+$")


def terminal_width(stderr: bool = False) -> int:
    """The width output should fit: ``COLUMNS`` when set to a positive integer, else the width of the terminal
    standard output is (standard error with ``stderr``), else :data:`DEFAULT_WIDTH`."""
    text = os.environ.get("COLUMNS", "")
    if text.isdigit() and int(text) > 0:
        return int(text)
    probe = Console(stderr=stderr)
    return probe.width if probe.is_terminal and probe.width > 0 else DEFAULT_WIDTH  # rich reads COLUMNS=0 as 0


def terminal_console(wide: bool = False) -> Console:
    """A console for tables on standard output at :func:`terminal_width` (at least :data:`WIDE_WIDTH` when ``wide``)."""
    width = terminal_width()
    return Console(width=max(width, WIDE_WIDTH) if wide else width, highlight=False)


def fitted_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[str]], *, left: Sequence[bool] = (),
                 styles: Iterable[str | None] = (), widths: Mapping[int, int] | None = None) -> Table:
    """A rich table whose cells fold instead of being cut (``left[i]``: left-justify column i; ``styles``: per row;
    ``widths``: ``{column: characters}`` for columns of a fixed width, the others shrinking first)."""
    t = Table(title=Text(title), box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    left = list(left) + [False] * (len(headers) - len(left))
    for i, (h, is_left) in enumerate(zip(headers, left)):
        t.add_column(Text(h), justify="left" if is_left else "right", overflow=HEADER_OVERFLOW,
                     width=(widths or {}).get(i))
    styles = list(styles)
    for i, row in enumerate(rows):
        t.add_row(*map(Text, row), style=styles[i] if i < len(styles) else None)
    return t


def name_pieces(name: str) -> list[str]:
    """``name`` cut after each ``+`` and ``,`` (:data:`NAME_BREAKS`): the pieces no line break may split."""
    return _PIECE.findall(name) or [name]


def break_name(name: str, width: int) -> str:
    """``name`` with line breaks after ``+`` or ``,`` only, each line at most ``width`` characters where its pieces
    allow (a piece longer than ``width`` stays whole on its own line); joined, the lines are ``name``."""
    lines = [""]
    for piece in name_pieces(name):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(lines)


def name_table(console: Console, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
               name_columns: Sequence[int], **kw) -> Table:
    """:func:`fitted_table` whose ``name_columns`` hold plan names, broken by :func:`break_name` and of a fixed
    width: of the ways to break the names, the one with which the table, printed at ``console``'s width, cuts no
    word of any cell or header and prints the fewest lines, the one with the longest lines of those; the name
    columns are as wide as their longest line (else the width of the longest piece, and the terminal folds what it
    must).

    Each way to break the names is tried once, at the width of its longest line: a wider column would hold the
    same lines and only take room from the other columns. (Trying every width from the longest piece to the
    longest name printed the table ~70 times for ``plan --frontier``'s table, 1.4 s.) Only when none of those
    fits are the other widths tried: a name-column header word longer than every such line, or names of
    double-width characters (their lines take more columns than characters)."""
    names = {row[i] for row in rows for i in name_columns}
    floor = max((len(p) for n in names for p in name_pieces(n)), default=1)
    words = {w for h in headers for w in h.split()} | {w for row in rows for i, c in enumerate(row)
                                                        if i not in name_columns for w in c.split()}

    def table(width: int) -> tuple[Table, set]:
        broken = [[break_name(c, width) if i in name_columns else c for i, c in enumerate(row)] for row in rows]
        whole = words | {line for row in broken for i in name_columns for line in row[i].split("\n")}
        return fitted_table(title, headers, broken, widths={i: width for i in name_columns}, **kw), whole

    def printed(width: int) -> tuple[bool, int]:
        """(no word cut, lines printed) at name width ``width``."""
        t, whole = table(width)
        probe = Console(width=console.width, file=io.StringIO(), highlight=False, color_system=None)
        probe.print(t)
        out = probe.file.getvalue()
        return whole <= set(out.split()), out.count("\n")

    lo, hi = floor, max((len(n) for n in names), default=floor)
    # the longest line of each way to break the names (at least the longest piece, at most the longest name): at
    # that width break_name breaks every name as at any width up to the next such length
    tight = sorted({max((len(line) for n in names for line in break_name(n, w).split("\n")), default=lo)
                    for w in range(lo, hi + 1)})
    fits = [(lines, -w) for w in tight for ok, lines in [printed(w)] if ok]
    if not fits:  # wider than its longest line: a header word longer than it, or double-width characters, need it
        fits = [(lines, -w) for w in range(lo, hi + 1) if w not in tight for ok, lines in [printed(w)] if ok]
    # the breaks that cut nothing and fold the fewest lines (narrower names leave the other columns more room);
    # of equals, the longest lines
    return table(-min(fits)[1] if fits else lo)[0]
