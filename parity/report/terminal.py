"""Tables on the terminal: within the terminal's width (100 columns where there is none), nothing cut.

Every command prints its tables through :func:`terminal_console` and :func:`fitted_table`: the width is
the terminal's, else ``COLUMNS``, else :data:`DEFAULT_WIDTH` (a pipe or a CI log); ``--wide`` prints at
:data:`WIDE_WIDTH` at least, for the tables that then show every column. A cell too long for its
column folds onto the next line; a header is never cut (:data:`HEADER_OVERFLOW`). report.md,
report.json and report.html keep every column whatever the terminal.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["DEFAULT_WIDTH", "WIDE_WIDTH", "fitted_table", "terminal_console", "terminal_width"]

DEFAULT_WIDTH = 100
"""Columns of output where neither a terminal nor ``COLUMNS`` gives a width."""
WIDE_WIDTH = 400
"""The least width of ``--wide`` output: every column of the case table at its natural width (about 270)."""
HEADER_OVERFLOW = "fold"


def terminal_width() -> int:
    """The width output should fit: ``COLUMNS`` when set to a positive integer, else the terminal's, else
    :data:`DEFAULT_WIDTH`."""
    text = os.environ.get("COLUMNS", "")
    if text.isdigit() and int(text) > 0:
        return int(text)
    probe = Console()
    return probe.width if probe.is_terminal else DEFAULT_WIDTH


def terminal_console(wide: bool = False) -> Console:
    """A console for tables on standard output at :func:`terminal_width` (at least :data:`WIDE_WIDTH` when ``wide``)."""
    width = terminal_width()
    return Console(width=max(width, WIDE_WIDTH) if wide else width, highlight=False)


def fitted_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[str]], *, left: Sequence[bool] = (),
                 styles: Iterable[str | None] = ()) -> Table:
    """A rich table whose cells fold instead of being cut (``left[i]``: left-justify column i; ``styles``: per row)."""
    t = Table(title=Text(title), box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    left = list(left) + [False] * (len(headers) - len(left))
    for h, is_left in zip(headers, left):
        t.add_column(Text(h), justify="left" if is_left else "right", overflow=HEADER_OVERFLOW)
    styles = list(styles)
    for i, row in enumerate(rows):
        t.add_row(*map(Text, row), style=styles[i] if i < len(styles) else None)
    return t
