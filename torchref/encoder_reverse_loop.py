"""The hand-rolled reverse segment loop of :mod:`torchref.reverse_loop`, for the BERT encoder.

The same algorithm (Chen et al. 2016, arXiv:1604.06174, Algorithm 1), no ``torch.utils.checkpoint``:
the embedding runs with grad; each checkpointed segment runs under ``torch.no_grad()`` keeping its
input boundary and the CPU RNG state; a segment that is not checkpointed keeps its graph; pooling
and the contrastive loss run from the detached last boundary; then the segments are walked in
reverse, each checkpointed one recomputed under its saved RNG state, and the gradient of the
first boundary goes into the embedding. Every parameter is used once, so the gradients can equal
the library schedule's byte for byte (``tests/torchref/test_encoder.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from jaxremat.spec import Schedule

from .encoder import Encoder, contrastive_loss, mean_pool
from .reverse_loop import backward_segments, forward_segments


def reverse_segment_loop(model: Encoder, tokens: torch.Tensor, schedule: Schedule) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """Loss and gradients of :func:`torchref.encoder.encoder_loss` by the explicit reverse loop.

    Existing ``.grad`` values are cleared first.

    Args:
        model: the encoder (its training flag decides whether dropout is active).
        tokens: ``(B, T)`` padded pairs.
        schedule: remat schedule.

    Returns:
        ``(loss, grads)``: the detached 0-d loss and canonical numpy gradients.
    """
    model.zero_grad(set_to_none=True)
    mask = model.padding_mask(tokens)
    blocks = model.bound_blocks(mask)
    segs = schedule.segments_for(len(blocks))

    x0 = model.embed(tokens)
    boundary, saved = forward_segments(blocks, segs, x0)
    last = boundary.requires_grad_()
    loss = contrastive_loss(mean_pool(last, mask))
    loss.backward()
    x0.backward(backward_segments(blocks, segs, saved, last.grad))
    return loss.detach(), model.to_params(grads=True)
