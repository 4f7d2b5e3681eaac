"""The cross-framework tolerances hold under other instruction sets and thread counts, not only this CPU's."""

import os

import numpy as np
import pytest

from parity.checks.compare import compare_bitwise
from parity.inputs.presets import get_preset
from parity.experiments.tolerance_sweep import Setting, default_settings, markdown, rows, run_setting, summary
from parity.experiments.tolerance_worker import loss_and_grads, variant_inputs

TWO_CPUS = len(os.sched_getaffinity(0)) >= 2


def test_setting_env_sets_each_framework_and_names_it():
    s = Setting("SSE4_2", "default", 1, xla_dots="eigen", mkl="COMPATIBLE")
    env = s.env({"XLA_FLAGS": "--xla_dump_to=/x", "PATH": "/bin"})
    assert env["XLA_FLAGS"] == "--xla_cpu_max_isa=SSE4_2 --xla_cpu_experimental_ynn_fusion_type="
    assert (env["ATEN_CPU_CAPABILITY"], env["MKL_CBWR"], env["OMP_NUM_THREADS"]) == ("default", "COMPATIBLE", "1")
    assert env["PATH"] == "/bin"
    assert s.name == "xla=SSE4_2 aten=default t=1 dots=eigen mkl=COMPATIBLE"
    assert "MKL_CBWR" not in Setting().env({"MKL_CBWR": "AVX"})  # an inherited value does not leak in
    for bad in ({"xla_isa": "AVX3"}, {"aten": "neon"}, {"threads": 0}, {"xla_dots": "onednn"}, {"mkl": "AVX"}):
        with pytest.raises(ValueError):
            Setting(**bad)


def test_default_settings_follow_the_cpus_instruction_sets():
    avx2 = {"sse4_2", "avx", "avx2"}
    grid = default_settings(avx2)
    assert {s.xla_isa for s in grid} == {"SSE4_2", "AVX", "AVX2"} and {s.aten for s in grid} == {"default", "avx2"}
    assert len(grid) == 3 * 2 * 2 + 4 and {s.threads for s in grid} == {1, 2}
    assert [s.name for s in grid[-4:]] == [f"xla=AVX2 aten=avx2 t={t} {k}" for k in ("dots=eigen", "mkl=COMPATIBLE")
                                           for t in (1, 2)]
    wide = default_settings(avx2 | {"avx512f"})
    assert {s.xla_isa for s in wide} >= {"AVX512"} and {s.aten for s in wide} >= {"avx512"}


def test_default_settings_take_only_the_instruction_sets_asked_for():
    avx512 = {"sse4_2", "avx", "avx2", "avx512f"}
    only = default_settings(avx512, isas=["AVX512"])
    assert {s.xla_isa for s in only} == {"AVX512"} and len(only) == 3 * 2 + 4
    assert {s.xla_isa for s in default_settings(avx512, isas=["AVX512", "SSE4_2"])} == {"SSE4_2", "AVX512"}
    for bad in (["AVX512"], ["AVX3"], []):
        with pytest.raises(ValueError, match="this CPU runs SSE4_2, AVX, AVX2; give one or more"):
            default_settings({"sse4_2", "avx", "avx2"}, isas=bad)


@pytest.mark.parametrize("setting", [Setting("AVX2", "avx512", 1), Setting("AVX512", "avx2", 1)])
def test_run_setting_refuses_an_instruction_set_this_cpu_lacks(setting, monkeypatch):
    # ATen takes avx512 as given and dies of SIGILL; XLA would silently cap AVX512 at AVX2
    monkeypatch.setattr("subprocess.run", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(ValueError, match="this CPU lacks avx512f"):
        run_setting(setting, "gpt-tiny", {"float32": ["none"]}, flags={"sse4_2", "avx", "avx2"})


def test_sweep_torch_path_is_the_runners_bitwise(run_framework):
    # the sweep's lean PyTorch path computes exactly what the suite's runner does
    cfg, params, tokens, _ = variant_inputs(get_preset("gpt-tiny"), "float32")
    from parity.inputs.train import AdamWConfig

    full = run_framework("torch", cfg, params, tokens, "sqrt", hparams=AdamWConfig(steps=1), timing_repeats=1,
                         with_reverse_loop=False)
    lean = loss_and_grads("torch", cfg, params, tokens, "sqrt")
    assert compare_bitwise({"loss": lean.loss, **lean.grads}, {"loss": full.loss, **full.grads}).equal


@pytest.mark.skipif(not TWO_CPUS, reason="needs 2 CPUs to run 2 threads")
def test_cross_framework_within_tolerance_under_sse_code_on_two_threads():
    """gpt-tiny under SSE4.2 code on 2 threads, in both frameworks, in a fresh process.

    Both settings differ from the tests' own (this CPU's widest code, 1 thread each when the suite runs in
    parallel workers; tests/conftest.py), whose tolerance tests/parity/test_cross_framework.py checks. Each
    setting is seen to take effect: ATen's kernels, the thread count, and no ``ymm`` register in XLA's code.
    The whole grid (every instruction set by every thread count) is ``python -m parity.experiments.tolerance_sweep``.
    """
    cpus = sorted(os.sched_getaffinity(0))[:2]
    result = run_setting(Setting("SSE4_2", "default", 2), "gpt-tiny", {"float32": ["none"]}, eager=False,
                         timeout_s=300, cpus=cpus)
    setting = result["setting"]
    assert setting["xla_isa"] == "SSE4_2" and setting["threads"] == 2
    assert result["aten_capability"] == "DEFAULT" and result["torch_threads"] == len(result["cpus"]) == 2
    regs = result["xla_vector_registers"]
    if regs is not None:  # None without objdump
        assert regs["ymm"] == 0 < regs["xmm"], regs
    (row,) = rows([result])
    assert np.isfinite(row["grads_err"]) and row["grads_err"] > 0
    assert row["ok"], markdown([result])
    assert {q["quantity"] for q in summary([result])} == {"loss", "grads"}


def _fake_result(setting, model, ok=True):
    row = {"schedule": "none", "loss_err": 0.0, "max_rel_err_grads": 1e-7 if ok else 1e-3, "worst_grad": "w",
           "loss_abs_diff": 0.0, "tolerance_loss": 1e-6, "tolerance": 6e-5, "ok": ok, "jax_digest": "aaaaaa", "torch_digest": "bbbbbb"}
    return {"setting": {"name": setting.name, "threads": setting.threads}, "spec": {"model": model},
            "aten_capability": setting.aten.upper(), "xla_vector_registers": None,
            "variants": [{"variant": "float32", "schedules": [row]}]}


@pytest.mark.skipif(not TWO_CPUS, reason="needs 2 CPUs to pin two 1-thread workers apart")
def test_sweep_cli_resumes_pins_single_thread_jobs_apart_and_fails_on_a_row_over_tolerance(tmp_path, monkeypatch):
    import json

    from parity.experiments import tolerance_sweep

    calls = []

    def fake(setting, model, variants, eager=True, timeout_s=0, cpus=None):
        calls.append((setting.name, model, cpus))
        assert eager == (setting.threads == 1) and variants == tolerance_sweep.RUNS[model]
        return _fake_result(setting, model, ok=setting.name != "xla=AVX2 aten=avx2 t=2")

    monkeypatch.setattr(tolerance_sweep, "run_setting", fake)
    monkeypatch.setattr(tolerance_sweep, "cpu_flags", lambda: {"sse4_2", "avx", "avx2"})
    first = Setting("SSE4_2", "default", 1)
    (tmp_path / "sweep.json").write_text(json.dumps([_fake_result(first, "gpt-small")]))
    rc = tolerance_sweep.main(["--models", "gpt-small", "--out", str(tmp_path), "--resume"])
    assert rc == 1  # one row over its tolerance
    names = [c[0] for c in calls]
    assert first.name not in names and len(names) == len(default_settings({"sse4_2", "avx", "avx2"})) - 1
    cpus = os.sched_getaffinity(0)
    single = [c for c in calls if c[0].split(" t=")[1].startswith("1")]
    assert all(c[2] is not None and len(c[2]) == 1 and set(c[2]) <= cpus for c in single)
    assert all(c[2] is None for c in calls if c not in single)
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert len(saved) == len(names) + 1 and "| gpt-small | float32 | grads |" in (tmp_path / "sweep.md").read_text()
