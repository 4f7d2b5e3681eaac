"""Activation and peak memory of PyTorch training steps, measured (never assumed).

Two measurements:

- :class:`SavedActivationRecorder` lists what the forward pass keeps for the backward pass (the
  residuals), via ``torch.autograd.graph.saved_tensors_hooks``; the torch counterpart of
  ``jax.ad_checkpoint.print_saved_residuals``.
- :func:`peak_step_bytes` measures the peak bytes of one training step: on CUDA with
  ``torch.cuda.max_memory_allocated``; on CPU (where that call would silently return 0) with
  ``torch.distributed._tools.mem_tracker.MemTracker``.
"""

from __future__ import annotations

# Deferred imports: torch.distributed's memory tracker loads only when a peak is measured on CPU.

import dataclasses
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import is_fake

from .names import current_name


class SavedActivationRecorder(torch.autograd.graph.saved_tensors_hooks):
    """Record every tensor saved for backward while the context is open, once per storage.

    Use as a context around a forward pass; pass :meth:`record_boundary` as ``on_checkpoint_input``
    to :func:`torchref.render.forward_blocks` / :func:`torchref.render.model_loss`. Tensors are
    keyed by ``untyped_storage().data_ptr()``: views of one storage (``q``, ``k``, ``v`` split from
    ``qkv``, transposes, reshapes) count once, with the whole storage's ``nbytes()``, since that is
    what stays allocated. Storages of the excluded tensors (parameters, buffers such as the causal
    mask) are never counted.

    What reaches this hook under non-reentrant checkpoint (measured with torch 2.13, asserted in
    ``tests/torchref/test_memory.py``): saved-tensor hooks form a stack and only the innermost one
    packs a tensor. Inside a ``checkpoint(..., use_reentrant=False)`` region the innermost hook is
    checkpoint's own, which swaps each saved tensor for a recompute holder, so *no tensor saved
    inside a checkpointed segment reaches this outer hook*. The segment's input does reach it:
    checkpoint keeps its inputs alive through ``_NoopSaveInputs.save_for_backward``, which runs
    before checkpoint's hook is pushed. :meth:`record_boundary` records the same input explicitly;
    the storage key makes the two count once, labelled ``"checkpoint_input"`` whichever comes first
    (``checkpoint_sequential`` reports it from inside the segment, after the save), so the total
    does not depend on that torch internal.

    Args:
        exclude: tensors whose storages are not activations (``model.parameters()``, ``model.buffers()``).

    Attributes:
        records: one dict per counted storage: ``shape`` (tuple of int) and ``dtype`` (str, e.g.
            ``"float32"``) of the first tensor seen on that storage, ``bytes`` (int, the storage's
            size), ``source`` (``"saved"`` or ``"checkpoint_input"``), ``region`` (the activation
            region, :func:`torchref.names.current_name`, of the op that saved it, or None).

    Storages are identified by address (fake and meta tensors, which have none, by their storage
    object, which PyTorch keeps one per storage), so open the recorder around a forward pass whose saved
    tensors all stay alive until it ends (as in any forward pass; keep the loss if you record more
    than one forward, or a freed address could be reused and a new storage skipped).
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._held: list = []  # storages of fake tensors keyed by id, held so that no id is reused
        self._excluded = {self._key(t) for t in exclude}
        self._index: dict[int, int] = {}  # storage key -> position in records
        self.records: list[dict[str, Any]] = []
        super().__init__(self._pack, self._unpack)

    def _key(self, t: torch.Tensor):
        """The storage's address; for a fake or meta tensor (no memory, address 0) the storage object's id."""
        storage = t.untyped_storage()
        if is_fake(t) or t.is_meta:
            self._held.append(storage)
            return ("storage", id(storage))
        return storage.data_ptr()

    def _record(self, t: torch.Tensor, source: str) -> None:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            return
        storage = t.untyped_storage()
        key = self._key(t)
        if key in self._excluded or storage.nbytes() == 0:
            return
        if key in self._index:
            if source == "checkpoint_input":  # a boundary first seen as saved keeps the boundary label
                self.records[self._index[key]]["source"] = source
            return
        self._index[key] = len(self.records)
        self.records.append({
            "shape": tuple(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "bytes": int(storage.nbytes()),
            "source": source,
            "region": current_name(),
        })

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._record(t, "saved")
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def record_boundary(self, t: torch.Tensor) -> None:
        """Record ``t`` as the input a checkpointed segment keeps alive (source ``"checkpoint_input"``)."""
        self._record(t, "checkpoint_input")

    @property
    def total_bytes(self) -> int:
        """Sum of ``bytes`` over :attr:`records`."""
        return sum(r["bytes"] for r in self.records)


@dataclasses.dataclass(frozen=True)
class PeakBytes:
    """Peak memory of one training step.

    Attributes:
        peak_bytes: peak bytes allocated during the step (> 0).
        breakdown: category -> bytes at the peak (MemTracker's ``PARAM``, ``BUFFER``, ``GRAD``,
            ``ACT``, ``TEMP``, ``OPT``, ``OTH`` on CPU; ``{"allocated_before": ..., "step_increase": ...}``
            on CUDA).
        source: the API that measured it: ``"torch MemTracker (cpu)"`` or
            ``"torch.cuda.max_memory_allocated"``.
    """

    peak_bytes: int
    breakdown: dict[str, int]
    source: str


def _on_cuda(tracked: Iterable[Any]) -> bool:
    for obj in tracked:
        if isinstance(obj, nn.Module):
            for p in obj.parameters():
                return p.is_cuda
    return False


def peak_step_bytes(step_fn: Callable[[], Any], *tracked: nn.Module | torch.optim.Optimizer) -> PeakBytes:
    """Run ``step_fn()`` once and measure its peak memory.

    If the tracked model lives on a CUDA device: ``torch.cuda.reset_peak_memory_stats()`` then
    ``torch.cuda.max_memory_allocated()`` (includes everything allocated on the device). Otherwise:
    ``torch.distributed._tools.mem_tracker.MemTracker`` with ``track_external(*tracked)``; the peak
    is ``get_tracker_snapshot("peak")[cpu]["Total"]``, which counts the tracked modules' parameters,
    buffers, gradients and optimizer states plus every tensor allocated during the step.

    Args:
        step_fn: one training step (e.g. zero_grad / loss / backward / optimizer step).
        *tracked: the model(s) and optimizer(s) the step uses, so that memory allocated before the
            step (parameters, optimizer state) is counted and categorised.

    Returns:
        :class:`PeakBytes`.

    Raises:
        RuntimeError: the tracker reports no memory (a silent 0 is never returned).
    """
    if _on_cuda(tracked):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step_fn()
        torch.cuda.synchronize()
        peak = int(torch.cuda.max_memory_allocated())
        breakdown = {"allocated_before": int(before), "step_increase": peak - int(before)}
        source = "torch.cuda.max_memory_allocated"
    else:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        if tracked:
            tracker.track_external(*tracked)
        with tracker:
            step_fn()
        snapshot = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
        peak = int(snapshot.get("Total", 0))
        breakdown = {getattr(k, "name", str(k)): int(v) for k, v in snapshot.items() if k != "Total"}
        source = "torch MemTracker (cpu)"
    if peak <= 0:
        raise RuntimeError(f"{source} reported a peak of {peak} bytes for the step; refusing to return 0")
    return PeakBytes(peak, breakdown, source)
