"""What one transformer block keeps for its backward pass, tensor by tensor, in PyTorch.

The counterpart of :mod:`jaxremat.block_memory`: one :class:`torchref.model.Block` run on a
``(B, T, D)`` input that requires grad, either plainly (autograd's saved tensors, via
:class:`torchref.memory.SavedActivationRecorder`, labelled with the activation region of the op
that saved them) or under a selective checkpoint (the op outputs the policy caches, via
:class:`torchref.policies.SelectiveCheckpoint`). Parameters, buffers and the block input are
not activations and are left out.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from jaxremat.models.config import TransformerConfig
from jaxremat.spec.policies import Policy

from .memory import SavedActivationRecorder
from .model import Block, torch_dtype
from .policies import SelectiveCheckpoint


def block_saved(cfg: TransformerConfig, batch: int, seq: int, policy: "Policy | str | None" = None,
                *, seed: int = 0) -> list[dict]:
    """Tensors one block keeps for its backward pass, without remat or under a selective checkpoint.

    Args:
        cfg: model configuration (dtype and sizes; dropout applies in training mode).
        batch: B; seq: T (<= ``cfg.max_seq_len``).
        policy: None for the block without remat; otherwise a policy for a checkpointed block.
        seed: seed of the random block parameters and input.

    Returns:
        One dict per kept tensor storage: ``name`` (activation region, or None), ``shapes``
        (list of shapes), ``dtype``, ``bytes``, ``kind`` (``"saved"`` by autograd,
        ``"kept"`` or ``"offloaded"`` by the selective checkpoint), ``op`` (ATen op for
        selective-checkpoint entries, else None).

    Raises:
        ValueError: unknown policy, a policy PyTorch cannot render, or bad sizes.
    """
    if batch < 1 or not 1 <= seq <= cfg.max_seq_len:
        raise ValueError(f"need batch >= 1 and 1 <= seq <= {cfg.max_seq_len}, got batch={batch}, seq={seq}")
    torch.manual_seed(seed)
    block = Block(cfg)
    x = torch.randn(batch, seq, cfg.d_model, dtype=torch_dtype(cfg), requires_grad=True)
    recorder = SavedActivationRecorder(exclude=[*block.parameters(), *block.buffers(), x])
    sac = SelectiveCheckpoint(policy) if policy is not None else None
    with recorder:
        if sac is None or not sac.checkpoints:
            out = block(x)
        elif sac.selective:
            out = checkpoint(block, x, use_reentrant=False, preserve_rng_state=True, context_fn=sac.context_fn)
        else:
            out = checkpoint(block, x, use_reentrant=False, preserve_rng_state=True)
    rows = [{"name": r["region"], "shapes": [r["shape"]], "dtype": r["dtype"], "bytes": r["bytes"],
             "kind": "saved", "op": None} for r in recorder.records if r["source"] == "saved"]
    if sac is not None:
        rows += [{"name": r.name, "shapes": r.shapes, "dtype": r.dtype, "bytes": r.bytes,
                  "kind": "offloaded" if r.offloaded else "kept", "op": r.op} for r in sac.records]
    out.sum().backward()  # the step completes: nothing is left half-run
    return rows
