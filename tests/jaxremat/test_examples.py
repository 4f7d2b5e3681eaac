"""The README's JAX examples run as printed (the Flax one is examples/flax_nnx_remat.py)."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_block(heading: str) -> str:
    """The first ```python block under ``## heading`` in README.md."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_flax_example_is_the_example_file_and_prints_true():
    code = readme_block("Use it in your own Flax model")
    assert code == (ROOT / "examples" / "flax_nnx_remat.py").read_text()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True", out.stdout + out.stderr


def test_readme_survival_check_example_prints_true_true_none():
    section = (ROOT / "README.md").read_text().split("## Using the schedules in your own JAX code\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    code = next(b for b in blocks if "survival_check" in b)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "None"], out.stdout + out.stderr


def test_readme_budget_example_is_the_example_file_and_prints_its_plan_and_true_true_true():
    code = readme_block("Fit a memory budget")
    assert code == (ROOT / "examples" / "plan_flax_budget.py").read_text()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0].startswith("plan(") and lines[1:] == ["True", "True", "True"], out.stdout + out.stderr


def test_readme_sharding_example_prints_sharded_gradients_and_true():
    code = readme_block("Past one device: remat with sharding")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(env, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "P(None, 'fsdp') True", out.stdout + out.stderr


def test_readme_doctor_example_is_the_example_file_and_prints_what_the_readme_shows():
    section = (ROOT / "README.md").read_text().split("## Check your own step: the remat doctor\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    code, printed = re.search(r"```python\n(.*?)```\n.*?```\n(.*?)```", section, re.S).groups()
    assert code == (ROOT / "examples" / "doctor_flax.py").read_text()
    out = subprocess.run([sys.executable, "examples/doctor_flax.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert out.stdout == printed and printed.startswith("policy-name-missing: ") and "'mlp_in'" in printed
