"""A hand-rolled reverse segment loop: segment remat written out with ``jax.vjp``, no ``checkpoint``.

An independent reference for :func:`jaxremat.render.remat_scan`. It runs the algorithm of Chen
et al. 2016 (arXiv:1604.06174, Algorithm 1) by hand:

1. forward: embed (``jax.vjp``, keeping its pullback); then for each segment in order, keep the
   segment input (its *boundary*) and run the segment -- a plain forward without ``jax.vjp`` for a
   checkpointed segment (nothing inside it is kept), ``jax.vjp`` for one that is not (everything
   kept, as without remat);
2. head: ``loss, pullback = jax.vjp(head + cross-entropy, last boundary, ...)``, seeded with 1;
3. backward: for segments in reverse, ``out, vjp = jax.vjp(segment_fn, seg_params, boundary)``
   (this re-runs the segment: the recompute), ``g_params, g_in = vjp(g_out)``;
4. finally the embedding's pullback; ``wte`` sums its two cotangents (tied head and embedding).

Inside a segment the layers are a Python loop over per-layer parameter dicts (no ``lax.scan``),
and per-layer gradients are stacked with ``jnp.stack`` and segments joined with
``jnp.concatenate`` -- a different program from the renderer's nested scans, computing the same
operations on the same values. Op by op (``jax.disable_jit()``) its gradients equal the
renderer's bit for bit. Under ``jax.jit`` XLA compiles it as one unrolled program and fuses it
differently: measured bitwise equal at the default config (N=8, D=64, T=64, B=4) for ``full``,
``every_k(2)``, ``sqrt``, ``segments(4)``, but at tiny shapes (N=5, D=16, T=8, B=2) the bias
gradients (reductions over B and T) differed by up to ~100 ULP (~3e-7 relative). XLA may also
merge a segment's forward with its recompute by common-subexpression elimination (values
unchanged, memory not representative): use it as a value reference only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .model import block_forward, block_params_of, cross_entropy, embed, head, layer_dropout_keys
from .models.config import TransformerConfig
from .models.block import BLOCK_PARAM_NAMES
from .spec.schedules import Schedule

__all__ = ["backward_segments", "forward_segments", "reverse_loop_value_and_grad"]


def _layers(blocks: dict, start: int, stop: int) -> list[dict]:
    """Per-layer parameter dicts (no layer axis) for layers ``[start, stop)``."""
    return [{name: blocks[name][i] for name in BLOCK_PARAM_NAMES} for i in range(start, stop)]


def forward_segments(segment_fn, blocks: dict, segments, x):
    """Step 1 of the loop: for each segment keep its input (boundary) and run it -- plainly when it is
    checkpointed (nothing inside kept), under ``jax.vjp`` when it is not (everything kept).

    Args:
        segment_fn: ``start -> (layers, x) -> x``, the blocks of a segment starting at layer ``start``.
        blocks: the stacked block parameters (:func:`jaxremat.model.block_params_of`).
        segments: the schedule's segments at this depth.
        x: the stack's input.

    Returns:
        ``(x, boundaries, pullbacks)``: the stack's output, each segment's input, and the pullbacks of
        the segments that are not checkpointed (by segment index).
    """
    boundaries, pullbacks = [], {}
    for i, seg in enumerate(segments):
        boundaries.append(x)
        layers = _layers(blocks, seg.start, seg.stop)
        if seg.checkpointed:
            x = segment_fn(seg.start)(layers, x)
        else:
            x, pullbacks[i] = jax.vjp(segment_fn(seg.start), layers, x)
    return x, boundaries, pullbacks


def backward_segments(segment_fn, blocks: dict, segments, boundaries, pullbacks, g_x, n_layer: int):
    """Step 3 of the loop: the segments in reverse, each checkpointed one recomputed from its boundary by
    ``jax.vjp`` (the recompute), then pulled back.

    Returns:
        ``(g_x, layer_grads)``: the cotangent of the stack's input and the block gradients stacked on a
        leading layer axis, one array per name of :data:`jaxremat.models.block.BLOCK_PARAM_NAMES`.
    """
    layer_grads: list[dict] = [None] * n_layer
    for i in reversed(range(len(segments))):
        seg = segments[i]
        pullback = pullbacks.get(i)
        if pullback is None:
            _, pullback = jax.vjp(segment_fn(seg.start), _layers(blocks, seg.start, seg.stop), boundaries[i])
        g_layers, g_x = pullback(g_x)
        layer_grads[seg.start:seg.stop] = g_layers
    return g_x, {name: jnp.stack([g[name] for g in layer_grads]) for name in BLOCK_PARAM_NAMES}


def reverse_loop_value_and_grad(
    params: dict, tokens: jax.Array, cfg: TransformerConfig, schedule: Schedule, dropout_key=None
) -> tuple[jax.Array, dict]:
    """Loss and gradients of :func:`jaxremat.model.loss_fn` by an explicit reverse segment loop.

    Args:
        params: canonical dict of arrays in ``cfg.dtype``.
        tokens: (B, T+1) int32 token ids.
        cfg: model configuration.
        schedule: remat schedule; its segments set the boundaries kept and the recompute.
        dropout_key: optional PRNG key, split exactly as :func:`jaxremat.model.forward` does.

    Returns:
        ``(loss, grads)``: 0-d loss and a canonical dict of gradients (same shapes/dtypes as
        ``params``).

    Source: Chen et al. 2016, arXiv:1604.06174; ``jax.vjp``.
    """
    n_layer = cfg.n_layer
    idx, targets = tokens[:, :-1], tokens[:, 1:]
    embed_key, layer_keys = layer_dropout_keys(dropout_key, n_layer)
    blocks = block_params_of(params)

    def embed_fn(wte, wpe):
        return embed({"wte": wte, "wpe": wpe}, idx, cfg, dropout_key=embed_key)

    def segment_fn(start):
        def run(layers, x):
            for j, layer in enumerate(layers):
                key = None if layer_keys is None else layer_keys[start + j]
                x = block_forward(layer, x, cfg, dropout_key=key)
            return x
        return run

    def head_loss(x, wte, ln_w, ln_b):
        logits = head({"wte": wte, "ln_f.weight": ln_w, "ln_f.bias": ln_b}, x, cfg)
        return cross_entropy(logits, targets)

    # 1. forward, keeping boundaries (and full pullbacks only for segments not checkpointed)
    x, embed_vjp = jax.vjp(embed_fn, params["wte"], params["wpe"])
    segments = schedule.segments_for(n_layer)
    x, boundaries, pullbacks = forward_segments(segment_fn, blocks, segments, x)

    # 2. head and loss
    loss, head_vjp = jax.vjp(head_loss, x, params["wte"], params["ln_f.weight"], params["ln_f.bias"])
    g_x, g_wte_head, g_ln_w, g_ln_b = head_vjp(jnp.ones_like(loss))

    # 3. segments in reverse: recompute (vjp from the boundary) then pull back
    g_x, block_grads = backward_segments(segment_fn, blocks, segments, boundaries, pullbacks, g_x, n_layer)

    # 4. embedding
    g_wte_embed, g_wpe = embed_vjp(g_x)
    grads = {"wte": g_wte_head + g_wte_embed, "wpe": g_wpe, **block_grads}
    grads["ln_f.weight"], grads["ln_f.bias"] = g_ln_w, g_ln_b
    return loss, {k: grads[k] for k in params}
