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
import jax.numpy as jnp
from jax import lax

from ..memory import compiled_stats, saved_residuals
from ..survival import count_dots
from .regions import RegionRecord, recording

__all__ = ["compile_stats", "host_buffers", "kept_per_call", "trace_program", "vjp_forward"]

_HOST_SPACE = re.compile(r"S\(5\)")  # XLA's host memory space in an HLO shape's layout, e.g. f32[4,8]{1,0:S(5)}


def _region_function(record: RegionRecord) -> Callable:
    run = jax.extend.core.jaxpr_as_fun(jax.extend.core.ClosedJaxpr(record.jaxpr, ()))

    def region(*args):
        held = [a if t or not jnp.issubdtype(a.dtype, jnp.inexact) else lax.stop_gradient(a)
                for a, t in zip(args, record.tangent_in)]
        return run(*held)

    return region


def kept_per_call(record: RegionRecord, policy: Callable | None) -> tuple[int, int]:
    """``(kept_bytes, host_bytes)``: residual bytes one call of the region keeps under ``policy``.

    Args:
        record: the region.
        policy: a ``jax.checkpoint`` policy (None keeps nothing).

    Returns:
        Bytes of the residuals that are not the region's inputs (nor views of them), and of those
        the ones in host memory (offloaded).
    """
    fn = jax.checkpoint(_region_function(record), policy=policy, prevent_cse=False)
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in record.in_avals]
    records = [r for r in saved_residuals(fn, *structs) if not r.is_argument]
    return sum(r.bytes for r in records), sum(r.bytes for r in records if r.memory == "host")


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


def vjp_forward(loss: Callable, args: tuple, argnums: tuple[int, ...], has_aux: bool) -> tuple[Any, set]:
    """``(jaxpr, residual variables)``: the forward pass of ``jax.vjp`` of ``loss`` in ``args[argnums]``.

    The residuals are the leaves of the pullback ``jax.vjp`` returns, as outputs of the traced
    program (the other outputs are the loss and its auxiliary values).
    """
    def forward(*all_args):
        def diff(*d):
            full = list(all_args)
            for i, a in zip(argnums, d):
                full[i] = a
            return loss(*full)

        return jax.vjp(diff, *[all_args[i] for i in argnums], has_aux=has_aux)

    closed, out_shape = jax.make_jaxpr(forward, return_shape=True)(*args)
    n_res = len(jax.tree_util.tree_leaves(out_shape[1]))
    n_aux = len(jax.tree_util.tree_leaves(out_shape[2])) if has_aux else 0
    outvars = closed.jaxpr.outvars
    residuals = outvars[len(outvars) - n_aux - n_res:len(outvars) - n_aux]
    return closed.jaxpr, {v for v in residuals if isinstance(v, jax.extend.core.Var)}
