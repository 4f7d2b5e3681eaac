"""The name grammar shared by schedules, policies and plans: calls, plain integers, top-level splits.

Every name of the remat language is ``NAME`` or ``NAME(ARGS)``; lists inside ``ARGS`` are split
at commas outside parentheses (``nested(sqrt,every_k(2))``), and integer parameters are ASCII
digits only. :mod:`jaxremat.spec.schedules`, :mod:`jaxremat.spec.policies`,
:mod:`jaxremat.spec.segment_plan` and :mod:`jaxremat.spec.plan` parse with these three helpers.
"""

from __future__ import annotations

import re

__all__ = ["plain_int", "split_call", "split_top"]

_CALL = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*", re.ASCII | re.DOTALL)
_PLAIN_INT = re.compile(r"\s*([0-9]+)\s*", re.ASCII)


def split_call(text: str, what: str, valid: str = "") -> tuple[str, str | None]:
    """Split ``NAME`` or ``NAME(ARGS)`` (whitespace allowed around the parentheses only).

    Args:
        text: the name as written.
        what: what is expected (``"schedule"``, ``"policy"``), for the message.
        valid: the valid forms, appended to the message when given.

    Returns:
        ``(name, args)``, ``args`` None without parentheses.

    Raises:
        ValueError: anything else (the message quotes ``text`` and names ``what`` was expected).
    """
    depth = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            break
    if depth:
        raise ValueError(f"{what} {text!r}: unbalanced parentheses")
    m = _CALL.fullmatch(text)
    if m is None:
        raise ValueError(f"unknown {what} {text!r}; write a name, or a name with its parameter in parentheses"
                         f"{'; valid ' + what + 's: ' + valid if valid else ''}")
    return m.group(1), m.group(2)


def plain_int(text: str, arg: str, example: str, what: str = "schedule") -> int:
    """``arg`` as an int when it is ASCII digits only (no sign, ``_``, or other numerals).

    Python's ``int()`` reads ``"2_0"`` as 20 and fullwidth or Arabic-Indic digits as digits; a
    parameter is refused instead of being read as something the user did not type.

    Raises:
        ValueError: ``arg`` is not a plain integer (the message quotes ``text`` and gives ``example``).
    """
    m = _PLAIN_INT.fullmatch(arg)
    if m is None:
        raise ValueError(f"{what} {text!r}: parameter {arg.strip()!r} is not an integer written in ASCII digits "
                         f"0-9 (no sign, '_' or other numerals), e.g. {example}")
    return int(m.group(1))


def split_top(body: str, sep: str) -> list[str]:
    """Split ``body`` at ``sep`` outside parentheses: ``"sqrt,every_k(2)"`` -> two items."""
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += (ch == "(") - (ch == ")")
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]
