"""Packaging: the library installs with JAX and Flax alone; the PyTorch reference and the harness are extras."""

import ast
import os
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DIST_OF_MODULE = {"jax": "jax", "flax": "flax", "numpy": "numpy", "rich": "rich"}
"""Top-level module -> the distribution that provides it (where the names differ, add them here)."""


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def _third_party_imports(package: str) -> set[str]:
    out = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            out |= {n.split(".")[0] for n in names}
    return out - set(sys.stdlib_module_names) - {package, "__future__"}


def test_core_dependencies_are_what_the_library_imports():
    imported = _third_party_imports("jaxremat")
    assert imported <= set(DIST_OF_MODULE), f"jaxremat imports {sorted(imported - set(DIST_OF_MODULE))}: map them"
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert core == {DIST_OF_MODULE[m] for m in imported}, (core, imported)
    assert "torch" not in core


def test_torch_is_an_extra_with_a_lower_bound_only():
    extras = PYPROJECT["project"]["optional-dependencies"]
    (torch,) = [r for r in extras["torch"] if _name(r) == "torch"]
    assert ">=" in torch and "==" not in torch and "<" not in torch.replace("<=", "")
    for extra in ("parity", "minilm", "dev"):  # each extra builds on the one below it
        assert any(_name(r) == "jaxremat" for r in extras[extra]), extra


def test_library_and_flax_example_run_without_torch():
    # torch made unimportable in a fresh process: the library, its Flax layer and the README's Flax example
    code = ("import sys, runpy; sys.modules['torch'] = None\n"
            "import jaxremat, jaxremat.flax, jaxremat.doctor, jaxremat.estimate\n"
            "runpy.run_path('examples/flax_nnx_remat.py', run_name='__main__')\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-2000:]


def test_readme_stays_short_with_the_set_up_commands_near_the_top():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"
    first_command = next(i for i, line in enumerate(lines) if line.startswith("python3 -m venv"))
    assert first_command < 40
