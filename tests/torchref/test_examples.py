"""The README's PyTorch examples (examples/torch_remat.py, examples/plan_torch_budget.py) run as printed."""

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


def test_readme_torch_example_is_the_example_file_and_prints_true():
    code = readme_block("Use it in your own PyTorch model")
    assert code == (ROOT / "examples" / "torch_remat.py").read_text()
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True", out.stdout + out.stderr


def test_readme_torch_budget_example_fits_the_blocks_in_one_call_as_printed():
    text = (ROOT / "README.md").read_text()
    code = (ROOT / "examples" / "plan_torch_budget.py").read_text()
    assert f"```python\n{code}```" in text and len(code.splitlines()) <= 10
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert words[0].startswith("plan(") and words[1:] == ["True", "True"], out.stdout + out.stderr
    assert text.split(code, 1)[1].split("```\n", 3)[2] == out.stdout, "README's printed output is stale"
