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
from .render import _run_segment


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
    boundary = x0.detach()
    saved = []
    for seg in segs:
        run = _run_segment(blocks[seg.start:seg.stop])
        if seg.checkpointed:
            rng_state = torch.get_rng_state()
            with torch.no_grad():
                out = run(boundary)
            saved.append((boundary, rng_state, None))
        else:
            start = boundary.requires_grad_()
            out = run(start)
            saved.append((start, None, out))
        boundary = out.detach()

    last = boundary.requires_grad_()
    loss = contrastive_loss(mean_pool(last, mask))
    loss.backward()
    grad_out = last.grad

    for seg, (start, rng_state, kept_out) in zip(reversed(segs), reversed(saved)):
        if kept_out is None:
            start = start.detach().requires_grad_()
            with torch.random.fork_rng(devices=[]), torch.enable_grad():
                torch.set_rng_state(rng_state)
                kept_out = _run_segment(blocks[seg.start:seg.stop])(start)
        kept_out.backward(grad_out)
        grad_out = start.grad

    x0.backward(grad_out)
    return loss.detach(), model.to_params(grads=True)
