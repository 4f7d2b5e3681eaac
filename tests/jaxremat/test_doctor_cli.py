"""``python -m jaxremat.doctor FILE:FUNCTION``: exit 0 / 1 / 2, one line per problem, one line per bad input."""

import os
import pathlib
import subprocess
import sys

import jax
import pytest

from jaxremat.doctor.__main__ import main

# jaxremat.doctor refuses jax_remat3 (test_doctor_parts.py checks its one-line error)
pytestmark = pytest.mark.skipif(jax.config.jax_remat3, reason="jaxremat.doctor refuses jax_remat3: its jax.checkpoint "
                                "is another primitive, whose regions the doctor cannot see")

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = "tests/jaxremat/doctor_corpus"


def test_cli_policy_naming_a_missing_tag_exits_1_with_its_line():
    out = subprocess.run([sys.executable, "-m", "jaxremat.doctor", f"{CORPUS}/jax_scan.py:name_missing"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 1, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("policy-name-missing: ")]
    assert len(lines) == 1 and "'mlpwi'" in lines[0] and f"{CORPUS}/jax_scan.py:39" in lines[0], out.stdout
    assert "remat doctor: value_and_grad(loss): 1 remat region(s), 1 problem" in out.stdout


def test_cli_correct_step_exits_0_and_problems_only_prints_nothing(capsys):
    assert main([f"{ROOT / CORPUS}/jax_scan.py:correct_dots", "--no-compile", "--problems-only"]) == 0
    assert capsys.readouterr().out == ""


def test_cli_problems_only_prints_one_line_per_problem(capsys):
    assert main([f"{ROOT / CORPUS}/jax_scan.py:train_step_name_missing", "--no-compile", "--problems-only"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("policy-name-missing: region #1 (save_only_these_names('mlp_hidden')) in scan(4) at ")


BAD_FILES = {
    "raises.py": "raise ImportError('no such package')\n",
    "steps.py": ("import jax.numpy as jnp\n"
                 "def not_a_pair():\n    return 3\n"
                 "def fails():\n    raise ValueError('bad config')\n"
                 "def wrong_shape():\n    return (lambda w, x: (x @ w).sum()), (jnp.ones((3, 4)), jnp.ones((2, 5)))\n"),
}


@pytest.mark.parametrize("target, argv, wanted", [
    ("steps.py:not_a_pair", ["--argnums", "x"], "--argnums must be comma-separated integers"),
    ("nowhere.py:f", [], "no such file: "),
    ("steps.py", [], "give the target as FILE.py:FUNCTION"),
    ("raises.py:f", [], "importing "),
    ("steps.py:missing", [], "has no function 'missing'"),
    ("steps.py:not_a_pair", [], "not_a_pair() must return (fn, args)"),
    ("steps.py:fails", [], "fails() failed: ValueError: bad config"),
    ("steps.py:wrong_shape", [], "tracing "),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, target, argv, wanted):
    for name, text in BAD_FILES.items():
        (tmp_path / name).write_text(text)
    code = main([str(tmp_path / target), *argv])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err.startswith("error: python -m jaxremat.doctor: ") and out.err.count("\n") == 1
    assert wanted in out.err, out.err
