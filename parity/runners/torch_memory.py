"""The one PyTorch memory measurement: saved activations, step peak, peak activation.

:func:`measure_torch` is called by the PyTorch runner (:func:`parity.runners.torch_runner.run_plan`),
the depth sweep and the GPU pass (:meth:`parity.runners.torch_framework.TorchFramework.measure_plan`,
:meth:`~parity.runners.torch_framework.TorchFramework.device_peak`):

* saved bytes -- one forward pass under :class:`torchref.memory.SavedActivationRecorder`
  (parameters and buffers excluded) with the plan's :class:`torchref.policies.SelectiveCheckpoint`:
  saved tensors, checkpoint inputs and the policy's cached outputs; offloaded bytes are the
  outputs the policy moved to host memory;
* peak bytes of one step -- on a CUDA model ``torch.cuda.max_memory_allocated`` after a reset
  (:func:`torchref.memory.peak_step_bytes`; peak activation: the increase over what was allocated
  before the step); on CPU one of two counters:

  - ``"memtracker"`` (the suite): ``MemTracker`` with the model and optimizer tracked
    (:func:`torchref.memory.peak_step_bytes`); peak activation = the peak less its ``PARAM``,
    ``BUFFER``, ``GRAD`` and ``OPT`` categories;
  - ``"live_bytes"`` (the depth sweep, where MemTracker's cost grows with depth): the bytes of
    storages allocated during the step (:func:`torchref.live_bytes.step_peak_bytes`) are the
    peak activation, and the peak adds the ``fixed`` tensors (parameters, buffers, gradients).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from jaxremat.spec.policies import Policy
from torchref.live_bytes import step_peak_bytes
from torchref.memory import SavedActivationRecorder, peak_step_bytes
from torchref.policies import SelectiveCheckpoint

from parity.runners.result import Memory

COUNTERS = ("memtracker", "live_bytes")
NOT_ACTIVATION = ("PARAM", "BUFFER", "GRAD", "OPT")
"""MemTracker categories that are not activations (subtracted from the peak)."""

SAVED_SOURCE = ("torchref.memory.SavedActivationRecorder (saved tensors and checkpoint inputs) "
                "+ SelectiveCheckpoint cached outputs")


def _on_cuda(tracked) -> bool:
    return any(p.is_cuda for m in tracked if isinstance(m, torch.nn.Module) for p in m.parameters())


def _saved(forward, exclude, policy):
    recorder = SavedActivationRecorder(exclude=list(exclude))
    sac = SelectiveCheckpoint(policy)
    with recorder:
        loss = forward(sac, recorder.record_boundary)
    del loss
    names = tuple(sorted({r.name for r in sac.records if r.name}))
    return int(recorder.total_bytes + sac.kept_bytes()), int(sac.offloaded_bytes()), tuple(recorder.records), names


def _peak(step, tracked, counter, fixed) -> tuple[int, int | None, str, str, dict]:
    """``(peak, peak activation, peak source, activation source, breakdown)`` of one ``step()``."""
    if counter == "live_bytes" and not _on_cuda(tracked):
        fixed = list(fixed)
        act = step_peak_bytes(step, fixed)
        fixed_bytes = sum(t.untyped_storage().nbytes() for t in fixed)
        return (int(act + fixed_bytes), int(act),
                "torchref.live_bytes (storages allocated during the step) + parameters, buffers and gradients",
                "torchref.live_bytes (storages allocated during the step; = MemTracker less PARAM, GRAD, OPT)",
                {"step_bytes": int(act), "fixed_bytes": int(fixed_bytes)})
    peak = peak_step_bytes(step, *tracked)
    breakdown = dict(peak.breakdown)
    if "step_increase" in breakdown:
        act, act_source = int(breakdown["step_increase"]), f"{peak.source} less memory allocated before the step"
    elif breakdown:
        act = int(peak.peak_bytes) - sum(int(v) for k, v in breakdown.items() if k in NOT_ACTIVATION)
        act_source = f"{peak.source} less its {', '.join(NOT_ACTIVATION)} categories"
    else:
        act, act_source = None, "not measured: the tracker gave no breakdown"
    total = int(peak.peak_bytes)
    if counter == "live_bytes":  # on CUDA: the step's increase plus the fixed tensors, as on CPU
        total = int(act + sum(t.untyped_storage().nbytes() for t in fixed))
    return total, act, peak.source, act_source, breakdown


def measure_torch(forward: Callable[[SelectiveCheckpoint, Callable], Any], step: Callable[[], Any], *,
                  exclude: Iterable[torch.Tensor], tracked: tuple = (), policy: Policy | str | None = None,
                  counter: str = "memtracker", fixed: Iterable[torch.Tensor] = ()) -> Memory:
    """Measure the saved bytes of one forward pass and the peak of one step.

    Args:
        forward: ``forward(policy, on_checkpoint_input) -> loss``: one forward pass of the model
            with ``policy`` (a :class:`torchref.policies.SelectiveCheckpoint`) and the recorder's
            boundary hook; the caller seeds the RNG inside it if the forward draws randomness.
        step: a zero-argument callable running one step (the caller warms it up first, so that
            gradients and optimizer state are already allocated).
        exclude: tensors the saved count leaves out (parameters and buffers of ``forward``'s model).
        tracked: the model(s) and optimizer(s) ``step`` uses (MemTracker's categories; a CUDA
            model selects the device counters).
        policy: the plan's policy (None keeps nothing).
        counter: the CPU peak counter, one of :data:`COUNTERS` (see module docstring).
        fixed: with ``"live_bytes"``: the tensors allocated before the step that the peak adds.

    Returns:
        :class:`parity.runners.result.Memory` (``residuals``: the recorder's records;
        ``saved_names``: activation names the policy cached; ``device_peak`` None: a CUDA peak
        is ``peak_bytes`` itself).

    Raises:
        ValueError: unknown ``counter``.
        RuntimeError: the peak counter reported nothing (never a silent 0).
    """
    if counter not in COUNTERS:
        raise ValueError(f"counter must be one of {COUNTERS}, got {counter!r}")
    saved, offloaded, records, names = _saved(forward, exclude, policy)
    peak, act, peak_source, act_source, breakdown = _peak(step, tracked, counter, fixed)
    return Memory(saved_bytes=saved, offloaded_bytes=offloaded, peak_bytes=peak, peak_activation_bytes=act,
                  saved_source=SAVED_SOURCE, peak_source=peak_source, peak_activation_source=act_source,
                  peak_breakdown=breakdown, residuals=records, saved_names=names)
