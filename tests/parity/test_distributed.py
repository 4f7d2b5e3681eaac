"""The distributed suite's JAX half: a 2-device mesh in a worker process, and the one-line mesh errors.

The worker runs gpt-small on ``fsdp=2`` (two forced CPU host devices) with ``none`` and ``full``:
the plan is bitwise against ``none`` on the mesh, and ``none`` holds the single-device reference
(the mean of the per-shard gradients) within its stated bound. ``full`` on a fully sharded mesh is
the case that needs the residual stream pinned at block boundaries (``carry_sharding``): left to
XLA's sharding propagation it is 1.47e9 ULP from ``none`` (docs/sharding.md;
``python -m parity.distributed.explain --mesh fsdp=2 --no-carry-sharding``). With
``--processes 2`` the worker also runs the mesh spread over two processes (``jax.distributed`` over
127.0.0.1, gloo CPU collectives, one device each): both plans bitwise against ``none`` there and
against the one-process mesh (an all-reduce of two operands sums alike in either order). One worker
run serves every test (module-scope fixture).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxremat import sharding as shd
from jaxremat.models import TransformerConfig
from parity.checks.compare import EPS
from parity.cli.run import main
from parity.distributed.jax_checks import REFERENCE_EPS
from parity.distributed import jax_worker
from parity.distributed.jax_worker import ROWS_FILE
from parity.distributed.result import grads_file_name

ROOT = Path(__file__).resolve().parents[2]
TINY = TransformerConfig(vocab_size=256, n_layer=4, d_model=32, n_head=2, d_ff=64, max_seq_len=16)


@pytest.fixture(scope="module")
def worker_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("jax-worker")
    cmd = [sys.executable, "-m", "parity.distributed.jax_worker", "--devices", "2", "--model", "gpt-small",
           "--meshes", "fsdp=2", "--schedules", "none,full", "--processes", "2", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((out / ROWS_FILE).read_text())
    assert [m["processes"] for m in data["meshes"]] == [1, 2]
    return out, data["meshes"][0], data["meshes"][1]


def test_worker_plan_bitwise_against_none_on_mesh(worker_rows):
    _, mesh, _ = worker_rows
    rows = {r["plan"]: r for r in mesh["rows"]}
    assert mesh["mesh"] == "fsdp=2" and mesh["layout"] == "fully_sharded"
    assert list(rows) == ["none", "full"]
    for r in rows.values():
        assert r["status"] == "pass", r
        assert r["grads_bitwise"] is True and r["weights_bitwise"] is True and r["max_ulp"] == 0
        assert r["exception"] is None and r["devices"] == 2
    # remat saves per-device activation memory on the mesh; every parameter is split in two (fully sharded)
    none_mem, plan_mem = rows["none"]["memory"], rows["full"]["memory"]
    assert plan_mem["activation_bytes"] < 0.5 * none_mem["activation_bytes"]
    assert none_mem["params_bytes"] == none_mem["predicted"]["params_bytes"]
    assert none_mem["opt_state_bytes"] >= 2 * none_mem["params_bytes"]


def test_worker_single_vs_multi_reference(worker_rows):
    out, mesh, _ = worker_rows
    none = mesh["rows"][0]
    assert none["reference_ok"] is True
    assert none["reference_err"] <= REFERENCE_EPS * EPS["float32"]
    # the full-batch single-device gradient is the wrong reference: it is measured, and further off
    assert mesh["full_batch_err"] > 0
    assert (out / grads_file_name("jax", "fsdp=2")).is_file() and none["grads_file"]


def test_worker_two_processes_bitwise_against_none_and_one_process(worker_rows):
    out, one, two = worker_rows
    assert two["mesh"] == "fsdp=2" and two["layout"] == "fully_sharded"
    rows = {r["plan"]: r for r in two["rows"]}
    assert list(rows) == ["none", "full"]
    for r in rows.values():
        assert r["status"] == "pass" and r["processes"] == 2 and r["devices"] == 2, r
        assert r["grads_bitwise"] is True and r["weights_bitwise"] is True and r["max_ulp"] == 0
        assert r["one_process_bitwise"] is True and r["one_process_max_ulp"] == 0
        assert r["one_process_exception"] is None and r["reference_ok"] is True
    # the same per-device compiled memory as in one process: the program is the same
    assert [r["memory"]["activation_bytes"] for r in two["rows"]] == [r["memory"]["activation_bytes"]
                                                                      for r in one["rows"]]
    # the probe, measured in both: two operands, one order
    assert two["probe"]["fsdp"]["orders"] == [[0, 1], [0, 1]] and two["probe"] == one["probe"]
    logs = sorted(p.name for p in (out / jax_worker.processes_dir_name("fsdp=2", 2)).glob("process-*.log"))
    assert logs == ["process-0.log", "process-1.log"]


def test_mesh_does_not_divide_devices():
    with pytest.raises(ValueError, match=r"mesh data=2,model=2 needs 4 devices, which does not divide the 3"):
        shd.make_mesh("data=2,model=2", devices=[object()] * 3)


@pytest.mark.parametrize("spec, what", [("data=1,model=4", "n_head 2"), ("data=4", "batch size 2"),
                                        ("fsdp=3", "batch size 2")])
def test_mesh_does_not_divide_model(spec, what):
    with pytest.raises(ValueError, match=what):
        shd.check_divides(spec, TINY, batch_size=2)


def test_cli_mesh_does_not_divide_exits_2(tmp_path, capsys):
    rc = main(["run", "--suite", "distributed", "--model", "gpt-tiny", "--devices", "4", "--mesh", "data=1,model=4",
               "--out", str(tmp_path / "r"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n_head 2 is not divisible by 4" in err[0]


def test_bad_mesh_spec():
    with pytest.raises(ValueError, match="unknown axis 'pipe'"):
        shd.parse_mesh("pipe=2")
    for odd in ("data=\u00b2", "data=\uff12", "data=+2", "data=2_0"):  # str.isdigit() and int() took these
        with pytest.raises(ValueError, match="integer size in ASCII digits"):
            shd.parse_mesh(odd)
    assert shd.layout_of("data=2,model=2") == "tensor_parallel" and shd.layout_of("fsdp=4") == "fully_sharded"


@pytest.mark.parametrize("extra, what", [
    (["--mesh", "data=2;data=02"], "given twice"), (["--mesh", "data=2;"], "empty entry"),
    (["--devices", "100000"], "at most 256"), (["--schedules", "nope"], "unknown schedule 'nope'"),
    (["--schedules", "full,full+save_nothing"], "'full+save_nothing' is 'full' listed twice"),
    (["--devices", "3"], "3 meshes data=2 (2 devices), fsdp=4 (4 devices) and data=2,model=2 (4 devices) do not "
                         "divide --devices 3; pass --devices 4 (fits every mesh) or a --mesh whose mesh sizes divide 3"),
    (["--devices", "4", "--mesh", "data=2;data=2,model=4"], "mesh data=2,model=4 (8 devices) does not divide "
                                                            "--devices 4; pass --devices 8"),
    # a mesh that does not divide the batch is told so, not sent to a --devices that would fail on the batch
    (["--mesh", "fsdp=3"], "mesh fsdp=3: batch size 4 is not divisible by 3"),
    (["--model", "minilm-l6"], "supports the GPT family presets (gpt-small, gpt-tiny); --model minilm-l6 (arch bert: "
                               "BERT-style post-LayerNorm encoder"),
    (["--processes", "3"], "--processes 3 does not divide mesh data=2's 2 devices (each process takes an equal "
                           "share); pass --processes 2 or another --mesh"),
    (["--processes", "0"], "--processes must be >= 1, got 0"),
    (["--processes", "2", "--frameworks", "torch"], "add jax to --frameworks or drop --processes"),
    (["--seed", "-1"], "--seed must be an integer in [0, 2**32), got -1"),
    (["--seed", "4294967296"], "--seed must be an integer in [0, 2**32), got 4294967296"),
    (["--model", " "], "--model is empty; give a preset"), (["--repeats", "3"], "drop --repeats"),
    (["--mesh", ""], "--mesh '' is empty or has an empty entry"),
    (["--mesh", "data=\u00b2"], "integer size in ASCII digits"),
])
def test_cli_bad_distributed_options_exit_2_before_any_work(extra, what, tmp_path, capsys):
    rc = main(["run", "--suite", "distributed", *extra, "--out", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and what in err[0] and not (tmp_path / "r").exists()


@pytest.mark.parametrize("extra, what", [
    (["--schedules", "nope"], "--schedules: unknown schedule 'nope'"), (["--schedules", ""], "--schedules is empty"),
    (["--schedules", "none,,full"], "empty item in the list 'none,,full'"), (["--schedules", "plan(3,5)"], "n_layer=4"),
    (["--model", "minilm-l6"], "is not supported there; pass --model gpt-small"),
    (["--devices", "0"], "--devices must be >= 1"), (["--processes", "0"], "--processes must be >= 1"),
    (["--devices", "100000"], "at most 256"), (["--seed", "-1"], "--seed must be an integer in [0, 2**32)"),
])
def test_worker_bad_input_is_one_line_before_jax(extra, what, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    rc = jax_worker.main(["--model", "gpt-tiny", *extra, "--out", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and what in err[0], err
    assert not (tmp_path / "w").exists() and jax_worker.os.environ["XLA_FLAGS"] == ""  # nothing made, JAX untouched


@pytest.mark.parametrize("where, what", [("file", "exists and is not a directory; pass another --out"),
                                         ("file/sub", "cannot write to output directory"), ("  ", "--out is empty")])
def test_worker_bad_out_is_one_line_before_jax(where, what, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("mine")
    monkeypatch.setenv("XLA_FLAGS", "")
    rc = jax_worker.main(["--model", "gpt-tiny", "--out", str(tmp_path / where) if where.strip() else where])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and what in err[0], err
    assert (tmp_path / "file").read_text() == "mine" and jax_worker.os.environ["XLA_FLAGS"] == ""


@pytest.mark.parametrize("meshes, what", [("", "--meshes '' is empty or has an empty entry"),
                                          ("data=2;", "has an empty entry"),
                                          ("data=2;data=02", "--meshes: mesh data=2 is given twice")])
def test_worker_bad_meshes_are_one_line_before_any_mesh_runs(meshes, what, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    rc = jax_worker.main(["--model", "gpt-tiny", "--schedules", "none", "--meshes", meshes, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and what in err[0], err
    assert not (tmp_path / ROWS_FILE).exists()


@pytest.mark.parametrize("argv", [["--devices", "x"], ["--seed", "1_0"], []])
def test_worker_argparse_errors_are_one_line(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        jax_worker.main(argv + ([] if not argv else ["--out", str(tmp_path)]))
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "see python -m parity.distributed.jax_worker --help" in err[0], err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])  # SIGTERM ends the suite as SIGKILL does
def test_stopped_suite_leaves_no_worker_behind(sig, tmp_path):
    # the JAX worker dies with the suite (PR_SET_PDEATHSIG), and Ctrl-C is one line, exit 130, no traceback
    # (psutil comes with flax, through orbax-checkpoint)
    psutil = pytest.importorskip("psutil")
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "parity", "run", "--suite", "distributed", "--model", "gpt-tiny", "--mesh", "data=2",
           "--schedules", "none,full,sqrt", "--frameworks", "jax", "--no-progress", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, workers = time.monotonic() + 120, []
        while time.monotonic() < deadline and proc.poll() is None and not workers:
            workers = [c for c in psutil.Process(proc.pid).children() if "parity.distributed.jax_worker" in c.cmdline()]
            time.sleep(0.1)
        assert workers and proc.poll() is None, "the suite ended before its worker started"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        gone, alive = psutil.wait_procs(workers, timeout=10)  # left alone, the worker would run for 20 s or more
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not alive, [p.cmdline() for p in alive]
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "Traceback" not in err, err
        lines = err.strip().splitlines()  # the last message, folded to the terminal's width
        last = " ".join(lines[max(i for i, x in enumerate(lines) if x.startswith("interrupted: ")):])
        assert last.startswith("interrupted: no report was written") and f"{out}/distributed" in last, err
        assert not (out / ".parity.lock").exists()


def test_previous_report_keeps_its_gradient_files(tmp_path, capsys, monkeypatch):
    # the next run rewrites distributed/: the files the previous report.json names move with it to previous/
    from parity.cli import distributed as cli_distributed
    from parity.distributed.launch import WorkerError

    out = tmp_path / "r"
    (out / "distributed").mkdir(parents=True)
    (out / "report.json").write_text("{}")
    (out / "distributed" / grads_file_name("jax", "data=2")).write_text("old gradients")

    def fail(*args, **kwargs):
        raise WorkerError("stopped here")

    monkeypatch.setattr(cli_distributed, "run_distributed", fail)
    rc = main(["run", "--suite", "distributed", "--model", "gpt-tiny", "--mesh", "data=2", "--frameworks", "jax",
               "--out", str(out), "--no-progress"])
    assert rc == 1 and not (out / "distributed").exists()
    (kept,) = (out / "previous").iterdir()
    assert (kept / "distributed" / grads_file_name("jax", "data=2")).read_text() == "old gradients"
    assert (kept / "report.json").read_text() == "{}"


def test_overwrite_replaces_the_previous_distributed_files(tmp_path, monkeypatch):
    # --overwrite: no file of the previous run stays beside the new run's (a stale mesh folder would look current)
    from parity.cli import distributed as cli_distributed
    from parity.distributed.launch import WorkerError

    from parity.report.suite_report import SUITE_MARKER

    out = tmp_path / "r"
    (out / "distributed" / "jax_fsdp-4_processes-2").mkdir(parents=True)
    (out / "distributed" / SUITE_MARKER).write_text("")
    (out / "report.json").write_text("{}")

    def fail(*args, **kwargs):
        assert not (out / "distributed").exists()
        raise WorkerError("stopped here")

    monkeypatch.setattr(cli_distributed, "run_distributed", fail)
    rc = main(["run", "--suite", "distributed", "--model", "gpt-tiny", "--mesh", "data=2", "--frameworks", "jax",
               "--out", str(out), "--no-progress", "--overwrite"])
    assert rc == 1 and not (out / "previous").exists()
    assert not (out / "report.json").exists()  # it pointed into the removed folder


@pytest.mark.parametrize("kind", ["folder", "file", "link"])
def test_overwrite_leaves_a_distributed_folder_it_did_not_write(tmp_path, capsys, kind):
    # --overwrite removes only the folder the suite wrote (its marker file); anything else by that name is
    # the user's: one line, exit 2, nothing removed
    out = tmp_path / "r"
    out.mkdir()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    target = out / "distributed"
    if kind == "folder":
        target.mkdir()
        (target / "notes.txt").write_text("keep me")
    elif kind == "file":
        target.write_text("keep me")
    else:
        target.symlink_to(mine, target_is_directory=True)
    (out / "report.json").write_text("{}")
    rc = main(["run", "--suite", "distributed", "--model", "gpt-tiny", "--mesh", "data=2", "--frameworks", "jax",
               "--out", str(out), "--no-progress", "--overwrite"])
    err = capsys.readouterr().err
    assert rc == 2 and "is not a folder this suite wrote" in err and "Traceback" not in err
    assert (out / "report.json").read_text() == "{}" and (mine / "notes.txt").read_text() == "keep me"
    assert target.is_symlink() if kind == "link" else target.exists()


def test_cross_row_without_a_jax_peer_renders():
    from parity.checks.compare import cross_row
    from parity.report.suite_report import cross_row as cross_cells
    from parity.runners.result import RunResult

    torch_run = RunResult(loss=np.float32(1.0), grads={"w": np.ones(2, np.float32)}, trained=None, mode="eager")
    row = cross_row("none", "float32", None, torch_run, 1.0, failure="no JAX mesh ran none",
                    variant="jax - vs torch ddp=2", jax_mesh=None, torch_mesh="ddp=2")
    assert row["error"] == "no JAX mesh ran none" and row["jax_mesh"] is None
    cells = cross_cells(row)
    assert cells[-1] == "NO" and cells[2] == "-" and cells[1] == "jax - vs torch ddp=2: none"


def test_activation_all_reduces_sorts_matmuls_by_pass():
    from parity.distributed.jax_mesh import activation_all_reduces

    def op(shape, kind, name):
        return f'  %x = f32[{shape}]{{2,1,0}} {kind}(%y), channel_id=1, metadata={{op_name="jit(f)/{name}" stack_frame_id=1}}'

    hlo = "\n".join([
        op("4,64,64", "all-reduce", "jvp()/while/body/closed_call/cond/branch_0_fun/dot_general"),
        op("4,64,64", "all-reduce", "transpose(jvp())/while/body/closed_call/cond/branch_0_fun/jvp()/dot_general"),
        op("4,64,64", "all-reduce", "transpose(jvp())/while/body/closed_call/transpose(jvp())/dot_general"),
        op("4,64,64", "all-gather", "jvp()/while/body/closed_call/dot_general"),    # not an all-reduce
        op("4,64,32", "all-reduce", "jvp()/while/body/closed_call/dot_general"),    # another shape
        op("4,64,64", "all-reduce", "jvp()/while/body/closed_call/add"),            # not a matmul
    ])
    assert activation_all_reduces(hlo, (4, 64, 64)) == {"forward": 1, "recompute": 1, "gradient": 1}


def test_torch_half_gets_the_seed_and_hparams_of_the_run(tmp_path, monkeypatch):
    # --seed 7 must reach the PyTorch ranks too: with seed 0 there, the cross-framework rows compared other weights
    from parity.distributed import launch, suite
    from parity.inputs.presets import get_preset
    from parity.inputs.train import AdamWConfig

    seen = {}

    def run_torch_distributed(name, world, plans, out, **kwargs):
        seen.update(kwargs)
        return []

    monkeypatch.setattr(launch, "run_torch_distributed", run_torch_distributed)
    hparams = AdamWConfig(steps=2)
    suite.run_distributed(get_preset("gpt-tiny"), tmp_path, meshes=("data=2",), plans=("none",), frameworks=("torch",),
                          seed=7, hparams=hparams)
    assert seen == {"seed": 7, "hparams": hparams}


def test_grads_file_names_keep_axis_and_size_apart():
    assert grads_file_name("torch", "fsdp2=2") == "torch_fsdp2-2_none_grads.safetensors"
    assert grads_file_name("jax", "data=2,model=2") == "jax_data-2_model-2_none_grads.safetensors"
