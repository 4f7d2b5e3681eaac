"""One JAX mesh over several processes: the pieces, and the collective probe over two real processes.

The full runs (a plan over two processes against ``none`` there and against one process) are in
tests/parity/test_distributed.py (the worker fixture's ``--processes 2``). Here: the summation-order
search, the HLO comparison that ignores source metadata and CPU thread partitions, the runs'
files round trip, when the ``collective-summation-order`` exception is granted, the one-line
refusals, and ``python -m parity.distributed.explain --mesh fsdp=4 --processes 2`` (the probe in one
process against two processes: gloo's ring order against device order).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.distributed import jax_multiprocess as jmp
from parity.distributed.jax_checks import REFERENCE_EPS, TRAINED_EPS, one_process_exception
from parity.distributed.jax_mesh import MeshRun, hlo_program
from parity.distributed.jax_worker import check_processes
from parity.distributed.result import DeviceMemory

ROOT = Path(__file__).resolve().parents[2]


def test_with_device_count_replaces_the_old_count():
    flags = "--xla_foo=1 --xla_force_host_platform_device_count=4"
    assert jmp.with_device_count(flags, 2) == "--xla_foo=1 --xla_force_host_platform_device_count=2"
    assert jmp.with_device_count("", 1) == "--xla_force_host_platform_device_count=1"


def test_plan_runs_repeats_none_first():
    assert jmp.plan_runs(["full", "none", "sqrt"]) == ["none", "none", "full", "sqrt"]
    assert jmp.plan_runs(["none"]) == ["none", "none"]


def test_summation_orders_finds_an_order_that_reproduces_each_chunk():
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32) * np.float32([[1], [1e-3], [1e3], [1]])

    def in_order(order, sl):
        acc = x[order[0], sl]
        for q in order[1:]:
            acc = acc + x[q, sl]
        return acc

    seq, ring = in_order([0, 1, 2, 3], slice(None)), in_order([2, 3, 1, 0], slice(None))
    assert seq[32:].tobytes() != ring[32:].tobytes()  # the data tells the two orders apart
    result = np.concatenate([seq[:32], ring[32:]])
    orders = jmp.summation_orders(x, result, 2)
    assert orders[0] == [0, 1, 2, 3]  # the first order tried that reproduces the chunk
    assert orders[1] != [0, 1, 2, 3] and in_order(orders[1], slice(32, 64)).tobytes() == ring[32:].tobytes()
    assert jmp.summation_orders(x, result + np.float32(1), 2) == [None, None]


def test_hlo_program_ignores_source_metadata_and_thread_partitions():
    def hlo(file, parts, fused="multiply_fusion"):
        return "\n".join([
            "HloModule jit_f", "", "FileNames", f'1 "{file}"', "", "StackFrames", "1 1 1 0", "",
            f'  %f = f32[64]{{0}} fusion(%a), kind=kLoop, calls=%{fused}, backend_config={{"outer_dimension_partitions":'
            f'["{parts}"]}}, metadata={{op_name="jit(f)/mul" source_file="{file}" source_line=3}}'])

    assert hlo_program(hlo("/a.py", 4)) == hlo_program(hlo("<frozen runpy>", 2))
    assert "outer_dimension_partitions" not in hlo_program(hlo("/a.py", 4)) and "FileNames" not in hlo_program(hlo("/a.py", 4))
    assert hlo_program(hlo("/a.py", 4, "add_fusion")) != hlo_program(hlo("/a.py", 4))  # another program
    # a partition count on anything but a loop fusion is kept
    other = hlo("/a.py", 4).replace("kind=kLoop", "kind=kInput")
    assert "outer_dimension_partitions" in hlo_program(other)


def _run(grads, hlo="HloModule m\n  %x = f32[2] add(%a, %b)"):
    memory = DeviceMemory(params_bytes=8, grads_bytes=8, opt_state_bytes=16, activation_bytes=4, peak_bytes=40,
                          source="test")
    return MeshRun(np.float32(1.5).reshape(()), {"w": np.asarray(grads, np.float32)},
                   {"w": np.asarray(grads, np.float32) * 2}, memory, hlo)


def test_runs_files_round_trip(tmp_path):
    runs = [("none", _run([1.0, 2.0])), ("none", _run([1.0, 2.0])), ("full", ValueError("no"))]
    jmp.write_runs(tmp_path, runs, {"fsdp": {"bits": "ab", "orders": [[0, 1]], "device_order": 1.0}}, ["cpu:0"])
    back = jmp.load_runs(tmp_path)
    assert [n for n, _ in back["runs"]] == ["none", "none", "full"]
    none = back["runs"][0][1]
    assert none.loss.tobytes() == np.float32(1.5).tobytes() and none.loss.shape == ()
    assert none.grads["w"].tobytes() == np.float32([1, 2]).tobytes() and none.trained["w"][1] == 4.0
    assert none.memory.peak_bytes == 40 and none.hlo.startswith("HloModule m")
    assert back["runs"][2][1] == "ValueError: no" and back["probe"]["fsdp"]["bits"] == "ab"
    (tmp_path / jmp.RUNS_FILE).unlink()
    with pytest.raises(jmp.ProcessesError, match="process 0 did not write its runs"):
        jmp.load_runs(tmp_path)


@pytest.mark.parametrize("hlo_same, probes_differ, grads_eps, trained_eps, loss_eps, granted", [
    (True, True, 1.0, 24.0, 1.0, True), (False, True, 1.0, 24.0, 1.0, False), (True, False, 1.0, 24.0, 1.0, False),
    (True, True, 40.0, 24.0, 1.0, False), (True, True, 1.0, 400.0, 1.0, False), (True, True, 1.0, 24.0, 40.0, False)])
def test_collective_summation_order_needs_every_measurement(hlo_same, probes_differ, grads_eps, trained_eps, loss_eps,
                                                             granted):
    eps = float(np.finfo(np.float32).eps)
    one = _run([1.0, 1.0])
    mine = _run([1.0, 1.0 + grads_eps * eps], hlo=one.hlo if hlo_same else one.hlo.replace("add", "subtract"))
    mine.trained["w"] = np.float32([2.0, 2.0 + 2.0 * trained_eps * eps])  # relative to the largest entry (2)
    mine.loss = np.float32(1.5 + 1.5 * loss_eps * eps).reshape(())
    probe_one = {"fsdp": {"bits": "a"}}
    probe_mine = {"fsdp": {"bits": "b" if probes_differ else "a"}}
    exc, facts = one_process_exception(mine, one, probe_mine, probe_one, "float32")
    assert (exc == "collective-summation-order") is granted and (exc is None) is not granted
    assert facts["same_hlo"] is hlo_same and facts["probes_differ"] is probes_differ
    assert facts["grads_eps"] == pytest.approx(grads_eps, rel=0.1) and facts["trained_eps"] == pytest.approx(trained_eps, rel=0.1)
    assert facts["bound_eps"] == {"loss": REFERENCE_EPS, "grads": REFERENCE_EPS, "trained": TRAINED_EPS}
    assert facts["bound"] == REFERENCE_EPS * eps and facts["max_rel_err"] == pytest.approx(grads_eps * eps, rel=0.1)


def test_collective_summation_order_needs_the_probe_measured_in_both():
    one = _run([1.0, 1.0])
    mine = _run([1.0, 1.0 + float(np.finfo(np.float32).eps)], hlo=one.hlo)
    for probe_mine, probe_one in [({}, {"fsdp": {"bits": "a"}}), ({"fsdp": {"bits": "b"}}, {})]:
        exc, facts = one_process_exception(mine, one, probe_mine, probe_one, "float32")
        assert exc is None and facts["probes_differ"] is False


def test_check_processes_names_the_counts_that_fit():
    check_processes("fsdp=4", 2)
    check_processes("fsdp=4", 1)
    with pytest.raises(ValueError, match=r"--processes 3 does not divide mesh fsdp=4's 4 devices .*pass --processes "
                                         r"2 or 4 or another --mesh"):
        check_processes("fsdp=4", 3)


def test_run_processes_refuses_a_count_that_does_not_split_the_mesh(tmp_path):
    with pytest.raises(ValueError, match="must be >= 2 and divide mesh data=2's 2 devices"):
        jmp.run_processes("gpt-tiny", "data=2", ("none",), 3, tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_a_failing_process_is_named_with_its_last_line(tmp_path):
    # an unknown preset: each process refuses it in one line (exit 2) before JAX starts; the others are stopped
    with pytest.raises(jmp.ProcessesError, match=r"process \d of mesh data=2 exited 2: unknown model "
                                                 r"'nope'; valid models: gpt-small"):
        jmp.run_processes("nope", "data=2", ("none",), 2, tmp_path / "p", timeout_s=120)


def test_probe_over_two_processes_is_a_ring_not_device_order():
    cmd = [sys.executable, "-m", "parity.distributed.explain", "--mesh", "fsdp=4", "--processes", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    one, two = lines[lines.index("one process:") + 1], lines[-2]
    assert "100.0% of elements in device order" in one and one.count("x0+x1+x2+x3") == 4
    # chunk c (the quarter device c keeps) is summed {x[c+2], x[c+3]} first, then x[c+1], then x[c]
    for c, chunk in enumerate(two.split("chunk orders ")[1].split(", ")):
        first, rest = chunk.split("+")[:2], chunk.split("+")[2:]
        assert sorted(first) == sorted([f"x{(c + 2) % 4}", f"x{(c + 3) % 4}"]) and rest == [f"x{(c + 1) % 4}", f"x{c}"]
    assert lines[-1] == "probe bitwise equal: False"


@pytest.mark.parametrize("argv, what", [
    (["--processes", "1", "--process-id", "0", "--local-devices", "2"], "--processes must be >= 2, got 1"),
    (["--processes", "2", "--process-id", "2", "--local-devices", "1"], "--process-id must be in 0..1, got 2"),
    (["--processes", "2", "--process-id", "0", "--local-devices", "0"], "--local-devices must be >= 1, got 0"),
    (["--processes", "2", "--process-id", "0", "--local-devices", "1", "--mesh", "fsdp=4"],
     "--mesh fsdp=4 has 4 devices, not --processes 2 x --local-devices 1"),
    (["--processes", "2", "--process-id", "0", "--local-devices", "1", "--schedules", "none,every_k(0)"], "every_k"),
    (["--processes", "2", "--process-id", "0", "--local-devices", "1", "--model", "nope"], "unknown model 'nope'"),
    (["--processes", "2", "--process-id", "0", "--local-devices", "1", "--model", "minilm-l6"],
     "supports the GPT family presets"),
    (["--processes", "2", "--process-id", "0", "--local-devices", "1", "--coordinator", "foo"],
     "--coordinator 'foo' is not HOST:PORT"),
    (["--processes", "2", "--process-id", "0", "--local-devices", "1", "--seed", "-1"], "--seed must be an integer"),
    (["--processes", "2", "--process-id", "0", "--local-devices", "1", "--out", "/dev/null"],
     "exists and is not a directory"),
])
def test_process_refuses_bad_input_in_one_line_before_joining(argv, what, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")  # process_main sets it: restored after the test
    base = {"--mesh": "data=2", "--schedules": "none", "--model": "gpt-tiny", "--coordinator": "127.0.0.1:1",
            "--out": str(tmp_path)}
    for flag, value in base.items():
        if flag not in argv:
            argv = argv + [flag, value]
    assert jmp.process_main(argv) == 2  # a coordinator at port 1 would hang: the refusal comes first
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and what in err[0], err


def test_process_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        jmp.process_main(["--process-id", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "'x' is not an integer" in err[0], err


@pytest.mark.parametrize("argv, what", [
    (["--model", "minilm-l6"], "supports the GPT family presets"), (["--model", "gpt-tiny", "--batch", "0"],
                                                                     "--batch must be in 1..2"),
    (["--model", "gpt-tiny", "--batch", "3"], "--batch must be in 1..2"),
    (["--model", "gpt-tiny", "--mesh", "data=2", "--processes", "0"], "--processes must be >= 1, got 0"),
    (["--model", "gpt-tiny", "--mesh", ""], "mesh spec '' is empty"),
])
def test_explain_refuses_bad_input_in_one_line(argv, what, capsys):
    from parity.distributed import explain

    assert explain.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and what in err[0], err


def test_torch_worker_has_no_command_line_and_says_what_to_run():
    proc = subprocess.run([sys.executable, "-m", "parity.distributed.torch_worker", "--anything"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "python -m parity run --suite distributed --frameworks torch" in err[0]


def test_report_names_the_one_process_measurements():
    from parity.report.distributed_report import markdown_sections, one_process_line

    facts = {"same_hlo": True, "probes_differ": True, "max_rel_err": 1.5e-7, "bound": 1.9e-6, "loss_eps": 0.72,
             "grads_eps": 1.24, "trained_eps": 26.6, "bound_eps": {"loss": 16.0, "grads": 16.0, "trained": 256.0}}
    section = {"framework": "jax", "mesh": "fsdp=4", "layout": "fully_sharded", "processes": 2, "rows": [],
               "one_process": {"none": facts, "full": facts}}
    line = one_process_line(section)
    assert "`none`, `full`: same HLO yes, probes differ yes, loss 0.7 eps, gradients 1.2 eps, trained weights " \
           "26.6 eps (bounds 16 / 16 / 256 eps)" in line
    assert one_process_line({**section, "processes": 1}) is None and one_process_line({**section, "one_process": {}}) is None
    report = {"distributed": {"devices": 4, "processes": 2, "meshes": [section]}}
    assert line in markdown_sections(report)


def test_distributed_report_markdown_has_no_single_device_case_legend():
    # the legend explains the single-device case table's columns; a distributed report has no such table
    from parity.report.suite_report import markdown

    section = {"framework": "jax", "mesh": "data=2", "layout": "data_parallel", "processes": 1, "rows": []}
    report = {"suite": "distributed", "model": "gpt-tiny", "config": {"n_layer": 2}, "batch_size": 2, "seq_len": 8,
              "hparams": {"steps": 3, "learning_rate": 1e-3}, "seed": 0, "cases": [], "cross_framework": [],
              "distributed": {"devices": 4, "processes": 1, "meshes": [section]}, "complete": True}
    text = markdown(report)
    assert "## Past one device" in text and "jax data=2" in text and "`saved pred`" not in text
    assert "`saved pred`" in markdown({**report, "distributed": None})


def test_trained_bound_is_far_below_one_adamw_step():
    # TRAINED_EPS must catch a wrong step: one AdamW step fewer moves every trained tensor by far more
    import dataclasses

    from jaxremat import sharding as shd
    from jaxremat.spec.plan import parse_plan
    from parity.distributed import jax_mesh as jm
    from parity.inputs.presets import get_preset
    from parity.inputs.pretrained import preset_inputs
    from parity.inputs.train import AdamWConfig

    preset = get_preset("gpt-tiny")
    cfg, params, tokens = preset_inputs(preset, "float32", 0)
    hparams, mesh = preset.hparams or AdamWConfig(), shd.make_mesh("data=1")
    runs = [jm.run_plan(cfg, params, tokens, parse_plan("none"), "data=1", mesh, dataclasses.replace(hparams, steps=s))
            for s in (hparams.steps, hparams.steps - 1)]
    eps = float(np.finfo(np.float32).eps)
    per_tensor = {k: float(np.max(np.abs(runs[0].trained[k] - runs[1].trained[k])) / np.max(np.abs(runs[0].trained[k])))
                  for k in runs[0].trained}
    assert min(per_tensor.values()) > 10 * TRAINED_EPS * eps, per_tensor


def test_a_process_whose_launcher_is_gone_stops_at_once(tmp_path):
    # PARITY_LAUNCHER_PID names a process that is not this one's parent: the launcher died before the prctl
    env = dict(os.environ, PARITY_LAUNCHER_PID="1")
    cmd = [sys.executable, "-m", "parity.distributed.jax_multiprocess", "--process-id", "0", "--processes", "2",
           "--coordinator", "127.0.0.1:1", "--local-devices", "1", "--mesh", "data=2", "--schedules", "none",
           "--model", "gpt-tiny", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 1 and "the launcher (PID 1) is gone" in proc.stderr, proc.stderr[-2000:]
