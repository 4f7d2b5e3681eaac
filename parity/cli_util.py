"""Small helpers shared by the command lines (``run``, ``sweep``)."""

from __future__ import annotations


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
