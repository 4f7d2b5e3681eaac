"""The one skeleton of every subcommand that writes into ``--out``: claim, interrupt, write, release.

::

    def cmd_x(args) -> int:
        console = make_console()
        x = checked(console, x_from_args, args)          # bad input: one line, exit 2
        with claimed(console, args.out, args.overwrite, X_FILES) as claim:
            try:
                ...                                      # the work; files written atomically
            except KeyboardInterrupt:
                claim.interrupted("interrupted: ... holds the finished cases")   # exit 130
            return code

:func:`claimed` creates and locks ``--out`` (:func:`parity.cli.checks.claim_out_dir`), keeps a previous
report (and says so last, after the verdict and the tables, or with the interrupt message), turns
Ctrl-C into ``KeyboardInterrupt`` (a second Ctrl-C exits at once), turns a file that cannot be
written into one line and exit 2, a Ctrl-C the body did not handle (while it writes its files or
prints its tables) into the same clean exit 130, and always releases the lock and puts the old
Ctrl-C handler back. Exits leave by :class:`CommandExit`, which :func:`parity.cli.run.main` turns
into the exit code.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from rich.console import Console

from parity.cli import checks as cc
from parity.report.files import OutDirLock, WriteError
from parity.report.suite_report import OutputDirError
from parity.report.terminal import terminal_width

T = TypeVar("T")

EXIT_BAD_INPUT = 2


class CommandExit(Exception):
    """Leave the command with ``code`` (its message, if any, already printed)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def make_console() -> Console:
    """The console every command prints its messages on: standard error, plain text; rich wraps nothing
    (an ``error:`` stays one line) and :func:`parity.cli.checks.note` folds notes to its width
    (:func:`parity.report.terminal.terminal_width` of standard error)."""
    return Console(stderr=True, soft_wrap=True, highlight=False, width=terminal_width(stderr=True))


def fail(console, message) -> None:
    """Print ``error: message`` (one line) and leave with exit 2 (bad input)."""
    cc.error(console, message)
    raise CommandExit(EXIT_BAD_INPUT)


def checked(console, build: Callable[..., T], *args) -> T:
    """``build(*args)``; a ValueError (or an output-folder error) is one line and exit 2, before any work."""
    try:
        return build(*args)
    except (ValueError, OutputDirError) as exc:
        fail(console, exc)


@dataclasses.dataclass
class Claim:
    """A claimed ``--out``: its lock, and how to leave on Ctrl-C."""

    out: Path
    lock: OutDirLock
    kept: str | None = None
    """Where a previous report was moved (:func:`parity.report.suite_report.prepare_out_dir`'s message), or None."""

    def interrupted(self, message: str) -> None:
        """Say what was kept, release the lock and exit 130 at once (:func:`parity.cli.checks.exit_interrupted`)."""
        console = make_console()
        cc.note(console, message)
        if self.kept:
            cc.note(console, self.kept)
        cc.exit_interrupted(self.lock)


@contextlib.contextmanager
def claimed(console, out: Path, overwrite: bool, files: tuple[str, ...]) -> Iterator[Claim]:
    """Claim ``out`` for this command's ``files`` for the body's duration (module docstring).

    Args:
        console: where messages go.
        out: the output folder (created).
        overwrite: replace a previous report instead of keeping it under ``previous/``.
        files: the names this command writes there (a folder name ends in ``/``).

    Raises:
        CommandExit: 2 when ``out`` cannot be claimed or a file cannot be written.
    """
    try:
        lock, kept = cc.claim_out_dir(out, overwrite, files)
    except OutputDirError as exc:
        fail(console, exc)
    previous = cc.install_interrupt_handler(lock)
    try:
        yield Claim(out, lock, kept)
    except WriteError as exc:
        fail(console, f"{exc}; the files already in {out} (if any) are kept whole; make room (or raise the limit) "
                      "and run again")
    except KeyboardInterrupt:  # Ctrl-C outside the command's own handler (writing its files, printing its tables)
        Claim(out, lock, kept).interrupted(f"interrupted: {out} holds the files written before Ctrl-C, each one "
                                           "whole (a file is written to a temporary name, then renamed)")
    finally:
        if kept:  # last, so that the verdict is the first thing a command prints
            cc.note(console, kept)
        cc.restore_interrupt_handler(previous)
        lock.release()
