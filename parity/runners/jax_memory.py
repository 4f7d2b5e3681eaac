"""The one JAX memory measurement: saved residuals, compiled peak, peak activation, device peak.

:func:`measure_jax` is called by the JAX runner (:func:`parity.runners.jax_runner.run_plan`),
the depth sweep and the GPU pass (:meth:`parity.runners.jax_framework.JaxFramework.measure_plan`,
:meth:`~parity.runners.jax_framework.JaxFramework.device_peak`, one fresh process per case):

* saved bytes -- the non-argument residuals of the loss, counted on its jaxpr before any compiler
  runs (:func:`jaxremat.memory.saved_residuals`), split by memory kind (device / host-offloaded);
* peak bytes -- XLA's buffer plan of the compiled ``jit(value_and_grad(loss))`` that runs
  (:func:`jaxremat.memory.compiled_stats`: argument + output + temp - alias);
* peak activation bytes -- that peak less parameters (arguments) and gradients (outputs),
  ``2 x`` the parameter bytes, which leaves temp bytes plus the tokens and the loss;
* device peak -- on a GPU only, the allocator's high-water mark around one step
  (:func:`jaxremat.memory.device_peak_bytes`), measured first, before anything else runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from jaxremat.memory import compiled_stats, device_peak_bytes, gpu_available, saved_residuals

from parity.runners.result import Memory

SAVED_SOURCE = "jaxremat.memory.saved_residuals (non-argument residuals of the loss's jaxpr)"
PEAK_ACTIVATION_SOURCE = "peak_bytes less parameters (arguments) and gradients (outputs)"


def param_bytes(params: dict) -> int:
    """Bytes of a parameter dict (sum of each array's ``nbytes``)."""
    return int(sum(int(v.nbytes) for v in jax.tree_util.tree_leaves(params)))


def measure_jax(loss: Callable[[dict], Any], params: dict, compiled: Any | None = None, *,
                device_step: Callable[[], Any] | None = None,
                program: str = "jit(value_and_grad(loss_fn))") -> Memory:
    """Measure the memory of one loss+gradient step of ``loss`` at ``params``.

    Args:
        loss: ``params -> scalar`` loss (tokens, config and schedule closed over); its residuals
            are the saved bytes.
        params: the parameter dict (jax arrays) the step differentiates.
        compiled: the ``jax.stages.Compiled`` of ``jit(value_and_grad(loss))`` that the caller
            runs (so the numbers are those of the executable that runs); None compiles it here.
        device_step: a zero-argument callable that runs one step on the device; on a GPU backend
            it runs once first and :attr:`Memory.device_peak` reads the allocator around it.
            None (or no GPU) leaves ``device_peak`` None.
        program: what ``compiled`` is, for :attr:`Memory.peak_source`.

    Returns:
        :class:`parity.runners.result.Memory` (``residuals``: dicts of
        :class:`jaxremat.memory.ResidualRecord` fields).
    """
    device_peak = None
    if device_step is not None and gpu_available():  # first: the allocator's mark is process-wide
        device_peak = device_peak_bytes(device_step)
    records = saved_residuals(loss, params)
    if compiled is None:
        compiled = jax.jit(jax.value_and_grad(loss)).lower(params).compile()
    stats = compiled_stats(compiled)
    peak = int(stats["peak_bytes"])
    return Memory(
        saved_bytes=int(sum(r.bytes for r in records if not r.is_argument and r.memory == "device")),
        offloaded_bytes=int(sum(r.bytes for r in records if not r.is_argument and r.memory == "host")),
        peak_bytes=peak,
        peak_activation_bytes=peak - 2 * param_bytes(params),
        saved_source=SAVED_SOURCE,
        peak_source=f"{stats['source']} of {program}",
        peak_activation_source=PEAK_ACTIVATION_SOURCE,
        peak_breakdown={k: v for k, v in stats.items() if k != "source"},
        residuals=tuple(dataclasses.asdict(r) for r in records),
        device_peak=device_peak,
    )
