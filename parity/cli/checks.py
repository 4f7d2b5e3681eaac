"""Checks and plumbing shared by ``run`` and ``sweep``: strict option values, the output directory
(created, locked, a previous report kept), the JAX platform, plain-text messages and Ctrl-C.

Every check raises ValueError (or :class:`parity.report.suite_report.OutputDirError`) with one line that says
what is wrong and how to fix it; the commands print it and exit 2.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap
from pathlib import Path

from rich.text import Text

from typing import Callable, TypeVar

from parity.cli.util import split_list
from parity.runners.framework import FRAMEWORK_NAMES, check_frameworks, get_framework
from parity.report.files import OutDirBusy, OutDirLock, WriteError
from parity.checks.verdict import report_passed
from parity.report.suite_report import OutputDirError, prepare_out_dir, print_tables, writable_dir, write_report

EXIT_INTERRUPTED = 130
T = TypeVar("T")


def error(console, message: str) -> None:
    """Print ``error: message`` as plain text (a ``[name]`` in it is printed, never read as markup)."""
    console.print(Text.assemble(("error: ", "bold red"), str(message)))


def note(console, message: str, style: str | None = None) -> None:
    """Print ``message`` as plain text, optionally in one style, each line longer than ``console``'s width
    folded between words: a path or an option stays whole."""
    width = console.width
    lines = [textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False) if len(line) > width else line
             for line in str(message).split("\n")]
    console.print(Text("\n".join(lines), style=style or ""))


def out_path(option: str, text) -> Path:
    """``--out`` as a Path; an empty value is refused (``Path('')`` would be the current directory).

    Raises:
        ValueError: ``text`` is empty or only whitespace.
    """
    if not str(text).strip():
        raise ValueError(f"{option} is empty; give a directory, e.g. {option} parity-report")
    return Path(text)


def unique_items(option: str, text: str, canonical=None) -> tuple[str, ...]:
    """The items of a comma-separated option, each given once.

    Args:
        option: the option's name, for the message.
        text: its value.
        canonical: optional function item -> canonical name (two spellings of one value count twice).

    Raises:
        ValueError: an empty list, an empty item, unbalanced parentheses, or an item given twice.
    """
    items = split_list(text)
    if not items:
        raise ValueError(f"{option} is empty; give at least one value")
    names = [canonical(i) if canonical else i for i in items]
    for i, name in enumerate(names):
        if name in names[:i]:
            first = items[names.index(name)]
            same = f"'{items[i]}' is '{first}'" if items[i] != first else f"'{name}'"
            raise ValueError(f"{option}: {same} listed twice; list each once")
    return items


def check_seed(seed: int) -> int:
    """``--seed`` as given, if it is in [0, 2**32) (numpy's and torch's seed range).

    Raises:
        ValueError: ``seed`` is negative or 2**32 or more.
    """
    if not 0 <= seed < 2**32:
        raise ValueError(f"--seed must be an integer in [0, 2**32), got {seed}")
    return seed


def plain_ints(option: str, text: str) -> tuple[int, ...]:
    """Comma-separated integers in ASCII digits (``2_0``, ``+2`` and other numerals refused)."""
    items = unique_items(option, text)
    bad = [i for i in items if not re.fullmatch(r"[0-9]+", i, re.ASCII)]
    if bad:
        raise ValueError(f"{option} must be comma-separated integers in ASCII digits 0-9, got {bad[0]!r}")
    return tuple(int(i) for i in items)


def parsed_items(option: str, text: str, parse: Callable[[str], T]) -> tuple[T, ...]:
    """The items of a comma-separated option, each parsed once by ``parse`` (objects with a ``name``), each given once.

    Raises:
        ValueError: an empty list or item, unbalanced parentheses, an item ``parse`` refuses (its
            message), or two items with one canonical ``name`` (``every_k(2)`` and ``every_k( 2 )``).
    """
    items = split_list(text)
    if not items:
        raise ValueError(f"{option} is empty; give at least one value")
    parsed = [parse(i) for i in items]
    names = [p.name for p in parsed]
    for i, name in enumerate(names):
        if name in names[:i]:
            first = items[names.index(name)]
            same = f"'{items[i]}' is '{first}'" if items[i] != first else f"'{name}'"
            raise ValueError(f"{option}: {same} listed twice; list each once")
    return tuple(parsed)


def frameworks_option(text: str, option: str = "--frameworks") -> tuple[str, ...]:
    """``--frameworks``: names of :data:`parity.runners.framework.FRAMEWORKS`, each once, in report order.

    Raises:
        ValueError: an empty list or item, a name given twice, or an unknown framework (the valid ones named).
    """
    names = check_frameworks(option, unique_items(option, text))
    return tuple(f for f in FRAMEWORK_NAMES if f in names)


def check_platforms(frameworks) -> None:
    """Start each framework's backend now (:meth:`parity.runners.framework.Framework.check_platform`).

    Raises:
        ValueError: a backend cannot start (e.g. ``JAX_PLATFORMS=cuda`` without a GPU); the message names the setting.
    """
    for fw in frameworks:
        get_framework(fw).check_platform()


def claim_out_dir(out: Path, overwrite: bool, files: tuple[str, ...]) -> tuple[OutDirLock, str | None]:
    """Create ``out``, lock it for this process, and keep a previous report; return the lock and a note.

    Raises:
        OutputDirError: ``out`` is not a directory, cannot be written, is locked by another run
            (the message names its PID), or the previous report cannot be kept.
    """
    writable_dir(out)
    try:
        lock = OutDirLock(out)
    except (OutDirBusy, WriteError) as exc:
        raise OutputDirError(str(exc)) from None
    try:
        return lock, prepare_out_dir(out, overwrite, files)
    except BaseException:
        lock.release()
        raise


def install_interrupt_handler(lock: OutDirLock | None = None):
    """Ctrl-C: the first raises KeyboardInterrupt (the command keeps what finished and exits 130);
    a second one while that is handled releases ``lock`` and exits 130 at once, without a traceback.

    Returns the previous handler (for :func:`restore_interrupt_handler`), or None off the main thread.
    """
    def again(signum, frame):
        os.write(2, b"interrupted again: exiting now\n")
        if lock is not None:
            lock.release()
        os._exit(EXIT_INTERRUPTED)

    def first(signum, frame):
        signal.signal(signal.SIGINT, again)
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGINT, first)
    except ValueError:  # not the main thread
        return None


def restore_interrupt_handler(previous) -> None:
    """Put back the handler :func:`install_interrupt_handler` replaced."""
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def exit_interrupted(lock: OutDirLock | None) -> None:
    """Leave with 130 without interpreter teardown (XLA's threads can crash it after an interrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if lock is not None:
        lock.release()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def finish_report(console, report: dict, out: Path, where: str, wide: bool = False) -> int:
    """Write a complete suite report into ``out``, print its tables and the verdict; return the exit code.

    ``where`` names the part of the report a failure is explained in (e.g. "the report's failed checks
    and errors"); ``wide`` prints every column of the case table. Returns 0 when every check passed, else 1.

    Raises:
        parity.report.files.WriteError: a file could not be written.
    """
    paths = write_report(report, out)
    print_tables(report, wide=wide)
    note(console, "wrote " + ", ".join(str(p) for p in paths))
    if report_passed(report):
        note(console, "all parity checks passed", "green")
        return 0
    note(console, f"parity checks failed (see {where})", "bold red")
    return 1
