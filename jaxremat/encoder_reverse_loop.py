"""The hand-rolled reverse segment loop of :mod:`jaxremat.reverse_loop`, for the BERT encoder.

The same algorithm (Chen et al. 2016, arXiv:1604.06174, Algorithm 1) with ``jax.vjp`` and no
``checkpoint``: embed (pullback kept); per segment keep the boundary and run it plainly
(checkpointed) or under ``jax.vjp`` (not checkpointed); pool + contrastive loss under ``jax.vjp``;
then the segments in reverse, each checkpointed one recomputed from its boundary by ``jax.vjp``,
and finally the embedding's pullback. The padding mask is the same closure as in
:func:`jaxremat.encoder.encode`; dropout keys are split exactly as there. An independent value
reference for :func:`jaxremat.render.remat_scan` on the encoder (op by op it is bitwise equal).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .encoder import contrastive_loss, embed, encoder_block_forward, mean_pool, padding_mask
from .model import block_params_of, layer_dropout_keys
from .models.config import TransformerConfig
from .models.block import BLOCK_PARAM_NAMES
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

    def layers_of(start, stop):
        return [{name: blocks[name][i] for name in BLOCK_PARAM_NAMES} for i in range(start, stop)]

    x, embed_vjp = jax.vjp(embed_fn, *(params[n] for n in _EMBED_NAMES))
    segments = schedule.segments_for(cfg.n_layer)
    boundaries, pullbacks = [], {}
    for i, seg in enumerate(segments):
        boundaries.append(x)
        if seg.checkpointed:
            x = segment_fn(seg.start)(layers_of(seg.start, seg.stop), x)
        else:
            x, pullbacks[i] = jax.vjp(segment_fn(seg.start), layers_of(seg.start, seg.stop), x)

    loss, head_vjp = jax.vjp(lambda h: contrastive_loss(mean_pool(h, mask)), x)
    (g_x,) = head_vjp(jnp.ones_like(loss))

    layer_grads: list = [None] * cfg.n_layer
    for i in reversed(range(len(segments))):
        seg = segments[i]
        pullback = pullbacks.get(i)
        if pullback is None:
            _, pullback = jax.vjp(segment_fn(seg.start), layers_of(seg.start, seg.stop), boundaries[i])
        g_layers, g_x = pullback(g_x)
        layer_grads[seg.start:seg.stop] = g_layers

    grads = dict(zip(_EMBED_NAMES, embed_vjp(g_x)))
    for name in BLOCK_PARAM_NAMES:
        grads[name] = jnp.stack([g[name] for g in layer_grads])
    return loss, {k: grads[k] for k in params}
