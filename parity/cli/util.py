"""Small helpers shared by the command lines (``run``, ``sweep``)."""

from __future__ import annotations

import argparse
import re
import sys


def split_list(text: str) -> tuple[str, ...]:
    """Split a comma-separated option at commas outside parentheses.

    ``"nested(sqrt,sqrt),full"`` -> ``("nested(sqrt,sqrt)", "full")``.

    Raises:
        ValueError: an empty item (``"full,,sqrt"``) or unbalanced parentheses.
    """
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            raise ValueError(f"unbalanced ')' in {text!r}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"unbalanced '(' in {text!r}")
    parts.append(cur)
    items = tuple(p.strip() for p in parts)
    if len(items) > 1 and any(not p for p in items):
        raise ValueError(f"empty item in the list {text!r}; remove the extra comma")
    return tuple(p for p in items if p)


_ASCII_INT = re.compile(r"-?[0-9]+", re.ASCII)


def ascii_int(text: str) -> int:
    """An integer option's value, written in ASCII digits 0-9 with an optional leading ``-``.

    Python's ``int()`` (argparse's ``type=int``) reads ``"1_0"`` as 10, ``"+3"`` as 3 and
    fullwidth or Arabic-Indic digits as digits; an option is refused instead of being read as
    something the user did not type.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse prints it as one line, exit 2).
    """
    if not _ASCII_INT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer written in ASCII digits 0-9 "
                                         "(no sign other than '-', no '_', spaces or other numerals)")
    return int(text)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``error: ...; see PROG --help``, exit 2.

    argparse's own ``error`` prints the whole usage block before the message; the commands'
    other errors are one line, and so are these. Subparsers made from it are of this class too.
    A value that starts with a minus and a digit (``--budget -5%``) is the option's value, as
    ``--budget=-5%`` is: argparse would take it for an option and say only "expected one argument",
    where the option's own check says what is wrong with the value.
    """

    def parse_known_args(self, args=None, namespace=None):  # noqa: D102 - argparse's hook
        joined: list[str] = []
        for arg in sys.argv[1:] if args is None else args:
            if joined and _NEGATIVE.match(arg) and _LONG_OPTION.fullmatch(joined[-1]):
                joined[-1] += "=" + arg
            else:
                joined.append(arg)
        return super().parse_known_args(joined, namespace)

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"error: {self.prog}: {message}; see {self.prog} --help\n")


_NEGATIVE = re.compile(r"-[0-9.]")
_LONG_OPTION = re.compile(r"--[A-Za-z][-A-Za-z0-9_]*")
