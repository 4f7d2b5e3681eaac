"""Files the command lines write: atomically, as standard JSON, and under a lock on ``--out``.

* :func:`atomic_write` / :func:`atomic_target`: every file goes to a temporary file in the same
  directory, is flushed to disk (``fsync``) and renamed over the real name (``os.replace``), so a
  full disk, a file-size limit or a kill leaves either the old file or the new one, never half
  of one. A failed write raises :class:`WriteError` (one line: the file and the OS's reason).
* :func:`json_text`: strict JSON (RFC 8259). Python's ``json`` writes NaN and infinities as bare
  ``NaN`` / ``Infinity``, which strict parsers reject; here a non-finite float is written as the
  string ``"nan"``, ``"inf"`` or ``"-inf"`` (:data:`NONFINITE_ENCODING`), and numpy scalars as
  numbers.
* :class:`OutDirLock`: an exclusive ``fcntl.flock`` on ``--out/.parity.lock``, held for the whole
  run, so a second run into the same directory is refused with the PID that holds it. The kernel
  drops the lock when its process dies, so a lock file left by a killed run is taken over.
"""

from __future__ import annotations

# Deferred imports: fcntl is POSIX-only: imported where the lock is taken.

import contextlib
import errno
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

_UMASK = os.umask(0)
os.umask(_UMASK)

NONFINITE_ENCODING = "string"
"""How report.json / sweep.json write non-finite floats: as the strings "nan", "inf", "-inf"."""

LOCK_NAME = ".parity.lock"


class WriteError(Exception):
    """A file could not be written (disk full, file-size limit, permissions); the old file is kept."""


class OutDirBusy(Exception):
    """Another live process holds the lock on the output directory."""


def _describe(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{exc.strerror} (the disk or quota is full)"
    if exc.errno == errno.EFBIG:
        return f"{exc.strerror} (the file-size limit, ulimit -f, was reached)"
    return exc.strerror or str(exc)


@contextlib.contextmanager
def atomic_target(path: Path):
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically.

    The temporary name keeps ``path``'s suffix (matplotlib picks the format from it).

    Raises:
        WriteError: writing, syncing or renaming failed; ``path`` is untouched and the
            temporary file removed.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; a report is meant to be read
        os.replace(tmp, path)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {_describe(exc)}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; return ``path``.

    Raises:
        WriteError: see :func:`atomic_target`.
    """
    with atomic_target(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    return Path(path)


def json_safe(obj):
    """``obj`` with non-finite floats as strings, numpy scalars and arrays as Python values."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if obj is None or isinstance(obj, str):
        return obj
    return str(obj)


def json_text(obj, indent: int = 2) -> str:
    """``obj`` as strict JSON text (``allow_nan=False``), non-finite floats as strings."""
    return json.dumps(json_safe(obj), indent=indent, allow_nan=False) + "\n"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutDirLock:
    """Exclusive lock on an output directory (``fcntl.flock`` on ``out/.parity.lock``).

    Use as a context manager or call :meth:`release`. The file holds the owner's PID; it is
    removed on release. A lock file whose process died holds no lock and is taken over.

    Raises:
        OutDirBusy: another process holds the lock (the message names its PID).
        WriteError: the lock file cannot be created.
    """

    def __init__(self, out: Path):
        import fcntl

        self.path = Path(out) / LOCK_NAME
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise WriteError(f"cannot create the lock file {self.path}: {_describe(exc)}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode("ascii", "replace").strip()
                os.close(fd)
                who = f"PID {holder}" if holder.isdigit() else "another process"
                alive = "" if not holder.isdigit() or _pid_alive(int(holder)) else " (not visible from here)"
                raise OutDirBusy(f"another run ({who}{alive}) is writing into {out}; wait for it to finish "
                                 "or pass another --out") from None
            try:  # the holder may have removed the file between our open and our lock: retry
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()
