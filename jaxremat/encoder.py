"""A BERT-style post-LayerNorm encoder in JAX, single-device model code only.

The encoder variant of :mod:`jaxremat.model` (``TransformerConfig(arch="bert")``), written as pure
functions on the canonical parameter dict of :func:`jaxremat.models.bert.layout.encoder_param_shapes`.
Its blocks run through :func:`jaxremat.render.remat_scan`, exactly as the GPT blocks do, so every
schedule and policy applies unchanged: the padding mask reaches the blocks by closure, the per-layer
dropout keys as scanned ``xs`` (:func:`jaxremat.model.layer_dropout_keys`), so a recomputed block
redraws the mask of its first forward pass.

Block (Hugging Face ``BertLayer``): ``x = ln_1(x + dropout(attn(x)))`` then
``x = ln_2(x + dropout(mlp(x)))`` with the exact erf GELU and bidirectional attention whose padded
keys are masked with ``-inf``. Each block tags its activations with
``jax.ad_checkpoint.checkpoint_name`` using :data:`jaxremat.spec.names.ACTIVATION_NAMES`
(``attn_norm`` is ``ln_1``'s output, ``mlp_norm`` is ``ln_2``'s).

Objective (:func:`loss_fn`): the in-batch contrastive loss of sentence-embedding training
(``MultipleNegativesRankingLoss`` of sentence-transformers; Henderson et al. 2017,
arXiv:1705.00652): rows ``2i`` and ``2i+1`` of the batch are a positive pair; embeddings are the
mean of the last hidden state over real tokens, L2-normalised; the loss is the cross-entropy of
``scale * cos(anchor_i, positive_j)`` with target ``j = i``.

Shapes: B batch, T sequence length, D ``d_model``, H ``n_head``, hd ``head_dim``, F ``d_ff``,
N ``n_layer``. Float arrays are in ``cfg.dtype``; token ids are int32.

Source: Devlin et al. 2019, arXiv:1810.04805; Hugging Face ``transformers`` ``modeling_bert.py``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from .model import block_params_of, layer_dropout_keys
from .ops import batched_matmul, gelu, layer_norm, masked_softmax
from .render import remat_scan
from .models.config import TransformerConfig
from .spec.schedules import Schedule, none

__all__ = [
    "CONTRASTIVE_SCALE", "contrastive_loss", "dropout", "embed", "encode", "encoder_block_forward",
    "loss_fn", "mean_pool", "padding_mask",
]

CONTRASTIVE_SCALE = 20.0
"""Scale of the cosine similarities in :func:`contrastive_loss` (sentence-transformers' default)."""


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout: zero with probability ``rate``, survivors scaled by ``1/(1-rate)``.

    Identity when ``key`` is None or ``rate == 0``. ``x``: any shape; ``key``: a PRNG key.
    """
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def padding_mask(idx: jax.Array, cfg: TransformerConfig) -> jax.Array:
    """``idx != cfg.pad_token_id``: (B, T) bool, True on real tokens."""
    return idx != cfg.pad_token_id


def embed(params: dict, idx: jax.Array, cfg: TransformerConfig, *, token_type_ids=None,
          dropout_key=None) -> jax.Array:
    """``dropout(ln_e((wte[idx] + wtt[token_type_ids]) + wpe[:T]))`` (Hugging Face's order of sums).

    Args:
        params: canonical dict; uses ``wte`` (V, D), ``wtt`` (type_vocab_size, D), ``wpe``
            (max_seq_len, D), ``ln_e.weight`` and ``ln_e.bias`` (D,).
        idx: (B, T) int token ids.
        cfg: model configuration (``arch="bert"``).
        token_type_ids: optional (B, T) int ids in ``[0, type_vocab_size)``; zeros when None.
        dropout_key: optional PRNG key; dropout at ``cfg.dropout`` only when given.

    Returns:
        (B, T, D) in ``cfg.dtype``.
    """
    T = idx.shape[-1]
    types = params["wtt"][0] if token_type_ids is None else params["wtt"][token_type_ids]
    x = params["wte"][idx] + types + params["wpe"][:T]
    x = layer_norm(x, params["ln_e.weight"], params["ln_e.bias"], cfg.layer_norm_eps)
    return dropout(x, cfg.dropout, dropout_key)


def encoder_block_forward(block_params: dict, x: jax.Array, key_mask: jax.Array, cfg: TransformerConfig, *,
                          dropout_key=None) -> jax.Array:
    """One post-LayerNorm BERT block.

    Args:
        block_params: one layer's slices of the ``h.*`` entries (no layer axis), e.g.
            ``"h.attn.c_attn.weight"`` (D, 3D), ``"h.ln_1.weight"`` (D,).
        x: (B, T, D) residual stream.
        key_mask: (B, T) bool, False on padded positions (masked out as attention keys).
        cfg: model configuration.
        dropout_key: optional PRNG key, split three ways (attention probabilities, attention
            output, MLP output).

    Returns:
        (B, T, D), same dtype as ``x``.
    """
    p = block_params
    B, T, D = x.shape
    H, hd = cfg.n_head, cfg.head_dim
    keys = (None,) * 3 if dropout_key is None else tuple(jax.random.split(dropout_key, 3))
    x = checkpoint_name(x, "block_input")

    qkv = checkpoint_name(x @ p["h.attn.c_attn.weight"] + p["h.attn.c_attn.bias"], "qkv_proj")  # (B, T, 3D)
    q, k, v = jnp.split(qkv, 3, axis=-1)                                          # 3 x (B, T, D)
    q, k, v = (t.reshape(B, T, H, hd).transpose(0, 2, 1, 3) for t in (q, k, v))  # (B, H, T, hd)
    scores = checkpoint_name(batched_matmul(q, k, transpose_b=True), "attn_scores")           # (B, H, T, T)
    probs = masked_softmax(scores, key_mask[:, None, None, :], 1.0 / math.sqrt(hd), "attn_probs")
    ctx = checkpoint_name(batched_matmul(dropout(probs, cfg.dropout, keys[0]), v), "attn_out")    # (B, H, T, hd)
    y = ctx.transpose(0, 2, 1, 3).reshape(B, T, D)
    o = checkpoint_name(y @ p["h.attn.c_proj.weight"] + p["h.attn.c_proj.bias"], "out_proj")
    x = layer_norm(x + dropout(o, cfg.dropout, keys[1]), p["h.ln_1.weight"], p["h.ln_1.bias"], cfg.layer_norm_eps)
    x = checkpoint_name(x, "attn_norm")

    m = checkpoint_name(x @ p["h.mlp.c_fc.weight"] + p["h.mlp.c_fc.bias"], "mlp_hidden")  # (B, T, F)
    m = checkpoint_name(gelu(m, False), "mlp_act")
    m = checkpoint_name(m @ p["h.mlp.c_proj.weight"] + p["h.mlp.c_proj.bias"], "mlp_out")  # (B, T, D)
    x = layer_norm(x + dropout(m, cfg.dropout, keys[2]), p["h.ln_2.weight"], p["h.ln_2.bias"], cfg.layer_norm_eps)
    return checkpoint_name(x, "mlp_norm")


def _check_ids(idx, cfg: TransformerConfig) -> None:
    """Raise ValueError for a wrong rank, a too-long sequence, non-integer or (when concrete) bad ids."""
    if np.ndim(idx) != 2:
        raise ValueError(f"token ids must have shape (batch, seq_len), got shape {np.shape(idx)}")
    T = np.shape(idx)[1]
    if not 1 <= T <= cfg.max_seq_len:
        raise ValueError(f"sequence length must be in [1, max_seq_len={cfg.max_seq_len}], got {T}")
    if not jnp.issubdtype(jnp.result_type(idx), jnp.integer):
        raise ValueError(f"token ids must be integers, got dtype {jnp.result_type(idx)}")
    if not isinstance(idx, jax.core.Tracer):
        arr = np.asarray(idx)
        if arr.size and (arr.min() < 0 or arr.max() >= cfg.vocab_size):
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got min {arr.min()}, max {arr.max()}")


def encode(params: dict, idx: jax.Array, cfg: TransformerConfig, schedule: Schedule = none, *,
           attention_mask=None, token_type_ids=None, dropout_key=None, policy=None) -> jax.Array:
    """Last hidden state of the encoder, the blocks run by :func:`jaxremat.render.remat_scan`.

    Args:
        params: canonical encoder dict (``cfg.dtype``).
        idx: (B, T) int token ids, T <= ``cfg.max_seq_len``.
        cfg: model configuration with ``arch="bert"``.
        schedule: remat schedule of the block stack.
        attention_mask: optional (B, T) bool/int, nonzero on real tokens; ``idx != pad_token_id``
            when None.
        token_type_ids: optional (B, T) int token types; zeros when None.
        dropout_key: optional PRNG key for dropout.
        policy: optional ``jax.checkpoint`` policy for the checkpointed segments.

    Returns:
        (B, T, D) hidden states (Hugging Face ``BertModel``'s ``last_hidden_state``).

    Raises:
        ValueError: ``cfg.arch`` is not ``"bert"``, or bad token ids (see :func:`loss_fn`).
    """
    if cfg.arch != "bert":
        raise ValueError(f"encode needs TransformerConfig(arch='bert'), got arch={cfg.arch!r}")
    _check_ids(idx, cfg)
    key_mask = padding_mask(idx, cfg) if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
    embed_key, layer_keys = layer_dropout_keys(dropout_key, cfg.n_layer)
    x = embed(params, idx, cfg, token_type_ids=token_type_ids, dropout_key=embed_key)

    def block_fn(layer_params, carry, layer_key):
        return encoder_block_forward(layer_params, carry, key_mask, cfg, dropout_key=layer_key)

    return remat_scan(block_fn, block_params_of(params), x, schedule, xs=layer_keys, policy=policy)


def mean_pool(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``hidden`` (B, T, D) over the positions where ``mask`` (B, T) is True -> (B, D).

    The ``mean_tokens`` pooling of sentence-transformers (divisor clamped at 1e-9).
    """
    m = mask.astype(hidden.dtype)[..., None]                                       # (B, T, 1)
    return jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)


def contrastive_loss(embeddings: jax.Array, scale: float = CONTRASTIVE_SCALE) -> jax.Array:
    """In-batch contrastive loss over pairs ``(embeddings[2i], embeddings[2i+1])``.

    Args:
        embeddings: (B, D) sentence embeddings, B even.
        scale: multiplier of the cosine similarities (inverse temperature).

    Returns:
        0-d mean cross-entropy of ``scale * cos(a_i, p_j)`` (B/2, B/2) against ``j = i``.

    Raises:
        ValueError: B is odd or < 2.
    """
    B = embeddings.shape[0]
    if B < 2 or B % 2:
        raise ValueError(f"the contrastive batch holds pairs: batch size must be even and >= 2, got {B}")
    e = embeddings / jnp.maximum(jnp.linalg.norm(embeddings, axis=-1, keepdims=True), 1e-12)
    a, p = e[0::2], e[1::2]                                                        # (B/2, D) each
    logits = scale * (a @ p.T)                                                     # (B/2, B/2)
    logz = jax.nn.logsumexp(logits, axis=-1)
    return jnp.mean(logz - jnp.diagonal(logits))


def loss_fn(params: dict, tokens: jax.Array, cfg: TransformerConfig, schedule: Schedule = none,
            dropout_key=None, *, policy=None) -> jax.Array:
    """Contrastive sentence-embedding loss of a padded batch of sentence pairs.

    Same signature as :func:`jaxremat.model.loss_fn`, so the harness runs either.

    Args:
        params: canonical encoder dict in ``cfg.dtype``.
        tokens: (B, T) int token ids, B even, rows ``2i``/``2i+1`` a positive pair, padded with
            ``cfg.pad_token_id`` (the padding mask is ``tokens != pad_token_id``).
        cfg: model configuration with ``arch="bert"``.
        schedule: remat schedule for the block stack.
        dropout_key: optional PRNG key for dropout.
        policy: optional ``jax.checkpoint`` policy.

    Returns:
        0-d loss in ``cfg.dtype``.

    Raises:
        ValueError: wrong rank, odd batch, T > max_seq_len, non-integer ids or (when concrete) ids
            outside ``[0, vocab_size)``.
    """
    if np.ndim(tokens) == 2 and (np.shape(tokens)[0] < 2 or np.shape(tokens)[0] % 2):
        raise ValueError(f"the contrastive batch holds pairs: batch size must be even and >= 2, got {np.shape(tokens)[0]}")
    mask = padding_mask(tokens, cfg)
    hidden = encode(params, tokens, cfg, schedule, dropout_key=dropout_key, policy=policy)
    return contrastive_loss(mean_pool(hidden, mask))
