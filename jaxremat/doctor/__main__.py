"""``python -m jaxremat.doctor path/to/file.py:function``: the remat doctor from the command line.

``function`` (called with no arguments) returns ``(fn, args)``: the loss or train step and a tuple
of its arguments (arrays, ``jax.ShapeDtypeStruct`` s or ``flax.nnx`` modules), as
:func:`jaxremat.doctor.doctor` takes them. The file is imported as a module, its folder first on
``sys.path`` (so it may import its neighbours).

Prints the diagnosis (the regions' table, then one line per problem: ``KIND: PLACE: MESSAGE; fix:
FIX``; ``--problems-only`` prints the problem lines alone). Exit codes: 0 no problem found, 1 a
problem found, 2 bad input (one line: ``error: ...``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from .core import doctor

PROG = "python -m jaxremat.doctor"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's hook: one line, exit 2
        self.exit(2, f"error: {PROG}: {message}; see {PROG} --help\n")


class BadInput(Exception):
    """Bad input: its message is the one line printed before exit 2."""


def build_parser() -> argparse.ArgumentParser:
    """The command's options."""
    parser = _Parser(prog=PROG, description="Check the remat of your own JAX loss or train step: policies that name "
                     "tags their region lacks, remat that XLA undoes, offloads that stay on device, stacked scan "
                     "outputs nobody reads, policies that keep nothing.")
    parser.add_argument("target", metavar="FILE.py:FUNCTION",
                        help="a Python file and a function in it that returns (fn, args)")
    parser.add_argument("--no-compile", action="store_true",
                        help="trace only (seconds): skip the compiled checks (remat-not-surviving, compiled offload)")
    parser.add_argument("--argnums", default="0",
                        help="comma-separated arguments a loss is differentiated in (default 0)")
    parser.add_argument("--problems-only", action="store_true", help="print the problem lines only")
    return parser


def _argnums(text: str) -> tuple[int, ...]:
    try:
        nums = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise BadInput(f"--argnums must be comma-separated integers such as 0 or 0,1; got {text!r}") from None
    if any(n < 0 for n in nums):
        raise BadInput(f"--argnums must be non-negative; got {text!r}")
    return nums


def load_target(target: str) -> tuple[Callable, tuple]:
    """``(fn, args)`` from ``FILE.py:FUNCTION`` (see the module docstring).

    Raises:
        BadInput: no ``:``, a missing file, a file that fails to import, no such function, a function
            that raises or does not return ``(callable, tuple)``.
    """
    path_text, sep, name = target.rpartition(":")
    if not sep or not path_text or not name:
        raise BadInput(f"give the target as FILE.py:FUNCTION, e.g. train.py:make_step; got {target!r}")
    path = Path(path_text)
    if not path.is_file():
        raise BadInput(f"no such file: {path_text}")
    module_name = f"_jaxremat_doctor_target_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise BadInput(f"{path_text} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise BadInput(f"importing {path_text} failed: {_one_line(err)}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise BadInput(f"{path_text} has no function {name!r}")
    try:
        made = factory()
    except Exception as err:
        raise BadInput(f"{name}() failed: {_one_line(err)}") from None
    return _check_made(name, made)


def _check_made(name: str, made: Any) -> tuple[Callable, tuple]:
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0]) and isinstance(made[1], (tuple, list))):
        raise BadInput(f"{name}() must return (fn, args): a callable and a tuple of its arguments; "
                       f"got {type(made).__name__}")
    return made[0], tuple(made[1])


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    where = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
    at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    return f"{type(err).__name__}: {text[0] if text else ''}{at}"


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit code (0 no problem, 1 problems, 2 bad input)."""
    args = build_parser().parse_args(argv)
    try:
        argnums = _argnums(args.argnums)
        fn, fn_args = load_target(args.target)
        try:
            diagnosis = doctor(fn, *fn_args, argnums=argnums, compile=not args.no_compile)
        except Exception as err:
            raise BadInput(f"tracing {args.target} failed: {_one_line(err)}") from None
    except BadInput as err:
        print(f"error: {PROG}: {err}", file=sys.stderr)
        return 2
    for line in (map(str, diagnosis.problems) if args.problems_only else [str(diagnosis)]):
        print(line)
    return 1 if diagnosis.problems else 0


if __name__ == "__main__":
    sys.exit(main())
