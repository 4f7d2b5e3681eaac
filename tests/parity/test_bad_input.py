"""Bad input: NaN/inf weights are failed cases (never equal) in a report that stays standard JSON, bad
tokens are clear errors, an interrupted run leaves a valid report of the finished cases."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxremat.models import TransformerConfig, init_params
from parity.inputs.train import AdamWConfig
from parity.cases import suite as suite_mod
from parity.cli.run import main
from parity.inputs.presets import get_preset
from parity.report.suite_report import write_report
from parity.cases.suite import SuiteConfig, run_suite
from parity.checks.verdict import report_passed


@pytest.mark.parametrize("bad", [np.nan])  # inf: tests/parity/test_compare.py
def test_nonfinite_weights_give_failed_cases_and_standard_json(monkeypatch, tmp_path, bad):
    real = suite_mod.preset_inputs

    def poisoned(preset, dtype, seed):
        cfg, params, tokens = real(preset, dtype, seed)
        params["h.mlp.c_fc.weight"][0, 0, 0] = bad
        return cfg, params, tokens

    monkeypatch.setattr(suite_mod, "preset_inputs", poisoned)
    report = run_suite(SuiteConfig(name="quick", preset=get_preset("gpt-tiny"), plans=("every_k(2)",),
                                   frameworks=("torch",), timing_repeats=1))
    assert [c["status"] for c in report["cases"]] == ["fail", "fail"]
    for c in report["cases"]:
        assert c["grads_bitwise_equal"] is False and c["mismatched"], c
    assert not report_passed(report)
    # report.json stays standard JSON: NaN losses are written as strings, never as a bare NaN token
    write_report({**report, "complete": True}, tmp_path)

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    written = json.loads((tmp_path / "report.json").read_text(), parse_constant=refuse)
    assert written["nonfinite_encoding"] == "string"
    assert [c["loss"] for c in written["cases"]] == ["nan", "nan"]
    assert (tmp_path / "report.md").read_text().splitlines()[2].startswith("**Verdict: FAIL** - 0 of 2 cases passed, 2 failed")


CFG = TransformerConfig(vocab_size=64, n_layer=2, d_model=16, n_head=2, d_ff=32, max_seq_len=8)


@pytest.mark.parametrize("tokens, message", [
    (np.zeros((2, 10), np.int64), "max_seq_len"),
    (np.full((2, 9), 64, np.int64), r"token ids must lie in \[0, "),
    (np.full((2, 9), -1, np.int64), r"token ids must lie in \[0, "),
    (np.zeros((2, 9), np.float32), "integer"),
])
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_runners_reject_bad_tokens_before_any_work(framework, tokens, message, run_framework):
    params, hp = init_params(CFG), AdamWConfig(steps=1)
    with pytest.raises(ValueError, match=message):
        run_framework(framework, CFG, params, tokens, "full", hparams=hp, timing_repeats=1)


def test_cli_stress_suite_is_float32_only(tmp_path, capsys):
    assert main(["run", "--suite", "stress", "--dtype", "float64", "--out", str(tmp_path)]) == 2
    assert "float32" in capsys.readouterr().err


def test_cli_interrupt_leaves_a_valid_report_of_the_finished_cases(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "parity", "run", "--frameworks", "torch", "--model", "gpt-tiny",
                             "--suite", "full", "--repeats", "3", "--no-progress", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if json.loads((out / "report.json").read_text())["cases"]:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is False and report["cases"]
    assert all(c["status"] in ("pass", "fail", "error") for c in report["cases"])
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]
