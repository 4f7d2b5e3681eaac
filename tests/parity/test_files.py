"""parity.report.files: atomic writes that keep the old file on a full disk, strict JSON, the --out lock."""

import errno
import json
import math
import os

import numpy as np
import pytest

from parity.report import files
from parity.report.files import OutDirBusy, OutDirLock, WriteError, atomic_write, json_text


def test_atomic_write_keeps_the_old_file_when_the_disk_is_full(tmp_path, monkeypatch):
    target = tmp_path / "sweep.json"
    target.write_text('{"old": true}')

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full_disk)
    with pytest.raises(WriteError, match=r"cannot write .*sweep.json: No space left on device \(the disk or quota is full\)"):
        atomic_write(target, '{"new": true}')
    assert target.read_text() == '{"old": true}'
    assert os.listdir(tmp_path) == ["sweep.json"]  # no temporary file left behind


def test_atomic_write_replaces_and_is_readable(tmp_path):
    path = atomic_write(tmp_path / "report.md", "text")
    assert path.read_text() == "text" and path.stat().st_mode & 0o044 == 0o044


def test_json_text_is_strict_json_with_nonfinite_floats_as_strings():
    obj = {"loss": math.nan, "g": [math.inf, -math.inf, np.float32(1.5), np.int64(3)], "ok": np.bool_(True)}
    text = json_text(obj)

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    assert json.loads(text, parse_constant=refuse) == {"loss": "nan", "g": ["inf", "-inf", 1.5, 3], "ok": True}


def test_lock_refuses_a_second_holder_with_the_pid_and_is_removed_on_release(tmp_path):
    first = OutDirLock(tmp_path)
    assert (tmp_path / files.LOCK_NAME).read_text().strip() == str(os.getpid())
    with pytest.raises(OutDirBusy, match=rf"another run \(PID {os.getpid()}\) is writing into"):
        OutDirLock(tmp_path)
    first.release()
    assert not (tmp_path / files.LOCK_NAME).exists()
    OutDirLock(tmp_path).release()  # free again


def test_lock_file_of_a_dead_process_is_taken_over(tmp_path):
    (tmp_path / files.LOCK_NAME).write_text("4194304\n")  # above the default pid_max: no such process
    with OutDirLock(tmp_path):
        assert (tmp_path / files.LOCK_NAME).read_text().strip() == str(os.getpid())
