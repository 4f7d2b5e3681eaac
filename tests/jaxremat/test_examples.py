"""The README's JAX examples (and those of docs/usage.md and docs/real-sizes.md) run as printed.

The examples that need no process of their own run one after another in one fresh Python process
(``examples_run``): each in its own namespace as ``__main__``, with its own captured stdout and
stderr, so that JAX and Flax are imported once, not once per example. The sharding example sets
XLA_FLAGS before JAX starts, so it keeps a process of its own.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The docs print what XLA:CPU of jax 0.10 gives (the README's install); another backend or JAX compiles to
# other sizes, so there the examples are checked for their shape only (jax 0.12.0.1: another budget plan, the
# 24-layer estimates 4-14% lower; docs/usage.md "JAX versions").
PRINTED_HERE = jax.default_backend() == "cpu" and jax.__version_info__ < (0, 11)


RUN_EXAMPLES = textwrap.dedent("""
    import contextlib, io, json, sys, traceback
    examples = json.loads(open(sys.argv[1]).read())
    results = {}
    for name, (filename, code) in examples.items():  # as `python -c code` or `python file` runs it
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                exec(compile(code, filename, "exec"), {"__name__": "__main__"})
                returncode = 0
            except BaseException:
                traceback.print_exc()
                returncode = 1
        results[name] = {"returncode": returncode, "stdout": out.getvalue(), "stderr": err.getvalue()}
    open(sys.argv[2], "w").write(json.dumps(results))
""")


def readme_block(heading: str, doc: str = "README.md") -> str:
    """The first ```python block under ``## heading`` in README.md (or ``doc``, a path under the repository)."""
    text = (ROOT / doc).read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def survival_check_code() -> str:
    section = (ROOT / "docs" / "usage.md").read_text().split("## JAX: `remat_scan`\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    return next(b for b in blocks if "survival_check" in b)


def doctor_doc() -> tuple[str, str]:
    """(code, printed output) of docs/doctor.md's example."""
    section = (ROOT / "docs" / "doctor.md").read_text().split("## Check your own step: the remat doctor\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```\n.*?```\n(.*?)```", section, re.S).groups()


@pytest.fixture(scope="module")
def examples_run(tmp_path_factory):
    """name -> (returncode, stdout, stderr) of each example, run in one fresh process (module docstring).

    The doctor's example runs as ``python examples/doctor_flax.py`` (its output names the file), the
    others as ``python -c code``."""
    examples = {
        "flax": ("<string>", readme_block("Use it in your own Flax model")),
        "survival": ("<string>", survival_check_code()),
        "budget": ("<string>", readme_block("Fit a memory budget")),
        "expert": ("<string>", (ROOT / "examples" / "plan_flax_budget_expert.py").read_text()),
        "estimate": ("<string>", readme_block("In your own JAX code", "docs/real-sizes.md")),
        "doctor": ("examples/doctor_flax.py", (ROOT / "examples" / "doctor_flax.py").read_text()),  # it names its file
    }
    folder = tmp_path_factory.mktemp("examples")
    (folder / "examples.json").write_text(json.dumps(examples))
    proc = subprocess.run([sys.executable, "-c", RUN_EXAMPLES, str(folder / "examples.json"), str(folder / "out.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    return {k: SimpleNamespace(**v) for k, v in json.loads((folder / "out.json").read_text()).items()}


def test_readme_flax_example_is_the_example_file_and_prints_true(examples_run):
    code = readme_block("Use it in your own Flax model")
    assert code == (ROOT / "examples" / "flax_nnx_remat.py").read_text()
    out = examples_run["flax"]
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True", out.stdout + out.stderr


def test_usage_survival_check_example_prints_true_true_none(examples_run):
    out = examples_run["survival"]
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "None"], out.stdout + out.stderr


def _printed_after(code: str) -> str:
    """The ``prints`` block that follows ``code`` in README.md."""
    return (ROOT / "README.md").read_text().split(code, 1)[1].split("```\n", 3)[2]


def test_readme_budget_example_fits_the_stack_in_one_call_as_printed(examples_run):
    code = readme_block("Fit a memory budget")
    assert code == (ROOT / "examples" / "plan_flax_budget.py").read_text() and len(code.splitlines()) <= 10
    out = examples_run["budget"]
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert words[0].startswith("plan(") and words[1:] == ["True", "True"], out.stdout + out.stderr
    if PRINTED_HERE:  # the README prints XLA:CPU's plan
        assert _printed_after(code) == out.stdout, "README's printed output is stale"


def test_expert_budget_example_in_docs_prints_its_plan_and_true_true_true(examples_run):
    code = (ROOT / "examples" / "plan_flax_budget_expert.py").read_text()
    assert code in (ROOT / "docs" / "planner.md").read_text()
    out = examples_run["expert"]
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0].startswith("plan(") and lines[1:] == ["True", "True", "True"], out.stdout + out.stderr


def test_usage_sharding_example_prints_sharded_gradients_and_true():
    code = readme_block("Past one device", "docs/usage.md")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(env, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "P(None, 'fsdp') True", out.stdout + out.stderr


def test_estimate_example_is_the_example_file_and_prints_four_plans_in_order_of_peak(examples_run):
    code = readme_block("In your own JAX code", "docs/real-sizes.md")
    assert code == (ROOT / "examples" / "estimate_24_layers.py").read_text() and len(code.splitlines()) <= 15
    out = examples_run["estimate"]
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert [r[0] for r in rows] == ["none", "every_k(2)", "sqrt", "full"], out.stdout
    peak = {r[0]: float(r[2]) for r in rows}
    assert peak["none"] > peak["sqrt"] > peak["every_k(2)"] > peak["full"] > 12.0  # 12 GiB: parameters and gradients
    printed = (ROOT / "docs" / "real-sizes.md").read_text().split(code, 1)[1].split("```\n", 3)[2]
    if PRINTED_HERE:  # the page prints XLA:CPU's figures
        assert printed == out.stdout, "docs/real-sizes.md's printed output is stale"


@pytest.mark.skipif(jax.config.jax_remat3, reason="jaxremat.doctor refuses jax_remat3 (test_doctor_parts.py checks "
                    "its one-line error): it reads the regions of JAX's default jax.checkpoint")
def test_doctor_example_is_the_example_file_and_prints_what_the_doc_shows(examples_run):
    code, printed = doctor_doc()
    assert code == (ROOT / "examples" / "doctor_flax.py").read_text()
    out = examples_run["doctor"]
    assert out.returncode == 0, out.stderr
    assert out.stdout == printed and printed.startswith("policy-name-missing: ") and "'mlp_in'" in printed
