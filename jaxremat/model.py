"""A GPT-2-style transformer in JAX, single-device model code only (nanoGPT's layout).

Every function here is pure and works on the canonical parameter dict of
:mod:`jaxremat.models.params`: per-block tensors stacked on a leading layer axis N under ``h.*``,
matrices stored ``(in, out)`` so a projection is ``x @ W + b``. No remat schedule is applied
inside the block math: :func:`forward` hands the stacked blocks to
:func:`jaxremat.render.remat_scan`, which decides what the forward pass keeps.

Shapes: B batch, T sequence length, D ``d_model``, H ``n_head``, hd ``head_dim``, F ``d_ff``,
V ``vocab_size``, N ``n_layer``. All float arrays are in ``cfg.dtype``; token ids are int32.

Dropout uses explicit keys only: :func:`layer_dropout_keys` splits one key into the embedding key
and N per-layer keys *outside* the scan, and the per-layer keys travel as scanned ``xs``, so a
recomputed block redraws exactly the mask of its first forward pass.

Source: Radford et al. 2019 (GPT-2); karpathy/nanoGPT ``model.py``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from .ops import batched_matmul, gelu, layer_norm, masked_softmax
from .render import remat_scan
from .models.config import TransformerConfig
from .models.block import BLOCK_PARAM_NAMES
from .models.params import check_params
from .spec.schedules import Schedule, none

__all__ = [
    "GPT", "block_forward", "compute_cast", "cross_entropy", "embed", "forward", "head", "layer_norm",
    "layer_dropout_keys", "loss_fn", "block_params_of",
]


def _dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout: zero with probability ``rate``, scale survivors by ``1/(1-rate)``.

    Identity when ``key`` is None or ``rate == 0``.
    """
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def compute_cast(tree, cfg: TransformerConfig):
    """Cast the float leaves of ``tree`` to ``cfg.compute_dtype`` (unchanged when it is None).

    Mixed precision as Flax modules do it with ``dtype`` (computation) and ``param_dtype``
    (storage): parameters stay in ``cfg.dtype`` and are cast where they are used, so gradients
    come back in ``cfg.dtype`` through the cast's transpose. The cast sits inside the embedding,
    each block and the head, so a recomputed block casts again, in the same precision.
    """
    if cfg.compute_dtype is None:
        return tree
    dt = jnp.dtype(cfg.compute_dtype)
    return jax.tree_util.tree_map(lambda a: a.astype(dt) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def layer_dropout_keys(dropout_key: jax.Array | None, n_layer: int):
    """Split one dropout key into ``(embed_key, layer_keys)``; layer_keys has shape (N,).

    Returns ``(None, None)`` when ``dropout_key`` is None. Used by :func:`forward` and by
    :mod:`jaxremat.reverse_loop` so both draw the same masks.
    """
    if dropout_key is None:
        return None, None
    embed_key, layers_key = jax.random.split(dropout_key)
    return embed_key, jax.random.split(layers_key, n_layer)


def embed(params: dict, idx: jax.Array, cfg: TransformerConfig, *, dropout_key=None) -> jax.Array:
    """Token plus position embedding: ``x = wte[idx] + wpe[:T]`` (then dropout).

    Args:
        params: canonical dict; uses ``wte`` (V, D) and ``wpe`` (max_seq_len, D).
        idx: (B, T) int32 token ids in ``[0, V)``; T <= ``cfg.max_seq_len``.
        cfg: model configuration.
        dropout_key: optional PRNG key; dropout at ``cfg.dropout`` only when given.

    Returns:
        x: (B, T, D) in ``cfg.dtype`` (``cfg.compute_dtype`` when set).
    """
    T = idx.shape[-1]
    wte, wpe = compute_cast((params["wte"], params["wpe"]), cfg)
    x = wte[idx] + wpe[:T]
    return _dropout(x, cfg.dropout, dropout_key)


def _fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, cfg: TransformerConfig) -> jax.Array:
    """Causal attention as one ``jax.nn.dot_product_attention`` call (``cfg.attention == "fused"``).

    Args:
        q, k, v: (B, T, D) each, heads not yet split.

    Returns:
        (B, T, D), heads merged. Only the context is tagged, ``attn_out`` (shape (B, T, H, hd) here,
        the same elements as the materialized (B, H, T, hd)): the scores and probabilities are
        internal to the call, so policies naming ``attn_scores`` or ``attn_probs`` keep nothing of
        it. JAX picks the implementation (``implementation=None``): cuDNN's fused kernel on a GPU
        that has it, else XLA's, which computes the (B, H, T, T) scores in float32 and keeps the
        probabilities for the backward as the materialized block does (docs/real-sizes.md).
    """
    B, T, D = q.shape
    H, hd = cfg.n_head, cfg.head_dim
    q, k, v = (t.reshape(B, T, H, hd) for t in (q, k, v))                      # (B, T, H, hd)
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(hd))
    return checkpoint_name(y, "attn_out").reshape(B, T, D)


def block_forward(block_params: dict, x: jax.Array, cfg: TransformerConfig, *, dropout_key=None) -> jax.Array:
    """One pre-LayerNorm block: ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``.

    Args:
        block_params: one layer's slices, keys of ``BLOCK_PARAM_NAMES`` (e.g. ``"h.ln_1.weight"``
            of shape (D,), ``"h.attn.c_attn.weight"`` of shape (D, 3D)), no layer axis.
        x: (B, T, D) residual stream.
        cfg: model configuration.
        dropout_key: optional PRNG key, split three ways (attention probabilities, attention
            residual branch, MLP residual branch).

    Returns:
        (B, T, D), same dtype as ``x`` (``cfg.compute_dtype`` when set: parameters and ``x`` are
        cast to it first).

    Every activation of :data:`jaxremat.spec.names.ACTIVATION_NAMES` is tagged with
    ``jax.ad_checkpoint.checkpoint_name`` (an identity), so name-based ``jax.checkpoint``
    policies (:func:`jaxremat.policies.to_jax_policy`) can keep it; with ``cfg.attention ==
    "fused"`` the attention core is one call and ``attn_scores``, ``attn_probs`` are not tagged
    (:func:`_fused_attention`).
    """
    p, x = compute_cast((block_params, x), cfg)
    B, T, D = x.shape
    H, hd = cfg.n_head, cfg.head_dim
    keys = (None,) * 3 if dropout_key is None else tuple(jax.random.split(dropout_key, 3))
    name = checkpoint_name  # tags from jaxremat.spec.names; policies select on them

    x = name(x, "block_input")
    h = name(layer_norm(x, p["h.ln_1.weight"], p["h.ln_1.bias"], cfg.layer_norm_eps), "attn_norm")
    qkv = name(h @ p["h.attn.c_attn.weight"] + p["h.attn.c_attn.bias"], "qkv_proj")  # (B, T, 3D)
    q, k, v = jnp.split(qkv, 3, axis=-1)                                     # 3 x (B, T, D)
    if cfg.attention == "fused":
        y = _fused_attention(q, k, v, cfg)                                   # (B, T, D)
    else:
        q, k, v = (t.reshape(B, T, H, hd).transpose(0, 2, 1, 3) for t in (q, k, v))  # (B, H, T, hd)
        scores = name(batched_matmul(q, k, transpose_b=True), "attn_scores")            # (B, H, T, T)
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))
        probs = _dropout(masked_softmax(scores, causal, 1.0 / math.sqrt(hd), "attn_probs"), cfg.dropout, keys[0])
        y = name(batched_matmul(probs, v), "attn_out").transpose(0, 2, 1, 3).reshape(B, T, D)  # (B, H, T, hd) -> (B, T, D)
    a = name(y @ p["h.attn.c_proj.weight"] + p["h.attn.c_proj.bias"], "out_proj")
    x = x + _dropout(a, cfg.dropout, keys[1])

    h2 = name(layer_norm(x, p["h.ln_2.weight"], p["h.ln_2.bias"], cfg.layer_norm_eps), "mlp_norm")
    m = name(h2 @ p["h.mlp.c_fc.weight"] + p["h.mlp.c_fc.bias"], "mlp_hidden")    # (B, T, F)
    m = name(gelu(m, True), "mlp_act")
    out = name(m @ p["h.mlp.c_proj.weight"] + p["h.mlp.c_proj.bias"], "mlp_out")
    return x + _dropout(out, cfg.dropout, keys[2])


def head(params: dict, x: jax.Array, cfg: TransformerConfig) -> jax.Array:
    """Final LayerNorm and the tied output projection: ``ln_f(x) @ wte.T``.

    Args:
        params: canonical dict; uses ``ln_f.weight``, ``ln_f.bias`` (D,) and ``wte`` (V, D).
        x: (B, T, D).

    Returns:
        logits: (B, T, V) in ``cfg.dtype``; with ``cfg.compute_dtype`` set they are computed in it
        and cast back to ``cfg.dtype`` for the loss (as mixed-precision Flax models do).
    """
    ln_w, ln_b, wte, x = compute_cast((params["ln_f.weight"], params["ln_f.bias"], params["wte"], x), cfg)
    logits = layer_norm(x, ln_w, ln_b, cfg.layer_norm_eps) @ wte.T
    return logits if cfg.compute_dtype is None else logits.astype(cfg.dtype)


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean negative log-likelihood, as ``torch.nn.functional.cross_entropy`` (mean reduction).

    Args:
        logits: (B, T, V) float.
        targets: (B, T) int32 ids in ``[0, V)``.

    Returns:
        0-d array in the dtype of ``logits``.
    """
    logz = jax.nn.logsumexp(logits, axis=-1)                                  # (B, T)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # (B, T)
    return jnp.mean(logz - picked)


def block_params_of(params: dict) -> dict:
    """The stacked per-block entries (``h.*``, leading axis N) of a canonical dict."""
    return {name: params[name] for name in BLOCK_PARAM_NAMES}


def _check_tokens(idx, cfg: TransformerConfig, extra: int = 0, what: str = "tokens") -> None:
    """Raise ValueError for a wrong rank, a too-long sequence, or (when concrete) bad ids."""
    if np.ndim(idx) != 2:
        raise ValueError(f"{what} must have shape (batch, seq_len), got shape {np.shape(idx)}")
    T = np.shape(idx)[1] - extra
    if T > cfg.max_seq_len:
        raise ValueError(f"{what}: sequence length {T} exceeds max_seq_len {cfg.max_seq_len}")
    if T < 1:
        raise ValueError(f"{what}: sequence length must be >= 1, got {T}")
    if not jnp.issubdtype(jnp.result_type(idx), jnp.integer):
        raise ValueError(f"{what} must be integer token ids, got dtype {jnp.result_type(idx)}")
    if not isinstance(idx, jax.core.Tracer):
        arr = np.asarray(idx)
        if arr.size and (arr.min() < 0 or arr.max() >= cfg.vocab_size):
            raise ValueError(
                f"{what}: token ids must lie in [0, {cfg.vocab_size}), got min {arr.min()}, max {arr.max()}"
            )


def check_loss_tokens(tokens, cfg: TransformerConfig) -> None:
    """Check a concrete ``(B, T+1)`` batch of :func:`loss_fn` eagerly (under ``jax.jit`` ids are traced).

    Raises:
        ValueError: a wrong rank, a sequence of ``T`` outside ``[1, max_seq_len]``, non-integer
            ids, or ids outside ``[0, vocab_size)``.
    """
    _check_tokens(tokens, cfg, extra=1)


def forward(params: dict, idx: jax.Array, cfg: TransformerConfig, schedule: Schedule = none,
            *, dropout_key=None, policy=None, carry_sharding=None) -> jax.Array:
    """Logits of the whole model, the block stack run by :func:`jaxremat.render.remat_scan`.

    Args:
        params: canonical dict of arrays (see :func:`jaxremat.models.param_shapes`).
        idx: (B, T) int32 token ids.
        cfg: model configuration.
        schedule: remat schedule for the block stack (default ``none``).
        dropout_key: optional PRNG key for dropout.
        policy: optional ``jax.checkpoint`` policy for the checkpointed segments.
        carry_sharding: optional sharding of the (B, T, D) residual stream at every block boundary
            under a device mesh (see :func:`jaxremat.render.remat_scan`).

    Returns:
        logits: (B, T, V).
    """
    embed_key, layer_keys = layer_dropout_keys(dropout_key, cfg.n_layer)
    x = embed(params, idx, cfg, dropout_key=embed_key)

    def block_fn(layer_params, carry, layer_key):
        return block_forward(layer_params, carry, cfg, dropout_key=layer_key)

    x = remat_scan(block_fn, block_params_of(params), x, schedule, xs=layer_keys, policy=policy,
                   carry_sharding=carry_sharding)
    return head(params, x, cfg)


def loss_fn(params: dict, tokens: jax.Array, cfg: TransformerConfig, schedule: Schedule = none,
            dropout_key=None, *, policy=None, carry_sharding=None) -> jax.Array:
    """Next-token cross-entropy: inputs ``tokens[:, :-1]``, targets ``tokens[:, 1:]``.

    Args:
        params: canonical dict of arrays in ``cfg.dtype``.
        tokens: (B, T+1) int32 token ids, T <= ``cfg.max_seq_len``.
        cfg: model configuration.
        schedule: remat schedule for the block stack.
        dropout_key: optional PRNG key for dropout.
        policy: optional ``jax.checkpoint`` policy for the checkpointed segments.
        carry_sharding: optional sharding of the residual stream at every block boundary
            (:func:`jaxremat.sharding.activation_sharding`; see :func:`jaxremat.render.remat_scan`).

    Returns:
        0-d mean loss in ``cfg.dtype``.

    Raises:
        ValueError: ``tokens`` has the wrong rank, is too long, or holds ids outside ``[0, V)``
            (the last check only when ``tokens`` is concrete).
    """
    _check_tokens(tokens, cfg, extra=1)
    logits = forward(params, tokens[:, :-1], cfg, schedule, dropout_key=dropout_key, policy=policy,
                     carry_sharding=carry_sharding)
    return cross_entropy(logits, tokens[:, 1:])


class GPT(nnx.Module):
    """Flax NNX module holding the canonical stacked parameters as ``nnx.Param`` s.

    Attributes ``wte`` (V, D), ``wpe`` (max_seq_len, D), ``h`` (an ``nnx.Dict`` of stacked block
    tensors keyed ``"ln_1.weight"`` ... with leading axis N) and ``ln_f`` (``"weight"``, ``"bias"``).
    Calling the module runs :func:`forward` with the given schedule.
    """

    def __init__(self, cfg: TransformerConfig, params: dict):
        check_params(cfg, params)
        self.cfg = cfg
        self.wte = nnx.Param(params["wte"])
        self.wpe = nnx.Param(params["wpe"])
        self.h = nnx.Dict({n[len("h."):]: nnx.Param(params[n]) for n in BLOCK_PARAM_NAMES})
        self.ln_f = nnx.Dict({"weight": nnx.Param(params["ln_f.weight"]),
                              "bias": nnx.Param(params["ln_f.bias"])})

    @classmethod
    def from_params(cls, cfg: TransformerConfig, params_np: dict[str, np.ndarray]) -> "GPT":
        """Build from a canonical dict of numpy arrays (copied exactly, no dtype change).

        Raises:
            ValueError: a key is missing/unexpected/mis-shaped, a dtype differs from
                ``cfg.dtype``, or ``cfg.dtype`` is float64 while ``jax_enable_x64`` is off (JAX
                would silently truncate to float32; wrap the call in ``jax.enable_x64(True)``).
        """
        check_params(cfg, params_np)
        for k, v in params_np.items():
            if np.asarray(v).dtype != np.dtype(cfg.dtype):
                raise ValueError(f"parameter {k!r}: dtype {np.asarray(v).dtype} differs from cfg.dtype {cfg.dtype}")
        if cfg.dtype == "float64" and not jax.config.jax_enable_x64:
            raise ValueError("cfg.dtype is float64 but jax_enable_x64 is off; use `with jax.enable_x64(True):`")
        return cls(cfg, {k: jnp.asarray(v) for k, v in params_np.items()})

    def params(self) -> dict[str, jax.Array]:
        """Canonical dict of the current parameter arrays (no copy)."""
        out = {"wte": self.wte[...], "wpe": self.wpe[...]}
        out.update({f"h.{k}": v[...] for k, v in self.h.items()})
        out.update({f"ln_f.{k}": v[...] for k, v in self.ln_f.items()})
        return {k: out[k] for k in ("wte", "wpe", *BLOCK_PARAM_NAMES, "ln_f.weight", "ln_f.bias")}

    def to_params(self) -> dict[str, np.ndarray]:
        """Canonical dict of numpy arrays; bitwise equal to what :meth:`from_params` received."""
        return {k: np.asarray(v) for k, v in self.params().items()}

    def __call__(self, tokens_in, schedule: Schedule = none, dropout_key=None, *, policy=None) -> jax.Array:
        """Logits (B, T, V) for token ids (B, T).

        Raises:
            ValueError: wrong rank, ``T > max_seq_len``, non-integer ids, or (when concrete)
                ids outside ``[0, vocab_size)``.
        """
        _check_tokens(tokens_in, self.cfg, what="tokens_in")
        return forward(self.params(), tokens_in, self.cfg, schedule, dropout_key=dropout_key, policy=policy)
