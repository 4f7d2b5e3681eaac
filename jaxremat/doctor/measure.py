"""The doctor's measurements: what one region keeps (traced), what the compiled program keeps.

* :func:`kept_per_call`: the residuals one call of a region keeps under a policy, from
  :func:`jaxremat.memory.saved_residuals` of ``jax.checkpoint(region, policy=...)`` alone. Inputs
  that carry no tangent in the program are held constant (``lax.stop_gradient``), as there; the
  region's inputs themselves (its boundary, kept under every policy) are not counted.
* :func:`trace_program` / :func:`compile_stats`: the program traced under
  :func:`jaxremat.doctor.regions.recording` (with some regions' policies swapped), and XLA's
  compiled temp bytes and matrix-product counts of it (:func:`jaxremat.memory.compiled_stats`,
  :func:`jaxremat.survival.count_dots`).
* :func:`vjp_forward`: the forward pass of ``jax.vjp(loss)`` with its residual outputs marked,
  for the stacked-output check.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
import jax.extend.core

from ..memory import compiled_stats, saved_residuals
from ..survival import count_dots
from .program import Program
from .regions import RegionRecord, recording

__all__ = ["compile_stats", "host_buffers", "kept_per_call", "trace_program", "vjp_forward"]

_HOST_SPACE = re.compile(r"S\(5\)")  # XLA's host memory space in an HLO shape's layout, e.g. f32[4,8]{1,0:S(5)}


def kept_per_call(record: RegionRecord, policy: Callable | None) -> tuple[int, int]:
    """``(kept_bytes, host_bytes)``: residual bytes one call of the region keeps under ``policy``.

    The region runs as ``jax.checkpoint(region, policy=policy)``, differentiated in the inputs that
    carry a tangent in the program; the others are closed over from an enclosing trace, so that they
    are constants to the differentiation (as there), and nothing is allocated.

    Args:
        record: the region.
        policy: a ``jax.checkpoint`` policy (None keeps nothing).

    Returns:
        Bytes of the residuals that are not the region's inputs (nor views of them), and of those
        the ones in host memory (offloaded).
    """
    run = jax.checkpoint(jax.extend.core.jaxpr_as_fun(jax.extend.core.ClosedJaxpr(record.jaxpr, ())),
                         policy=policy, prevent_cse=False)
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in record.in_avals]
    diff = [s for s, t in zip(structs, record.tangent_in) if t]
    found: list = []

    def outer(*held):
        def region(*d):
            d, h = iter(d), iter(held)
            return run(*[next(d) if t else next(h) for t in record.tangent_in])

        found.extend(r for r in saved_residuals(region, *diff) if not r.is_argument)
        return 0

    if diff:
        jax.make_jaxpr(outer)(*[s for s, t in zip(structs, record.tangent_in) if not t])
    return sum(r.bytes for r in found), sum(r.bytes for r in found if r.memory == "host")


def trace_program(program: Callable, args: tuple, swaps: dict | None = None) -> tuple[Any, list[RegionRecord]]:
    """``(jax.stages.Traced, regions)``: ``jax.jit(program)`` traced with its remat regions recorded.

    Args:
        program: the function to trace.
        args: its arguments (arrays or ``jax.ShapeDtypeStruct`` s).
        swaps: ``{region key: policy}`` (see :func:`jaxremat.doctor.regions.recording`).
    """
    with recording(swaps, stop=trace_program.__code__) as recorder:
        traced = jax.jit(program).trace(*args)
    return traced, recorder.regions


def host_buffers(compiled_text: str) -> int:
    """How many shapes in a compiled HLO text live in host memory (``S(5)`` in their layout)."""
    return len(_HOST_SPACE.findall(compiled_text))


def compile_stats(traced: Any) -> dict[str, Any]:
    """Compile a traced program once: temp bytes, matrix products before/after XLA, host buffers, backend.

    Returns:
        dict with ``temp_bytes`` (bytes), ``dots_before`` (StableHLO ``dot_general`` ops),
        ``dots_after`` (HLO ``dot`` ops), ``host_buffers`` (:func:`host_buffers`), ``backend``.
    """
    lowered = traced.lower()
    compiled = lowered.compile()
    text = compiled.as_text()
    return {"temp_bytes": compiled_stats(compiled)["temp_bytes"],
            "dots_before": count_dots(lowered.as_text(), optimized=False),
            "dots_after": count_dots(text, optimized=True),
            "host_buffers": host_buffers(text), "backend": jax.default_backend()}


def vjp_forward(program: Program) -> tuple[Any, set]:
    """``(jaxpr, residual variables)``: the forward pass of ``jax.vjp`` of a loss in its differentiated leaves.

    The residuals are the leaves of the pullback ``jax.vjp`` returns, as outputs of the traced
    program (the other outputs are the loss and its auxiliary values).
    """
    def forward(*leaves):
        return jax.vjp(lambda *d: program.loss_of(d, leaves), *[leaves[i] for i in program.diff],
                       has_aux=program.has_aux)

    closed, out_shape = jax.make_jaxpr(forward, return_shape=True)(*program.leaves)
    n_res = len(jax.tree_util.tree_leaves(out_shape[1]))
    n_aux = len(jax.tree_util.tree_leaves(out_shape[2])) if program.has_aux else 0
    outvars = closed.jaxpr.outvars
    residuals = outvars[len(outvars) - n_aux - n_res:len(outvars) - n_aux]
    return closed.jaxpr, {v for v in residuals if isinstance(v, jax.extend.core.Var)}
