"""Remat plans under PyTorch's own data-parallel engines: FSDP2 (``fully_shard``) and DDP.

The model code stays single-device (:class:`torchref.model.GPT`); distribution is applied from
outside, as torchtitan applies it, and the remat plan is rendered by the same
:func:`torchref.render.model_loss` (``torch.utils.checkpoint`` non-reentrant,
``checkpoint_sequential`` for segments, selective-checkpoint contexts for policies):

* :class:`PlanLoss` wraps a model so that ``module(tokens, plan)`` is the loss under a plan. The
  wrapper's ``forward`` is what the engines hook: FSDP2's root all-gather and DDP's reducer both
  run from the forward of the module they wrap, and :func:`torchref.render.model_loss` calls
  ``embed`` / the blocks / ``head``, never ``GPT.forward``.
* :func:`fully_shard_model`: ``torch.distributed.fsdp.fully_shard`` on every block (one
  all-gather / reduce-scatter group per block) and on the :class:`PlanLoss` root (``wte``,
  ``wpe``, ``ln_f``). Parameters become ``DTensor`` s sharded on dim 0 (``Shard(0)``): rank ``r``
  holds rows ``[r*ceil(n/W), (r+1)*ceil(n/W))``.
* :func:`replicate_model`: ``torch.nn.parallel.DistributedDataParallel`` around the
  :class:`PlanLoss` (every rank holds every parameter; gradients all-reduced and averaged).
* :func:`full_params` gathers canonical parameters or gradients on every rank
  (``DTensor.full_tensor()`` for sharded ones), :func:`local_state_bytes` counts what one rank holds.

How FSDP2's hooks meet checkpoint's recompute (torch 2.13 ``_fsdp_state.py``; docs/sharding-torch.md):
``fully_shard`` registers a forward pre-hook (all-gather the block's parameters), a forward hook
(free them again, ``reshard_after_forward=True`` for non-root modules) and, on the block's
outputs, a pre-backward hook (all-gather again before the block's backward). Under non-reentrant
checkpoint the block's backward first runs that pre-backward all-gather, then unpacks a saved
tensor, which recomputes the segment by calling the blocks again. A block in
``TrainingState.PRE_BACKWARD`` skips its forward hooks during the recompute (``_pre_forward``
only gathers again if the parameters were freed), so the recompute runs on the parameters the
backward gathered. Measured (``FSDPParamGroup.unshard`` counted per block, gpt-tiny, 2 gloo
ranks): every block is all-gathered once in the forward and once in the backward pass under
``none``, ``full``, ``sqrt``, ``every_k(2)`` and ``nested`` alike -- remat adds recompute, not
communication. The recomputed values are the same bits (an all-gather copies shards, no
arithmetic), and every plan is bitwise against ``none`` on the same mesh.

Example (two ``gloo`` ranks on one machine; :mod:`parity.distributed.torch_worker` starts them)::

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torchref import GPT
    from torchref.distributed import PlanLoss, fully_shard_model, full_params

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29512", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    module = fully_shard_model(PlanLoss(GPT.from_params(cfg, params)), mesh)
    loss = module(tokens[rank::2], "sqrt+save_dots")     # this rank's shard of the batch
    loss.backward()                                      # grads: the mean over both shards
    grads = full_params(module, grads=True)              # canonical names, on every rank

Sources: PyTorch ``torch.distributed.fsdp.fully_shard`` (FSDP2) and
``torch.nn.parallel.DistributedDataParallel`` docs; Zhao et al. 2023, "PyTorch FSDP"
(arXiv:2304.11277); Rajbhandari et al. 2020, ZeRO (arXiv:1910.02054).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from .model import GPT
from .render import model_loss

LAYOUTS = ("data_parallel", "fully_sharded")
"""The layouts this module builds: DDP replication and FSDP2 full sharding."""


class PlanLoss(nn.Module):
    """``module(tokens, plan) -> loss``: a GPT's loss under a remat plan, as a module's forward.

    Args:
        model: the GPT (any model :func:`torchref.render.model_loss` accepts); kept as
            ``self.model`` so parameter names read ``model.blocks.0.attn.c_attn.weight``.
    """

    def __init__(self, model: GPT):
        super().__init__()
        if not isinstance(model, GPT):
            raise TypeError(f"PlanLoss wraps a torchref.model.GPT, got {type(model).__name__}")
        self.model = model

    def forward(self, tokens: torch.Tensor, plan: Any = "none", policy: Any = None) -> torch.Tensor:
        """Mean next-token cross-entropy (0-d) of ``tokens`` ``(B, T+1)`` int64 under ``plan``.

        ``plan`` is a schedule, a schedule name or ``"SCHEDULE+POLICY"``; ``policy`` as in
        :func:`torchref.render.forward_blocks`. Raises what :func:`torchref.render.model_loss` raises.
        """
        return model_loss(self.model, tokens, plan, policy=policy)


def _check_world(mesh: Optional[DeviceMesh]) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("no default process group: call torch.distributed.init_process_group first "
                           "(parity.distributed.torch_worker starts the ranks)")
    if mesh is not None and mesh.ndim != 1:
        raise ValueError(f"a 1-D data-parallel mesh is expected, got a {mesh.ndim}-D mesh {mesh}")


def fully_shard_model(module: PlanLoss, mesh: Optional[DeviceMesh] = None, *,
                      reshard_after_forward: bool = True) -> PlanLoss:
    """Apply FSDP2 to every block of ``module.model`` and to ``module`` itself (the root), in place.

    Args:
        module: the wrapped model; its parameters must lie on the mesh's device type.
        mesh: a 1-D ``DeviceMesh`` over the data-parallel ranks (None: every rank of the default
            process group, ``init_device_mesh`` on the parameters' device type).
        reshard_after_forward: free each block's gathered parameters after its forward and gather
            them again in the backward pass (ZeRO-3; the root keeps its own, FSDP2's default).

    Returns:
        ``module``, now also an ``FSDPModule``: parameters are ``DTensor`` s (``Shard(0)``),
        gradients after ``backward`` are sharded the same way and averaged over the ranks.

    Raises:
        RuntimeError: no process group is initialised.
        ValueError: ``mesh`` is not 1-D.
        TypeError: ``module`` is not a :class:`PlanLoss`.
    """
    if not isinstance(module, PlanLoss):
        raise TypeError(f"fully_shard_model takes a PlanLoss, got {type(module).__name__}")
    _check_world(mesh)
    for block in module.model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(module, mesh=mesh)
    return module


def replicate_model(module: PlanLoss) -> DistributedDataParallel:
    """``DistributedDataParallel(module)``: every rank holds every parameter; gradients averaged.

    DDP's reducer all-reduces each gradient bucket (sum, then divided by the world size) as the
    backward pass produces it; non-reentrant checkpoint is supported (DDP docs: reentrant
    checkpoint needs ``static_graph``). ``broadcast_buffers=False``: the GPT's only buffer is the
    constant causal mask.

    Raises:
        RuntimeError: no process group is initialised.
        TypeError: ``module`` is not a :class:`PlanLoss`.
    """
    if not isinstance(module, PlanLoss):
        raise TypeError(f"replicate_model takes a PlanLoss, got {type(module).__name__}")
    _check_world(None)
    return DistributedDataParallel(module, forward_sync_buffers=False, gradient_as_bucket_view=True)


def unwrap(module: nn.Module) -> PlanLoss:
    """The :class:`PlanLoss` inside a DDP wrapper, or ``module`` itself (FSDP2 works in place)."""
    inner = module.module if isinstance(module, DistributedDataParallel) else module
    if not isinstance(inner, PlanLoss):
        raise TypeError(f"expected a PlanLoss (or DDP around one), got {type(inner).__name__}")
    return inner


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: ``full_tensor()`` of a DTensor (a collective: every rank must call it)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_params(module: nn.Module, *, grads: bool = False) -> dict[str, np.ndarray]:
    """Canonical parameters (or gradients) of a distributed :class:`PlanLoss`, whole, on every rank.

    Sharded tensors are gathered with ``DTensor.full_tensor()`` in a fixed order, so every rank
    must call this together. The layout is :meth:`torchref.model.GPT.to_params`'s (per-block
    tensors stacked on a leading layer axis, matrices ``(in, out)``, ``cfg.dtype``).

    Raises:
        ValueError: ``grads=True`` and a parameter has no gradient (run a backward pass first).
    """
    model = unwrap(module).model
    plain = GPT(model.cfg)
    with torch.no_grad():
        for (name, p), q in zip(model.named_parameters(), plain.parameters()):
            if grads:
                if p.grad is None:
                    raise ValueError(f"parameter {name!r} has no gradient; run a backward pass first")
                q.grad = _full(p.grad).detach().cpu().clone()
            else:
                q.copy_(_full(p.detach()).cpu())
    return plain.to_params(grads=grads)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors)


def local_state_bytes(module: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state (local shards only).

    Returns:
        ``{"params_bytes", "grads_bytes", "opt_state_bytes"}`` (ints, bytes): the sum of
        ``numel * element_size`` of each parameter's local tensor (``DTensor.to_local()`` for
        sharded ones, padding excluded), of each existing ``.grad``, and of each tensor in the
        optimizer's state (AdamW: ``exp_avg``, ``exp_avg_sq`` and the 0-d ``step``).
    """
    params = list(unwrap(module).parameters())
    opt = []
    if optimizer is not None:
        for state in optimizer.state.values():
            opt.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return {"params_bytes": _nbytes(params), "grads_bytes": _nbytes(p.grad for p in params if p.grad is not None),
            "opt_state_bytes": _nbytes(opt)}


def is_fully_sharded(module: nn.Module) -> bool:
    """True when ``module`` is an FSDP2 module (``fully_shard`` applied)."""
    return isinstance(module, FSDPModule)
