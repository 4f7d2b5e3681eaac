"""Checks and plumbing shared by ``run`` and ``sweep``: strict option values, the output directory
(created, locked, a previous report kept), the JAX platform, plain-text messages and Ctrl-C.

Every check raises ValueError (or :class:`parity.report.suite_report.OutputDirError`) with one line that says
what is wrong and how to fix it; the commands print it and exit 2.
"""

from __future__ import annotations

# Deferred imports: JAX loads only to check its platform, so --help and bad input answer without it.

import os
import re
import signal
import sys
from pathlib import Path

from rich.text import Text

from parity.cli.util import split_list
from parity.report.files import OutDirBusy, OutDirLock, WriteError
from parity.checks.verdict import report_passed
from parity.report.suite_report import OutputDirError, prepare_out_dir, print_tables, write_report

EXIT_INTERRUPTED = 130


def error(console, message: str) -> None:
    """Print ``error: message`` as plain text (a ``[name]`` in it is printed, never read as markup)."""
    console.print(Text.assemble(("error: ", "bold red"), str(message)))


def note(console, message: str, style: str | None = None) -> None:
    """Print ``message`` as plain text, optionally in one style."""
    console.print(Text(str(message), style=style or ""))


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


def check_jax_platform() -> str:
    """Start JAX's backend now; return its platform name.

    Raises:
        ValueError: the backend cannot start (e.g. ``JAX_PLATFORMS=cuda`` on a machine without a
            GPU, which JAX reports as an empty AssertionError); the message names the setting.
    """
    import jax

    try:
        return jax.devices()[0].platform
    except Exception as exc:  # RuntimeError, or a bare AssertionError for a missing plugin
        setting = os.environ.get("JAX_PLATFORMS")
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "no such platform on this machine"
        where = f"JAX_PLATFORMS={setting!r}" if setting else "the default platform"
        raise ValueError(f"JAX cannot start on {where}: {reason}; unset JAX_PLATFORMS (or set it to cpu), "
                         "or run --frameworks torch") from None


def claim_out_dir(out: Path, overwrite: bool, files: tuple[str, ...]) -> tuple[OutDirLock, str | None]:
    """Create ``out``, lock it for this process, and keep a previous report; return the lock and a note.

    Raises:
        OutputDirError: ``out`` is not a directory, cannot be written, is locked by another run
            (the message names its PID), or the previous report cannot be kept.
    """
    try:
        if out.exists() and not out.is_dir():
            raise OutputDirError(f"output path {out} exists and is not a directory; pass another --out")
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(f"cannot write to output directory {out}: {exc.strerror or exc}; pass a writable --out") from None
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


def finish_report(console, report: dict, out: Path, where: str) -> int:
    """Write a complete suite report into ``out``, print its tables and the verdict; return the exit code.

    ``where`` names the part of the report a failure is explained in (e.g. "the report's failed checks
    and errors"). Returns 0 when every check passed, else 1.

    Raises:
        parity.report.files.WriteError: a file could not be written.
    """
    paths = write_report(report, out)
    print_tables(report)
    note(console, "wrote " + ", ".join(str(p) for p in paths))
    if report_passed(report):
        note(console, "all parity checks passed", "green")
        return 0
    note(console, f"parity checks failed (see {where})", "bold red")
    return 1
