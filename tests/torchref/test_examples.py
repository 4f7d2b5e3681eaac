"""The README's "Use it in your own PyTorch model" example is examples/torch_remat.py and runs."""

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
