"""The public names: every ``__all__`` imports, every quoted name and path resolves, imports stay lazy.

A docstring or a doc that cites ``jaxremat.spec.policies.parse_policy`` or
``tests/torchref/test_render.py`` promises that the name or file exists; when code moves and the
text does not follow, these tests fail with the file and the name. The texts read are the module,
class, function and attribute docstrings of every module of jaxremat, torchref and parity, of
scripts/*.py and examples/*.py (read with ``ast``, nothing is run), README.md and docs/*.md.
Names outside the three packages (``jax.checkpoint``, ``torch.utils.checkpoint``) are out of
scope. Nothing here compiles a program.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("jaxremat", "torchref", "parity")
PATH_ROOTS = ("tests", "docs", "scripts", "examples", "parity", "jaxremat", "torchref")

# A dotted name: jaxremat.x.y, not preceded by a name character, a dot, a slash or a hyphen
# (so ``tests/parity.x`` or ``my_parity.x`` is not taken); it ends at the last identifier.
DOTTED = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(PACKAGES))
# A repository path: tests/..., docs/..., with at least one slash and a plain name after it,
# optionally a pytest node id after it (tests/x/test_y.py::test_z, or test_z_* for all that start so).
PATH = re.compile(r"(?<![\w./-])((?:%s)(?:/[\w.-]*\w)+/?)(?:::(\w+\*?))?" % "|".join(PATH_ROOTS))


def package_modules() -> list[pathlib.Path]:
    """Every module file of the three packages (``__main__`` included: it is only read, never run)."""
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def public_docstrings(path: pathlib.Path) -> list[str]:
    """The docstrings of the module, of its public classes, functions and methods, and of its attributes.

    Public: a name without a leading underscore (``__init__``/``__call__`` included), inside a
    public class. An attribute docstring is a string statement right after an assignment at module
    or class level (``SCHEMA_VERSION = 3`` and a string on the next line).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = [ast.get_docstring(tree, clean=False) or ""]

    def walk(body: list[ast.stmt]) -> None:
        for prev, node in zip([None, *body], body):
            if isinstance(prev, (ast.Assign, ast.AnnAssign)) and isinstance(node, ast.Expr) and isinstance(
                    getattr(node, "value", None), ast.Constant) and isinstance(node.value.value, str):
                docs.append(node.value.value)  # an attribute docstring: the string after an assignment
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_") and not (node.name.startswith("__") and node.name.endswith("__")):
                continue
            docs.append(ast.get_docstring(node, clean=False) or "")
            if isinstance(node, ast.ClassDef):
                walk(node.body)

    walk(tree.body)
    return [d for d in docs if d]


def texts() -> list[tuple[str, str]]:
    """(where, text) for every text that may cite a name: public docstrings, README.md, docs/*.md."""
    out = []
    scripts = sorted((ROOT / "scripts").glob("*.py")) + sorted((ROOT / "examples").glob("*.py"))
    for path in package_modules() + scripts:
        rel = str(path.relative_to(ROOT))
        out += [(rel, doc) for doc in public_docstrings(path)]
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        out.append((str(path.relative_to(ROOT)), path.read_text()))
    return out


def resolve(dotted: str) -> bool:
    """Import the longest module prefix of ``dotted``, then look the rest up as attributes.

    A dataclass field or an annotated class attribute counts as an attribute of its class.
    """
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name is None or not (".".join(parts[:cut]) + ".").startswith(err.name + "."):
                raise  # the module exists but imports something missing: a real error, not a stale name
            continue
        for attr in parts[cut:]:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif is_field(obj, attr):
                return True  # a field without a class-level value: nothing to look further into
            else:
                return False
        return True
    return False


def is_field(obj: object, attr: str) -> bool:
    """Whether ``attr`` is a dataclass field or an annotated attribute of the class ``obj`` (or a base)."""
    if not isinstance(obj, type):
        return False
    if dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
        return True
    return any(attr in vars(base).get("__annotations__", {}) for base in obj.__mro__)


def unresolved_names() -> list[str]:
    found: dict[str, set[str]] = {}
    for where, text in texts():
        for name in DOTTED.findall(text):
            found.setdefault(name, set()).add(where)
    return sorted(f"{w}: {name}" for name, wheres in found.items() if not resolve(name) for w in sorted(wheres))


def top_level_names(path: pathlib.Path) -> set[str]:
    """The functions and classes a Python file defines at its top level (a pytest node id names one)."""
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def missing_paths() -> list[str]:
    bad = set()
    for where, text in texts():
        for path, test in PATH.findall(text):
            if not (ROOT / path).exists():
                bad.add(f"{where}: {path}")
            elif test and not any(n == test or (test.endswith("*") and n.startswith(test[:-1]))
                                  for n in top_level_names(ROOT / path)):
                bad.add(f"{where}: {path}::{test}")
    return sorted(bad)


def modules_with_all() -> list[str]:
    """Every module of the three packages whose source assigns ``__all__``."""
    names = []
    for path in package_modules():
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)
               for n in tree.body):
            names.append(module_name(path))
    return names


# Fresh interpreters, started together (each spends seconds importing its framework): which
# frameworks sys.modules holds after each step. A package name alone imports nothing heavy.
PROBES = {
    "jaxremat": "import json, sys\n"
                "def frameworks(): return {m: m in sys.modules for m in ('jax', 'flax', 'torch')}\n"
                "import jaxremat\n"
                "after_import = frameworks()\n"
                "jaxremat.parse_plan, jaxremat.sqrt, jaxremat.POLICIES, jaxremat.RematPolicyWarning\n"
                "after_spec = frameworks()\n"
                "jaxremat.remat_scan\n"
                "print(json.dumps([after_import, after_spec, frameworks()]))\n",
    "torchref": "import json, sys, torchref\n"
                "print(json.dumps({m: m in sys.modules for m in ('jax', 'torch')}))\n",
}


@pytest.fixture(scope="module", autouse=True)
def probes() -> dict[str, subprocess.Popen]:
    """Started before this module's first test, so that they import while the other tests run."""
    procs = {name: subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name, code in PROBES.items()}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dotted_name_pattern_takes_package_names_only():
    text = ("``jaxremat.spec.policies.parse_policy``, :func:`parity.checks.compare.cross_check`. "
            "jax.checkpoint, torch.utils.checkpoint, tests/parity.x, my_parity.y, parity-report/x.md, "
            "python -m parity run, torchref.")
    assert DOTTED.findall(text) == ["jaxremat.spec.policies.parse_policy", "parity.checks.compare.cross_check"]


def test_path_pattern_takes_repository_paths_only():
    text = ("`tests/torchref/test_render.py`, (docs/policies.md#never-silent), parity/cli/. "
            "site-packages/jax/_src/x.py, parity-report/report.json, `tests/<package>/test_<module>.py`, "
            "`tests/parity/test_cli.py::test_run_writes_report`, tests/x.py::test_y_*.")
    assert PATH.findall(text) == [("tests/torchref/test_render.py", ""), ("docs/policies.md", ""),
                                  ("parity/cli/", ""), ("tests/parity/test_cli.py", "test_run_writes_report"),
                                  ("tests/x.py", "test_y_*")]


def test_resolve_finds_modules_attributes_and_fields_and_rejects_stale_names():
    assert resolve("jaxremat.spec.policies.parse_policy")
    assert resolve("jaxremat.spec.schedules.Segment.checkpointed")  # a dataclass field
    assert resolve("parity.checks.compare.cross_check")
    assert not resolve("jaxremat.spec.no_such_name")
    assert not resolve("tests_no_such_package.x")


def test_every_name_in_each_all_imports():
    mods = modules_with_all()
    assert {"jaxremat", "jaxremat.spec", "torchref"} <= set(mods), mods
    bad = []
    for mod_name in mods:
        mod = importlib.import_module(mod_name)
        assert len(set(mod.__all__)) == len(mod.__all__), f"{mod_name}.__all__ lists a name twice"
        bad += [f"{mod_name}.{n}" for n in mod.__all__ if not hasattr(mod, n)]
    assert not bad, "names in __all__ that do not import: " + ", ".join(bad)


def test_from_package_import_star_gives_all():
    for pkg in ("jaxremat", "jaxremat.spec", "torchref"):
        scope: dict = {}
        exec(f"from {pkg} import *", scope)
        assert set(importlib.import_module(pkg).__all__) <= set(scope), pkg


def test_jaxremat_gives_the_library():
    import jaxremat

    wanted = {"remat_scan", "remat_stack", "RematStack", "linen_remat_stack", "linen_init_stack", "to_jax_policy",
              "parse_plan", "parse_schedule", "parse_policy", "POLICIES", "none", "full", "every_k", "sqrt",
              "segments", "nested", "Schedule", "survival_check", "saved_residuals", "compiled_stats",
              "compiled_memory", "check_plan", "RematPolicyWarning", "peak_units"}
    assert wanted <= set(jaxremat.__all__), wanted - set(jaxremat.__all__)
    assert set(jaxremat.__all__) <= set(dir(jaxremat))
    from jaxremat.flax import remat_stack
    from jaxremat.render import remat_scan
    from jaxremat.spec.policies import parse_policy

    assert jaxremat.remat_scan is remat_scan and jaxremat.remat_stack is remat_stack
    assert jaxremat.parse_policy is parse_policy
    import jaxremat.render

    # a submodule is an attribute before anyone imports it (the lazy path, called directly)
    assert jaxremat.__getattr__("render") is jaxremat.render
    assert {"render", "flax", "memory", "spec"} <= set(dir(jaxremat))
    with pytest.raises(AttributeError, match="no attribute 'remat_scann'"):
        jaxremat.remat_scann


def test_torchref_gives_renderer_policies_models_and_memory_tools():
    import torchref

    wanted = {"forward_blocks", "model_loss", "SelectiveCheckpoint", "GPT", "Block", "Encoder", "EncoderBlock",
              "encoder_loss", "SavedActivationRecorder", "peak_step_bytes", "LiveBytesTracker", "step_peak_bytes",
              "block_saved", "reverse_segment_loop", "ForwardState", "StateWriteError", "activation",
              "check_selective"}
    assert wanted <= set(torchref.__all__), wanted - set(torchref.__all__)


def probe_result(proc: subprocess.Popen):
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_import_jaxremat_loads_jax_only_when_a_jax_name_is_used(probes):
    after_import, after_spec, after_remat_scan = probe_result(probes["jaxremat"])
    assert after_import == {"jax": False, "flax": False, "torch": False}
    assert after_spec == {"jax": False, "flax": False, "torch": False}
    assert (after_remat_scan["jax"], after_remat_scan["torch"]) == (True, False)


def test_import_torchref_never_loads_jax(probes):
    assert probe_result(probes["torchref"]) == {"jax": False, "torch": True}


def test_every_dotted_name_in_docstrings_and_docs_resolves():
    bad = unresolved_names()
    assert not bad, "names quoted in docstrings or docs that do not resolve:\n" + "\n".join(bad)


def test_every_repository_path_in_docstrings_and_docs_exists():
    bad = missing_paths()
    assert not bad, "paths quoted in docstrings or docs that do not exist:\n" + "\n".join(bad)


def test_docs_name_the_report_schema_the_suite_writes():
    from parity.cases.suite import SCHEMA_VERSION

    cited = [(where, int(n)) for where, text in texts()
             for n in re.findall(r"report\.json \(?schema:? (\d+)", text)]
    assert cited, "no text names the report.json schema"
    assert [c for c in cited if c[1] != SCHEMA_VERSION] == [], f"the suite writes schema {SCHEMA_VERSION}"
