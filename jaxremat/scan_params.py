"""How a ``scan`` equation of a jaxpr lays out its operands, across JAX versions.

JAX 0.10 names the counts (``num_consts``, ``num_carry``); JAX 0.12 gives the flat layout of inputs and
outputs instead (``ft_in = (consts, carry, xs)``, ``ft_out = (carry, ys)``) and drops from the equation the
carries and ``ys`` that only forward an input (a loop-invariant carry becomes a constant; a ``y`` that is a
scanned input is not materialized). :func:`scan_layout` reads either: the body's inputs are ``consts``,
then ``carry_in`` carries, then the scanned ``xs``; its outputs (and the equation's) ``carry_out``
carries, then the ``ys``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["ScanLayout", "scan_layout"]


@dataclasses.dataclass(frozen=True)
class ScanLayout:
    """Operand counts of one ``scan`` equation.

    Attributes:
        consts: leading body inputs that are the same at every step.
        carry_in: body inputs after them that are carried.
        carry_out: leading body (and equation) outputs that are carried.
    """

    consts: int
    carry_in: int
    carry_out: int

    @property
    def xs_start(self) -> int:
        """Index of the first scanned input among the body's (and the equation's) inputs."""
        return self.consts + self.carry_in


def _parts(tree: Any) -> tuple:
    """The top-level parts of a scan's ``ft_in`` / ``ft_out`` (a FlatTree, or a plain tuple)."""
    return tuple(tree.unpack()) if hasattr(tree, "unpack") else tuple(tree)


def scan_layout(eqn: Any) -> ScanLayout:
    """The :class:`ScanLayout` of a ``scan`` equation (``jax.extend.core.JaxprEqn``).

    Raises:
        ValueError: the equation's parameters hold neither layout (a JAX this code does not know).
    """
    p = eqn.params
    if "num_consts" in p and "num_carry" in p:
        return ScanLayout(int(p["num_consts"]), int(p["num_carry"]), int(p["num_carry"]))
    if "ft_in" in p and "ft_out" in p:  # jax._src.flattree.FlatTree values: tuples of leaves
        consts, carry, _ = _parts(p["ft_in"])
        return ScanLayout(len(consts), len(carry), len(_parts(p["ft_out"])[0]))
    raise ValueError(f"scan equation with parameters {sorted(p)}: neither num_consts/num_carry nor ft_in/ft_out")
