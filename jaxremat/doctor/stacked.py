"""Stacked per-layer outputs of a scan that cost memory for nothing (the ``stacked-output`` problem).

A ``lax.scan`` over layers writes each ``ys`` output as one ``[L, ...]`` buffer that lives from the
first layer to its last reader. Two such buffers are waste:

* **a stacked copy of a scanned input** (:func:`parameter_copies`): a ``ys`` output the body
  computes as a layout view or a dtype cast of its own slice of a scanned input: the weights cast
  to bfloat16 inside the layer (``nnx.Linear(dtype=jnp.bfloat16)``) and saved for the backward pass
  of a scan without remat, or the module's state that ``nnx.scan`` hands back out of the loop, live
  in a train step that returns the updated model (measured: an NNX step compiled to 420 KiB of temp
  memory against 153 KiB for the same step over ``lax.scan``, the difference the size of the
  stacked parameters). An ``[L, ...]`` copy of the parameters either way. JAX forwards a slice
  returned as it is (no copy); a cast or a view is stacked. Counted when the copies add up to at
  least :data:`MIN_COPY_FRACTION` of the scan's scanned inputs (a LayerNorm weight broadcast per
  layer is a copy, but a small one);
* **a stacked output the backward pass does not read** (:func:`unread_outputs`): a ``ys`` output
  whose per-layer slice is at least :data:`MIN_SLICE_FRACTION` of the scan's largest carry (a hidden
  state per layer, not a per-layer scalar), used by the function (an unused one is removed by XLA)
  but not among the residuals ``jax.vjp`` keeps for the backward pass, e.g. every layer's output
  returned as ``ys`` to take ``hs[-1]``: ``L`` hidden states held in the forward pass, whatever the
  remat policy, for one that the carry already holds.

Both read jaxprs: the forward pass of ``jax.vjp(fn)`` with its residuals as outputs (a loss), or the
whole program (a train step; there only copies are looked for, since the backward pass is not
separated from the forward one). Scans are looked for at the top level and inside ``jit``/call
sub-programs, copies also inside scan bodies.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import jax
import jax.extend.core
import numpy as np
from jax._src.interpreters import partial_eval as _pe


from ..scan_params import scan_layout
from .regions import eqn_site

__all__ = ["MIN_COPY_FRACTION", "MIN_SLICE_FRACTION", "StackedOutput", "live", "parameter_copies", "unread_outputs"]

MIN_COPY_FRACTION = 0.1
"""Stacked copies of a scan's inputs count when they add up to this fraction of its scanned inputs' bytes."""
MIN_SLICE_FRACTION = 0.5
"""A stacked output counts when one layer's slice is this fraction of the scan's largest carry leaf."""

_VIEWS = frozenset({"reshape", "squeeze", "expand_dims", "slice", "transpose", "copy", "copy_p",
                    "convert_element_type", "reduce_precision"})
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call"})


@dataclasses.dataclass(frozen=True)
class StackedOutput:
    """One wasteful stacked output of a scan.

    Attributes:
        kind: ``"cast"`` (a stacked dtype cast of a scanned input, e.g. bfloat16 weights saved for the
            backward pass), ``"copy"`` (the scanned inputs handed out again, e.g. ``nnx.scan`` returning
            the module's state from a train step) or ``"unread"`` (not read by the backward pass).
        length: the scan's trip count L.
        shapes: the ``[L, ...]`` shapes of the outputs (all of the scan's copies for ``"copy"``).
        bytes: their bytes in all.
        reference_bytes: the scanned inputs' bytes (``"copy"``) or the largest carry leaf's (``"unread"``).
        site: ``"path:line"`` of the scan in user code, or ``""``.
    """

    kind: str
    length: int
    shapes: tuple[tuple[int, ...], ...]
    bytes: int
    reference_bytes: int
    site: str


def _nbytes(aval: Any) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * int(aval.dtype.itemsize)


def live(jaxpr: Any) -> Any:
    """``jaxpr`` with dead code removed (``jax._src.interpreters.partial_eval.dce_jaxpr``, keeping every
    output; scans lose the ``ys`` nothing reads), so that what is left is what XLA keeps."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    try:
        return _pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)[0]
    except Exception:  # a program DCE cannot handle: look at it whole
        return jaxpr


def _is_var(v: Any) -> bool:
    return isinstance(v, jax.extend.core.Var) and not isinstance(v, jax.extend.core.DropVar)


def _is_view(eqn: Any) -> bool:
    if eqn.primitive.name in _VIEWS:
        return True
    return (eqn.primitive.name == "broadcast_in_dim" and _is_var(eqn.invars[0])
            and np.prod(eqn.invars[0].aval.shape) == np.prod(eqn.outvars[0].aval.shape))


def _scans(jaxpr: Any, deep: bool) -> Iterator[Any]:
    """Scan equations of ``jaxpr``, in call sub-programs, and (``deep``) in every sub-program."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            yield eqn
        if deep or eqn.primitive.name in _CALLS:
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from _scans(sub, deep)


def _copy_positions(eqn: Any) -> list[tuple[int, bool]]:
    """``(index among ys, cast)`` of a scan's ``ys`` whose body output is a view or cast of a scanned input."""
    body = eqn.params["jaxpr"].jaxpr
    lay = scan_layout(eqn)
    xs = set(body.invars[lay.xs_start:])
    producer = {o: e for e in body.eqns for o in e.outvars}
    out = []
    for j, v in enumerate(body.outvars[lay.carry_out:]):
        cast = False
        while _is_var(v) and v in producer and _is_view(producer[v]):
            cast = cast or producer[v].primitive.name == "convert_element_type"
            v = producer[v].invars[0]
        if _is_var(v) and v in xs:
            out.append((j, cast))
    return out


def parameter_copies(jaxpr: Any) -> list[StackedOutput]:
    """Scans whose used ``ys`` include stacked views or casts of their scanned inputs (see the module docstring).

    Args:
        jaxpr: a program (``jax.extend.core.Jaxpr`` or ``ClosedJaxpr``).
    """
    found = []
    for eqn in _scans(live(jaxpr), deep=True):
        lay = scan_layout(eqn)
        n_carry, n_in = lay.carry_out, lay.xs_start
        ys = eqn.outvars[n_carry:]
        positions = [(j, cast) for j, cast in _copy_positions(eqn) if _is_var(ys[j])]
        copies = [ys[j] for j, _ in positions]
        xs_bytes = sum(_nbytes(v.aval) for v in eqn.invars[n_in:])
        copy_bytes = sum(_nbytes(v.aval) for v in copies)
        if copies and xs_bytes and copy_bytes >= MIN_COPY_FRACTION * xs_bytes:
            kind = "cast" if any(cast for _, cast in positions) else "copy"
            found.append(StackedOutput(kind, eqn.params["length"], tuple(tuple(v.aval.shape) for v in copies),
                                       copy_bytes, xs_bytes, eqn_site(eqn)))
    return found


def _is_tie(eqn: Any) -> bool:
    """A one-entry in-place add (:func:`jaxremat.layer_pass.tie`: ``+ -0.0`` at one index, the bits kept)."""
    return (eqn.primitive.name == "scatter-add" and len(eqn.invars) == 3
            and int(np.prod(eqn.invars[2].aval.shape)) == 1)


def _read_by_backward(jaxpr: Any, residuals: set) -> set:
    """``residuals`` and the variables they are layout views of (a residual reshaped from ``y`` reads ``y``),
    or ties of (:func:`_is_tie`)."""
    producer = {o: e for e in jaxpr.eqns for o in e.outvars}
    read, todo = set(residuals), list(residuals)
    while todo:
        e = producer.get(todo.pop())
        if e is not None and (_is_view(e) or _is_tie(e)) and _is_var(e.invars[0]) and e.invars[0] not in read:
            read.add(e.invars[0])
            todo.append(e.invars[0])
    return read


def _used(jaxpr: Any) -> set:
    used = {v for e in jaxpr.eqns for v in e.invars if _is_var(v)}
    return used | {v for v in jaxpr.outvars if _is_var(v)}


def unread_outputs(jaxpr: Any, residuals: set) -> list[StackedOutput]:
    """Stacked ``ys`` used by the function but not read by its backward pass (see the module docstring).

    Args:
        jaxpr: the forward pass of ``jax.vjp(fn)`` (``jax.extend.core.Jaxpr``).
        residuals: its output variables that are residuals (the rest are the function's outputs).
    """
    found = []
    jaxpr = live(jaxpr)
    read, used = _read_by_backward(jaxpr, residuals), _used(jaxpr)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _CALLS:
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                if len(sub.outvars) == len(eqn.outvars):
                    inner = {iv for iv, ov in zip(sub.outvars, eqn.outvars) if ov in read and _is_var(iv)}
                    found += unread_outputs(sub, inner)
        if eqn.primitive.name != "scan" or not scan_layout(eqn).carry_out:
            continue
        n_carry, length = scan_layout(eqn).carry_out, eqn.params["length"]
        carry = max(_nbytes(v.aval) for v in eqn.outvars[:n_carry])
        for y in eqn.outvars[n_carry:]:
            if _is_var(y) and y in used and y not in read and carry and length \
                    and _nbytes(y.aval) / length >= MIN_SLICE_FRACTION * carry:
                found.append(StackedOutput("unread", length, (tuple(y.aval.shape),), _nbytes(y.aval), carry,
                                           eqn_site(eqn)))
    return found
