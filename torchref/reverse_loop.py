"""A hand-rolled reverse segment loop: the remat algorithm written out, as an independent reference.

Instead of ``torch.utils.checkpoint``, this module performs the algorithm of Chen et al. 2016
(arXiv:1604.06174, Algorithm 1) by hand, segment by segment:

1. Forward. ``embed`` runs with grad (its graph is kept, as the library keeps it). Each
   checkpointed segment runs under ``torch.no_grad()`` and leaves only its input boundary and the
   CPU RNG state it started from; a segment that is not checkpointed runs with grad from its
   detached boundary and keeps its graph, as the library keeps it.
2. Head. ``ln_f`` + logits + loss run with grad from the detached last boundary; ``loss.backward()``
   fills the head's parameter gradients and the gradient of the last boundary.
3. Reverse walk. For each segment from the top: a checkpointed one is recomputed from
   ``boundary.detach().requires_grad_()`` under the saved RNG state (restored inside
   ``torch.random.fork_rng``, as ``preserve_rng_state=True`` does); then ``out.backward(grad_out)``
   and ``boundary.grad`` becomes the next ``grad_out``.
4. Embedding. The kept embedding graph receives the gradient of the first boundary.

Each parameter is used once per step except ``wte`` (embedding and tied head), which receives two
contributions whose float sum is commutative, so the gradients can match the library's byte for
byte; ``tests/torchref/test_reverse_loop.py`` checks that they do.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import numpy as np
import torch

from jaxremat.spec import Schedule

from .model import GPT, compute_context, lm_loss, split_tokens, torch_dtype
from .render import run_segment


Saved = list[tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]]


def forward_segments(blocks: list, segs, x0: torch.Tensor, precision: Callable = contextlib.nullcontext
                     ) -> tuple[torch.Tensor, Saved]:
    """Forward half of the loop: run ``blocks`` from ``x0`` (detached) segment by segment.

    A checkpointed segment runs under ``torch.no_grad()`` and keeps its input boundary and the CPU
    RNG state; a plain one keeps its graph. Returns the detached last boundary and, per segment,
    ``(start, rng_state or None, kept output or None)``. ``precision`` opens the forward's
    autocast context.
    """
    boundary = x0.detach()
    saved: Saved = []
    for seg in segs:
        run = run_segment(blocks[seg.start:seg.stop])
        if seg.checkpointed:
            rng_state = torch.get_rng_state()
            with torch.no_grad(), precision():
                out = run(boundary)
            saved.append((boundary, rng_state, None))
        else:
            start = boundary.requires_grad_()
            with precision():
                out = run(start)
            saved.append((start, None, out))
        boundary = out.detach()
    return boundary, saved


def backward_segments(blocks: list, segs, saved: Saved, grad_out: torch.Tensor,
                      precision: Callable = contextlib.nullcontext) -> torch.Tensor:
    """Reverse half: walk the segments backwards, recomputing each checkpointed one under its
    saved RNG state; returns the gradient of the first boundary."""
    for seg, (start, rng_state, kept_out) in zip(reversed(segs), reversed(saved)):
        if kept_out is None:
            start = start.detach().requires_grad_()
            with torch.random.fork_rng(devices=[]), torch.enable_grad(), precision():
                torch.set_rng_state(rng_state)
                kept_out = run_segment(blocks[seg.start:seg.stop])(start)
        kept_out.backward(grad_out)
        grad_out = start.grad
    return grad_out


def reverse_segment_loop(
    model: GPT, tokens: torch.Tensor, schedule: Schedule,
) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """Loss and gradients of one step computed by the explicit reverse segment loop.

    Existing ``.grad`` values are cleared first (``zero_grad(set_to_none=True)``); on return each
    parameter's ``.grad`` holds the gradient returned here.

    Args:
        model: the transformer (its training flag decides whether dropout is active).
        tokens: ``(B, T+1)`` integer token ids.
        schedule: remat schedule; its segments decide which boundaries the forward keeps.

    Returns:
        ``(loss, grads)``: the 0-d loss tensor (model dtype, detached) and the gradients as numpy
        arrays in the canonical layout of :func:`jaxremat.models.param_shapes`.

    Raises:
        ValueError: bad tokens or a schedule invalid for ``n_layer``.
    """
    model.zero_grad(set_to_none=True)
    inputs, targets = split_tokens(tokens)
    blocks = list(model.blocks)
    segs = schedule.segments_for(len(blocks))

    # 1. forward: keep boundaries (+ RNG state) of checkpointed segments, graphs of the others.
    precision = lambda: compute_context(model.cfg)  # noqa: E731 -- the forward's autocast state, every time
    with precision():
        x0 = model.embed(inputs)  # embedding graph kept, as in the library
    boundary, saved = forward_segments(blocks, segs, x0, precision)

    # 2. head from the last boundary.
    last = boundary.requires_grad_()
    with precision():
        logits = model.head(last)
    loss = lm_loss(logits.to(torch_dtype(model.cfg)), targets)
    loss.backward()
    grad_out = last.grad

    # 3. reverse walk over the segments.
    grad_out = backward_segments(blocks, segs, saved, grad_out, precision)

    # 4. into the embedding.
    x0.backward(grad_out)
    return loss.detach(), model.to_params(grads=True)
