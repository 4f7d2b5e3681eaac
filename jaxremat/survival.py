"""Does a compiled JAX program realize the savings its remat schedule promises?

``jax.checkpoint`` acts on the jaxpr: the saved residuals drop as promised. XLA then compiles the
program, and nothing obliges it to keep the recompute where the backward pass needs it: on
XLA:CPU, with the layers unrolled in Python, the recomputation is scheduled next to the forward
computation it repeats, its buffers stay live just as without remat, and the compiled temp bytes
do not move (docs/framework-differences.md, section 1). Remat of a ``scan`` body survives.

The check compares two programs of the same model, the schedule's and the no-remat one:

* **promised saving**: the no-remat program's saved residual bytes less the schedule's
  (:func:`jaxremat.memory.saved_residuals`, jaxpr level, before XLA);
* **realized saving**: the no-remat program's compiled temp bytes less the schedule's
  (``Compiled.memory_analysis()``, after XLA); the residual-based prediction of the schedule's
  temp bytes is the no-remat temp less the promised saving;
* **op counts**: matrix products in the program before optimization
  (``Lowered.as_text()``, StableHLO ``dot_general``) and after (``Compiled.as_text()``, HLO
  ``dot``): recompute merged away by common-subexpression elimination shows as fewer products
  after than before; recompute kept but scheduled early shows as equal counts and no saving.

A schedule that promises a saving (at least :data:`MIN_PROMISED` of the no-remat residuals) and
realizes less than :data:`MIN_REALIZED` of it gets a warning in plain words.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import jax

from .memory import compiled_stats, saved_activation_bytes

MIN_PROMISED = 0.10
"""A schedule promises a saving when its residuals are at least this fraction below no-remat's."""
MIN_REALIZED = 0.5
"""The compiled program must realize at least this fraction of the promised saving."""

_DOT_BEFORE = re.compile(r"stablehlo\.dot_general\b")
_DOT_AFTER = re.compile(r"\bdot\(")


def count_dots(text: str, *, optimized: bool) -> int:
    """Matrix products in a program's text: StableHLO ``dot_general`` (lowered) or HLO ``dot(`` (compiled)."""
    return len((_DOT_AFTER if optimized else _DOT_BEFORE).findall(text))


@dataclasses.dataclass(frozen=True)
class Survival:
    """What a schedule promised and what its compiled program realized (bytes; counts per program text).

    Attributes:
        name: the schedule (or program) checked.
        promised_saving_bytes: no-remat saved residual bytes less the schedule's.
        realized_saving_bytes: no-remat compiled temp bytes less the schedule's.
        predicted_temp_bytes: no-remat temp bytes less the promised saving.
        temp_bytes: the schedule's compiled temp bytes.
        dots_before, dots_after: matrix products before and after XLA's optimization (None if unknown).
        survived: False when a promised saving is not realized (see :data:`MIN_REALIZED`).
        warning: the plain-words warning, or None.
    """

    name: str
    promised_saving_bytes: int
    realized_saving_bytes: int
    predicted_temp_bytes: int
    temp_bytes: int
    dots_before: int | None
    dots_after: int | None
    survived: bool
    warning: str | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def assess(name: str, *, none_saved: int, saved: int, none_temp: int, temp: int,
           dots_before: int | None = None, dots_after: int | None = None) -> Survival:
    """Judge one schedule against the no-remat program from already measured numbers (bytes)."""
    promised, realized = none_saved - saved, none_temp - temp
    promises = none_saved > 0 and promised >= MIN_PROMISED * none_saved
    survived = not promises or realized >= MIN_REALIZED * promised
    warning = None
    if not survived:
        merged = dots_before is not None and dots_after is not None and dots_after < dots_before
        how = (f"XLA removed {dots_before - dots_after} of {dots_before} matrix products: the recompute was "
               "merged into the forward pass" if merged else
               "no matrix product was removed, so the recompute is still in the program and other buffers "
               "stay live: XLA:CPU schedules the recompute of Python-unrolled layers next to the forward pass "
               "(stack the layers and run them through jaxremat.render.remat_scan), and a checkpointed loop of "
               "trip count 1 (method='checkpoint') is inlined by XLA and its recompute scheduled early")
        warning = (f"{name}: remat did not survive compilation. Its saved residuals promise "
                   f"{promised:,} bytes less than no remat, but the compiled program's temp memory is "
                   f"{temp:,} bytes against {none_temp:,} without remat (a saving of {realized:,} bytes, "
                   f"predicted {none_temp - promised:,} bytes of temp); {how}.")
    return Survival(name, promised, realized, none_temp - promised, temp, dots_before, dots_after, survived, warning)


def _measure(fn: Callable, args: tuple) -> tuple[int, int, int, int]:
    """(saved activation bytes, compiled temp bytes, dots before, dots after) of ``value_and_grad(fn)``."""
    lowered = jax.jit(jax.value_and_grad(fn)).lower(*args)
    compiled = lowered.compile()
    return (saved_activation_bytes(fn, *args), compiled_stats(compiled)["temp_bytes"],
            count_dots(lowered.as_text(), optimized=False), count_dots(compiled.as_text(), optimized=True))


def survival_check(name: str, fn: Callable, fn_none: Callable, *args) -> Survival:
    """Compile ``value_and_grad`` of a remat function and of its no-remat twin, and :func:`assess` it.

    Args:
        name: label of the checked program (used in the warning).
        fn: the loss under the remat schedule, a function of ``args`` (differentiated w.r.t. the first).
        fn_none: the same loss without remat.
        *args: example arguments (arrays or ``jax.ShapeDtypeStruct`` s).

    Returns:
        :class:`Survival`. Compiles two programs (seconds).
    """
    none_saved, none_temp, _, _ = _measure(fn_none, args)
    saved, temp, before, after = _measure(fn, args)
    return assess(name, none_saved=none_saved, saved=saved, none_temp=none_temp, temp=temp,
                  dots_before=before, dots_after=after)
