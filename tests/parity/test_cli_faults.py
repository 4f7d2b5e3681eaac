"""The command lines under faults: a full disk (``ulimit -f``) and Ctrl-C, once and twice.

A full disk gives one line and exit 2 with the last good file kept whole; Ctrl-C keeps every
finished measurement in a valid file and exits 130, with no traceback, also when pressed again."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

TINY_SWEEP = ["sweep", "--depths", "1,2", "--schedules", "full", "--frameworks", "torch", "--frontier-depth", "0",
              "--repeats", "1"]


def _no_debris(folder):
    assert not [p for p in os.listdir(folder) if ".tmp" in p], os.listdir(folder)


@pytest.mark.parametrize("argv, name, limit_kib", [
    (["run", "--model", "gpt-tiny", "--schedules", "full", "--frameworks", "torch", "--repeats", "1", "--no-progress"],
     "report.json", 1),
    (TINY_SWEEP, "sweep.json", 24),
])
def test_full_disk_is_one_line_and_keeps_the_last_good_file(tmp_path, argv, name, limit_kib):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text('{"mine": 1}')
    cmd = " ".join([sys.executable, "-m", "parity", *[f"'{a}'" for a in argv], "--overwrite", "--out", str(out)])
    proc = subprocess.run(["bash", "-c", f"ulimit -f {limit_kib}; {cmd}"], capture_output=True, text=True, timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert err[-1].startswith("error: cannot write ") and "File too large" in err[-1], proc.stderr
    assert (out / name).read_text() == '{"mine": 1}' or json.loads((out / name).read_text())["complete"] is False
    _no_debris(out)


def test_ctrl_c_in_sweep_keeps_the_finished_cases(tmp_path):
    out = tmp_path / "out"
    argv = [*TINY_SWEEP, "--depths", "1,2,3,4,5,6,7,8"]
    proc = subprocess.Popen([sys.executable, "-m", "parity", *argv, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if "N=2" in line:  # a few cases have finished
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(seen) + rest
    assert "Traceback" not in rest and "interrupted" in rest
    partial = json.loads((out / "sweep.json").read_text())
    assert partial["complete"] is False and len(partial["cases"]) >= 3
    assert [(c["n_layer"], c["plan"]) for c in partial["cases"][:3]] == [(1, "none"), (1, "full"), (2, "none")]
    assert all(c["saved_bytes"] > 0 for c in partial["cases"])
    _no_debris(out)


SECOND_CTRL_C = textwrap.dedent("""
    import os, signal, sys, time
    import rich.console
    from parity.cli import run as cli

    def interrupted_run(*args, **kwargs):  # the first Ctrl-C arrives while the suite runs
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
        raise SystemExit("the first Ctrl-C was not delivered")

    real_print = rich.console.Console.print

    def print_then_press_again(self, *args, **kwargs):  # the second arrives while the first is handled
        real_print(self, *args, **kwargs)
        if any("interrupted" in str(a) for a in args):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)

    cli.run_suite = interrupted_run
    rich.console.Console.print = print_then_press_again
    sys.exit(cli.main(["run", "--model", "gpt-tiny", "--frameworks", "torch", "--no-progress", "--out", sys.argv[1]]))
""")


def test_second_ctrl_c_in_run_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SECOND_CTRL_C, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
    assert "interrupted before any case finished" in proc.stderr
    assert not (tmp_path / "out" / ".parity.lock").exists()


LATE_CTRL_C = textwrap.dedent("""
    import os, signal, sys, time
    import parity.cli.checks as cc

    real_print_tables = cc.print_tables

    def print_then_press(*args, **kwargs):  # Ctrl-C after the suite's work, while the command prints and writes
        real_print_tables(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
        raise SystemExit("the Ctrl-C was not delivered")

    cc.print_tables = print_then_press
    from parity.cli.run import main
    sys.exit(main(["run", "--model", "gpt-tiny", "--schedules", "full", "--frameworks", "torch", "--repeats", "1",
                   "--no-progress", "--out", sys.argv[1]]))
""")


def test_ctrl_c_while_the_command_prints_and_writes_exits_cleanly_and_says_what_was_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text('{"mine": 1}')
    proc = subprocess.run([sys.executable, "-c", LATE_CTRL_C, str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr
    err = " ".join(proc.stderr.split())
    assert f"interrupted: {out} holds the files written before Ctrl-C" in err, err
    assert err.index("interrupted:") < err.index("previous report kept in"), err  # the notice comes last
    assert json.loads(next((out / "previous").glob("*/report.json")).read_text()) == {"mine": 1}
    assert not (out / ".parity.lock").exists()
    _no_debris(out)
