"""The hand-rolled reverse segment loop of :mod:`jaxremat.reverse_loop`, for the BERT encoder.

The same algorithm (Chen et al. 2016, arXiv:1604.06174, Algorithm 1) with ``jax.vjp`` and no
``checkpoint``, and the same segment loop (:func:`jaxremat.reverse_loop.forward_segments`,
:func:`jaxremat.reverse_loop.backward_segments`): embed (pullback kept); per segment keep the
boundary and run it plainly (checkpointed) or under ``jax.vjp`` (not checkpointed); pool +
contrastive loss under ``jax.vjp``; then the segments in reverse, each checkpointed one recomputed
from its boundary by ``jax.vjp``, and finally the embedding's pullback. The padding mask is the same closure as in
:func:`jaxremat.encoder.encode`; dropout keys are split exactly as there. An independent value
reference for :func:`jaxremat.render.remat_scan` on the encoder (op by op it is bitwise equal).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .encoder import contrastive_loss, embed, encoder_block_forward, mean_pool, padding_mask
from .model import block_params_of, layer_dropout_keys
from .models.config import TransformerConfig
from .reverse_loop import backward_segments, forward_segments
from .spec.schedules import Schedule

__all__ = ["reverse_loop_value_and_grad"]

_EMBED_NAMES = ("wte", "wpe", "wtt", "ln_e.weight", "ln_e.bias")


def reverse_loop_value_and_grad(
    params: dict, tokens: jax.Array, cfg: TransformerConfig, schedule: Schedule, dropout_key=None
) -> tuple[jax.Array, dict]:
    """Loss and gradients of :func:`jaxremat.encoder.loss_fn` by an explicit reverse segment loop.

    Args:
        params: canonical encoder dict in ``cfg.dtype``.
        tokens: (B, T) int32 padded pairs (see :func:`jaxremat.encoder.loss_fn`).
        cfg: configuration with ``arch="bert"``.
        schedule: remat schedule; its segments set the boundaries kept and the recompute.
        dropout_key: optional PRNG key.

    Returns:
        ``(loss, grads)``: 0-d loss and a canonical dict of gradients.
    """
    mask = padding_mask(tokens, cfg)
    embed_key, layer_keys = layer_dropout_keys(dropout_key, cfg.n_layer)
    blocks = block_params_of(params)

    def embed_fn(*weights):
        return embed(dict(zip(_EMBED_NAMES, weights)), tokens, cfg, dropout_key=embed_key)

    def segment_fn(start):
        def run(layers, x):
            for j, layer in enumerate(layers):
                key = None if layer_keys is None else layer_keys[start + j]
                x = encoder_block_forward(layer, x, mask, cfg, dropout_key=key)
            return x
        return run

    x, embed_vjp = jax.vjp(embed_fn, *(params[n] for n in _EMBED_NAMES))
    segments = schedule.segments_for(cfg.n_layer)
    x, boundaries, pullbacks = forward_segments(segment_fn, blocks, segments, x)

    loss, head_vjp = jax.vjp(lambda h: contrastive_loss(mean_pool(h, mask)), x)
    (g_x,) = head_vjp(jnp.ones_like(loss))

    g_x, block_grads = backward_segments(segment_fn, blocks, segments, boundaries, pullbacks, g_x, cfg.n_layer)
    grads = {**dict(zip(_EMBED_NAMES, embed_vjp(g_x))), **block_grads}
    return loss, {k: grads[k] for k in params}
