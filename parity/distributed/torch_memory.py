"""Per-rank memory of one distributed PyTorch training step, measured, beside its prediction.

On CPU the real trackers of ``torch.distributed._tools`` are used (both handle ``DTensor``
parameters on CPU, measured with torch 2.13):

* FSDP2: ``FSDPMemTracker(module, optimizer)``, whose categories tell the rank's shards
  (``SHARDED_PARAM``, ``SHARDED_GRAD``, ``OPT``) from the gathered blocks (``UNSHARDED_PARAM``,
  ``ALL_GATHER``, ``REDUCE_SCATTER``, ``UNSHARDED_GRAD``) and the activations (``ACT``, ``TEMP``);
* DDP: ``MemTracker`` with the module and optimizer tracked. DDP's reducer allocates its gradient
  buckets when DDP is built, before the tracker opens, and (``gradient_as_bucket_view=True``)
  the gradients are views of them, so the tracker sees no ``GRAD`` bytes while the buckets are
  resident the whole step: the peak adds the rank's gradient bytes less the ``GRAD`` the tracker
  counted at its peak.

On a CUDA rank: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.

``activation_bytes`` is the peak less the parameters, gradients and optimizer state resident at
the peak (for FSDP2 it therefore includes the gathered blocks and collective buffers, which the
source string lists apart). :func:`predict` sets it beside the single-device activations over the
ranks (plus FSDP2's gathered state); docs/sharding-torch.md has the measured ratios.
"""

from __future__ import annotations

# Deferred imports: torch.distributed._tools loads only when a CPU peak is measured.

from typing import Callable, Mapping, Optional

import torch

from torchref.distributed import is_fully_sharded, local_state_bytes
from torchref.memory import peak_step_bytes

from parity.distributed.result import DeviceMemory

SINGLE_NOT_ACTIVATION = ("PARAM", "BUFFER", "GRAD", "OPT")
FSDP_RESIDENT = ("SHARDED_PARAM", "BUFFER", "SHARDED_GRAD", "OPT")
FSDP_GATHERED = ("UNSHARDED_PARAM", "ALL_GATHER", "REDUCE_SCATTER", "UNSHARDED_GRAD")


def single_activation_bytes(step: Callable[[], None], model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Peak activation bytes of one single-process step (MemTracker less PARAM, BUFFER, GRAD, OPT).

    ``step`` must be warmed up (optimizer state allocated). Raises RuntimeError on a zero peak.
    """
    peak = peak_step_bytes(step, model, opt)
    if "step_increase" in peak.breakdown:
        return int(peak.breakdown["step_increase"])
    return int(peak.peak_bytes) - sum(int(v) for k, v in peak.breakdown.items() if k in SINGLE_NOT_ACTIVATION)


def _categories(tracker) -> dict[str, int]:
    snap = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
    return {getattr(k, "name", str(k)): int(v) for k, v in snap.items()}


def rank_memory(step: Callable[[], None], module: torch.nn.Module, opt: torch.optim.Optimizer, *,
                rank: int, predicted: Mapping[str, int], on_cuda: bool = False) -> DeviceMemory:
    """Measure one warmed-up ``step()`` of ``module`` (FSDP2 or DDP) on this rank.

    Args:
        step: zero_grad / forward / backward / optimizer step, already run once.
        module: the FSDP2 :class:`torchref.distributed.PlanLoss` or the DDP wrapper around one.
        opt: its optimizer.
        rank: this rank (named in ``source``).
        predicted: the prediction (:class:`parity.distributed.result.DeviceMemory`'s keys).
        on_cuda: measure with the CUDA counters.

    Raises:
        RuntimeError: a tracker reported a zero peak.
    """
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = int(torch.cuda.max_memory_allocated())
        held = local_state_bytes(module, opt)
        act = peak - sum(held.values())
        return DeviceMemory(**held, activation_bytes=act, peak_bytes=peak,
                            source=f"torch.cuda.max_memory_allocated rank {rank}", predicted=dict(predicted))
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    if is_fully_sharded(module):
        tracker = FSDPMemTracker(module, opt)
    else:
        tracker = MemTracker()
        tracker.track_external(module, opt)
    with tracker:
        step()
    cats = _categories(tracker)
    held = local_state_bytes(module, opt)
    total = cats.get("Total", 0)
    if total <= 0:
        raise RuntimeError(f"the memory tracker reported a peak of {total} bytes on rank {rank}; refusing 0")
    if is_fully_sharded(module):
        resident = sum(cats.get(k, 0) for k in FSDP_RESIDENT)
        gathered = sum(cats.get(k, 0) for k in FSDP_GATHERED)
        source = (f"torch FSDPMemTracker rank {rank} (cpu); activations = peak less {', '.join(FSDP_RESIDENT)}, "
                  f"of which {gathered} bytes gathered blocks and collective buffers ({', '.join(FSDP_GATHERED)})")
    else:
        buckets = held["grads_bytes"] - cats.get("GRAD", 0)
        total += buckets
        resident = sum(cats.get(k, 0) for k in SINGLE_NOT_ACTIVATION) + buckets
        source = (f"torch MemTracker rank {rank} (cpu) + {buckets} bytes of DDP gradient buckets (allocated at "
                  f"construction, unseen by the tracker); activations = peak less PARAM, BUFFER, GRAD, OPT")
    return DeviceMemory(**held, activation_bytes=int(total - resident), peak_bytes=int(total), source=source,
                        predicted=dict(predicted))


FSDP_GATHERED_LAYERS = 3
"""Whole blocks of FSDP2's gathered state in the per-rank activation prediction: the block being run
(``UNSHARDED_PARAM``), the next one's all-gather output (``ALL_GATHER``, prefetched) and one block's
gradient on its way through the reduce-scatter (``REDUCE_SCATTER``). Measured at the peak of each plan
(``FSDPMemTracker``, gpt-small, 2 gloo ranks; docs/sharding-torch.md): 2 blocks under ``none`` and
``sqrt`` (the peak is at the end of the forward pass, no gradient yet), 3 under ``full``,
``every_k(2)`` and ``every_k(2)+save_qkv_proj`` (the peak is in the backward pass)."""


def predict(single_param_bytes: int, single_act_bytes: Optional[int], world_size: int, layout: str,
            opt_factor: int = 2, *, layer_bytes: int = 0, root_bytes: int = 0) -> dict[str, int]:
    """The per-rank prediction: shards of ``1/W`` when fully sharded, activations ``/W`` in both layouts.

    Fully sharded, the activations also hold FSDP2's gathered state: the root module's parameters
    whole (``wte``, ``wpe``, ``ln_f``: FSDP2 keeps the root unsharded between its forward and
    backward) and :data:`FSDP_GATHERED_LAYERS` whole blocks.

    Args:
        single_param_bytes: bytes of all parameters on one device.
        single_act_bytes: single-device peak activation bytes of the full batch (None: not predicted).
        world_size: ranks W.
        layout: ``"data_parallel"`` (parameters, gradients and AdamW's two moments whole on every
            rank) or ``"fully_sharded"`` (each of them ``/W``).
        opt_factor: optimizer-state tensors per parameter (AdamW: 2; its 0-d ``step`` is left out).
        layer_bytes: bytes of one block's parameters, whole (fully sharded only).
        root_bytes: bytes of the parameters outside the blocks, whole (fully sharded only).
    """
    share = world_size if layout == "fully_sharded" else 1
    out = {"params_bytes": single_param_bytes // share, "grads_bytes": single_param_bytes // share,
           "opt_state_bytes": opt_factor * single_param_bytes // share}
    if single_act_bytes is not None:
        gathered = root_bytes + FSDP_GATHERED_LAYERS * layer_bytes if layout == "fully_sharded" else 0
        out["activation_bytes"] = single_act_bytes // world_size + gathered
    return out
