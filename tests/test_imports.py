"""Import hygiene of the three packages: no cycles, no private names across modules, imports at the top.

Read from the source (``ast``; a package with a lazy module ``__getattr__`` is imported for its
``__all__``): every name imported from the project exists, even in a deferred import of a script; a
module may import another module's public names only; module-level imports between the project's
modules form no cycle; an import inside a function is allowed only when it defers a heavy framework
(JAX, Flax, optax, PyTorch, Hugging Face libraries, matplotlib) or a project module that loads one at
import time, and the module says why in a ``# Deferred imports:`` comment.
"""

from __future__ import annotations

import ast
import importlib
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("jaxremat", "torchref", "parity")
HEAVY = {"jax", "jaxlib", "flax", "optax", "torch", "transformers", "tokenizers", "safetensors", "matplotlib", "plotly", "playwright",
         "psutil"}
PLATFORM = {"fcntl", "msvcrt"}  # platform-specific: imported where used, so other platforms can import the module
MARKER = "# Deferred imports:"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def _modules() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = (path, ast.parse(path.read_text(encoding="utf-8")))
    return out


def _imports(mod: str, path: Path, node) -> list[tuple[str, list[str]]]:
    """``[(module imported, names taken from it)]`` of one import statement, relative imports resolved."""
    if isinstance(node, ast.Import):
        return [(a.name, []) for a in node.names]
    base = node.module or ""
    if node.level:
        pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        pkg = pkg[:len(pkg) - node.level + 1]
        base = ".".join(pkg + ([node.module] if node.module else []))
    return [(base, [a.name for a in node.names])]


def _project(name: str) -> str | None:
    """The project module a dotted name lives in (longest known prefix), or None."""
    mods = _modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _top_level(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):  # e.g. `if TYPE_CHECKING:` / try-import at module level
            yield from (n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))


def _graph() -> dict[str, set[str]]:
    graph = {}
    for mod, (path, tree) in _modules().items():
        deps = set()
        for node in _top_level(tree):
            for base, names in _imports(mod, path, node):
                for target in [base] + [f"{base}.{n}" for n in names]:
                    dep = _project(target)
                    if dep and dep != mod and not mod.startswith(dep + "."):
                        deps.add(dep)
        graph[mod] = deps
    return graph


@lru_cache(maxsize=None)
def _loads_heavy(mod: str) -> bool:
    """Whether importing project module ``mod`` loads a heavy framework (its top-level imports, transitively)."""
    path, tree = _modules()[mod]
    for node in _top_level(tree):
        for base, names in _imports(mod, path, node):
            if base.split(".")[0] in HEAVY:
                return True
            for target in [base] + [f"{base}.{n}" for n in names]:
                dep = _project(target)
                if dep and dep != mod and not mod.startswith(dep + ".") and _loads_heavy(dep):
                    return True
    return False


def test_no_import_cycles():
    graph, cycles = _graph(), []
    state: dict[str, int] = {}

    def visit(u, path):
        state[u] = 1
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                cycles.append(" -> ".join(path[path.index(v):] + [v]))
            elif v not in state:
                visit(v, path + [v])
        state[u] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "module-level import cycles:\n" + "\n".join(cycles)


def test_no_module_imports_another_modules_private_names():
    bad = []
    for mod, (path, tree) in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for base, names in _imports(mod, path, node):
                    if _project(base) and _project(base) != mod:
                        bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {base}.{n}" for n in names
                                if n.startswith("_") and not n.startswith("__")]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_imports_inside_functions_only_defer_heavy_frameworks_and_say_so():
    bad, unmarked = [], []
    for mod, (path, tree) in _modules().items():
        top = set(map(id, _top_level(tree)))
        inner = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top]
        for node in inner:
            for base, names in _imports(mod, path, node):
                heavy = base.split(".")[0] in HEAVY | PLATFORM or any(
                    (dep := _project(t)) is not None and _loads_heavy(dep) for t in [base] + [f"{base}.{n}" for n in names])
                if not heavy:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
        if inner and MARKER not in path.read_text(encoding="utf-8"):
            unmarked.append(str(path.relative_to(ROOT)))
    assert not bad, "imports inside functions that defer nothing heavy (move them to the top):\n" + "\n".join(bad)
    assert not unmarked, f"modules with imports inside functions but no {MARKER!r} comment:\n" + "\n".join(unmarked)


# ------------------------------------------------------------------------ the framework axis
FRAMEWORK_ROOTS = {"jax": {"jax", "jaxlib", "flax", "optax"}, "torch": {"torch"}}
FRAMEWORK_NAMES = {"jax", "torch"}
DOOR = "parity.runners"  # the one place of parity that may tell the frameworks apart


def _all_imports(mod: str, path: Path, tree: ast.Module):
    """Every module imported anywhere in ``tree`` (inside functions too), with the names taken."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from _imports(mod, path, node)


@lru_cache(maxsize=None)
def _frameworks_loaded(mod: str) -> frozenset:
    """The frameworks importing ``mod`` can load: its own imports (deferred ones included), and what the
    project modules it imports load at their top level, transitively."""
    path, tree = _modules()[mod]
    found = set()
    for base, names in _all_imports(mod, path, tree):
        found |= {fw for fw, roots in FRAMEWORK_ROOTS.items() if base.split(".")[0] in roots}
        for target in [base] + [f"{base}.{n}" for n in names]:
            dep = _project(target)
            if dep and dep != mod and not mod.startswith(dep + "."):
                found |= _top_level_frameworks(dep)
    return frozenset(found)


@lru_cache(maxsize=None)
def _top_level_frameworks(mod: str) -> frozenset:
    path, tree = _modules()[mod]
    found = set()
    for node in _top_level(tree):
        for base, names in _imports(mod, path, node):
            found |= {fw for fw, roots in FRAMEWORK_ROOTS.items() if base.split(".")[0] in roots}
            for target in [base] + [f"{base}.{n}" for n in names]:
                dep = _project(target)
                if dep and dep != mod and not mod.startswith(dep + "."):
                    found |= _top_level_frameworks(dep)
    return frozenset(found)


def _outside_the_door(mod: str) -> bool:
    return mod.startswith("parity") and not (mod == DOOR or mod.startswith(DOOR + "."))


def test_no_harness_module_outside_the_runners_loads_both_frameworks():
    both = sorted(m for m in _modules() if _outside_the_door(m) and _frameworks_loaded(m) == set(FRAMEWORK_ROOTS))
    assert not both, ("modules of parity outside parity/runners/ that import JAX and PyTorch both (go through "
                      "parity.runners.framework.get_framework):\n" + "\n".join(both))


def _names_a_framework(node) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in FRAMEWORK_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_framework(e) for e in node.elts)
    return False


def test_no_framework_name_test_outside_the_runners():
    """``framework == "jax"``, ``"torch" in frameworks``, ``fw not in ("jax", "torch")``: a verb or a
    :class:`parity.runners.framework.FrameworkInfo` field instead."""
    bad = []
    for mod, (path, tree) in _modules().items():
        if not _outside_the_door(mod):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(_names_a_framework(x) for x in [node.left, *node.comparators]):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "framework-name tests outside parity/runners/:\n" + "\n".join(bad)


def test_the_name_test_finds_one():
    tree = ast.parse('if framework == "jax" or "torch" in fws or f not in ("jax", "torch"): pass')
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)
            and any(_names_a_framework(x) for x in [n.left, *n.comparators])]
    assert len(hits) == 3


def _private_definitions() -> dict[str, set[str]]:
    """``{_name: {packages defining it}}``: functions, methods, classes and attributes assigned (``self._x = ...``)."""
    out: dict[str, set[str]] = {}
    for mod, (path, tree) in _modules().items():
        pkg = mod.split(".")[0]
        for node in ast.walk(tree):
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names = [node.attr]
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    out.setdefault(n, set()).add(pkg)
    return out


def test_no_private_attribute_used_across_packages():
    """``model._canonical_tensors(...)`` from another package: a public method instead."""
    defined, bad = _private_definitions(), []
    for mod, (path, tree) in _modules().items():
        pkg = mod.split(".")[0]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in defined
                    and pkg not in defined[node.attr]):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)} "
                           f"(defined in {', '.join(sorted(defined[node.attr]))})")
    assert not bad, "private attributes used across packages:\n" + "\n".join(bad)


def _type_checking(node) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): its imports do not run."""
    if not isinstance(node, ast.If):
        return False
    return getattr(node.test, "id", None) == "TYPE_CHECKING" or getattr(node.test, "attr", None) == "TYPE_CHECKING"


def _bindings(body) -> set[str] | None:
    """Names the statements ``body`` bind when the module runs (defs, classes, assignments, loop and ``with``
    targets, walrus, imports), through ``if``/``try``/``for``/``while``/``with`` blocks but not into functions,
    classes or ``if TYPE_CHECKING:``; None where a star import makes the names unknowable."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            continue
        if _type_checking(node):
            inner = _bindings(node.orelse)
            if inner is None:
                return None
            names |= inner
            continue
        targets = []
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            targets = [node.target]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
        for target in targets:
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        names |= {n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr)}
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], (ast.stmt, ast.excepthandler)):
                inner = _bindings([s for b in block for s in (b.body if isinstance(b, ast.excepthandler) else [b])])
                if inner is None:
                    return None
                names |= inner
    return names


@lru_cache(maxsize=None)
def _defined_names(mod: str) -> frozenset[str] | None:
    """Names module ``mod`` binds when it runs (:func:`_bindings`: not a method, a function's local or a
    ``TYPE_CHECKING`` import), its submodules, and with a PEP 562 module ``__getattr__`` its ``__all__`` (the
    module imported: those names are lazy); None where a star import makes them unknowable."""
    path, tree = _modules()[mod]
    names = _bindings(tree.body)
    if names is None:
        return None
    names |= {m.rpartition(".")[2] for m in _modules() if m.rpartition(".")[0] == mod}
    if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
        names |= set(importlib.import_module(mod).__all__)
    return frozenset(names)


def test_every_name_imported_from_the_project_exists():
    """``from parity.cases.sweep import measure_torch`` inside a script's function fails only when it runs:
    every ``from <project module> import <name>`` in the packages, scripts/, examples/ and tests/ (deferred
    imports too) names a submodule or a name the module binds when it runs (:func:`_bindings`). A relative
    import outside the packages is not checked (tests/, scripts/ and examples/ are not packages)."""
    bad = []
    files = [p for d in ("scripts", "examples", "tests") for p in sorted((ROOT / d).rglob("*.py"))]
    sources = [(m, p, t) for m, (p, t) in _modules().items()] + [(None, p, ast.parse(p.read_text(encoding="utf-8")))
                                                                  for p in files]
    for mod, path, tree in sources:
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or (node.level and mod is None):
                continue
            for base, names in _imports(mod or "", path, node):
                if base not in _modules():
                    if base.split(".")[0] in PACKAGES:
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: no module {base}")
                    continue
                defined = _defined_names(base)
                missing = [] if defined is None else [n for n in names if n != "*" and n not in defined]
                bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {base} has no {n!r}" for n in missing]
    assert not bad, "imports of names the project does not define:\n" + "\n".join(bad)
