"""The canonical parameter layout of the BERT-style encoder (``TransformerConfig(arch="bert")``).

The per-block entries are the GPT layout's (``h.*``, stacked on a leading layer axis N, matrices
``(in, out)``), so every schedule and policy runs on the encoder unchanged. Their meaning in the
post-LayerNorm block: ``h.attn.c_attn`` is the fused query/key/value projection (Hugging Face's
``attention.self.{query,key,value}`` concatenated on the output axis), ``h.attn.c_proj`` is
``attention.output.dense``, ``h.ln_1`` is ``attention.output.LayerNorm`` (after the attention
residual), ``h.mlp.c_fc`` is ``intermediate.dense``, ``h.mlp.c_proj`` is ``output.dense`` and
``h.ln_2`` is ``output.LayerNorm`` (after the MLP residual). Embeddings: ``wte`` word, ``wpe``
position, ``wtt`` token type, ``ln_e`` their LayerNorm. There is no final norm and no pooler.
"""

from __future__ import annotations

from ..block import block_param_shapes


def encoder_param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every encoder parameter, in a fixed order (embeddings, then stacked blocks).

    Args:
        cfg: a :class:`jaxremat.models.TransformerConfig` with ``arch="bert"``.
    """
    D, V, T = cfg.d_model, cfg.vocab_size, cfg.max_seq_len
    return {
        "wte": (V, D),
        "wpe": (T, D),
        "wtt": (cfg.type_vocab_size, D),
        "ln_e.weight": (D,),
        "ln_e.bias": (D,),
        **block_param_shapes(cfg),
    }


def encoder_chain_base(cfg, batch: int, seq: int, itemsize: int) -> dict:
    """The framework-neutral part of an encoder stack's planner chain (for
    :func:`jaxremat.planner.encoder_chain` and :func:`torchref.planner.encoder_chain`).

    Args:
        cfg: a :class:`jaxremat.models.TransformerConfig` with ``arch="bert"``.
        batch, seq: the batch's shape (B, T).
        itemsize: bytes per element of ``cfg.dtype``.

    Returns:
        ``{"boundary_bytes": B*T*D*itemsize, "invariant_bytes": 0, "fixed_bytes": 0}``: the family
        has no per-tensor account of what lies outside the stack; a caller calibrates it on
        ``none``'s measured peak.

    Raises:
        ValueError: a family other than BERT, or bad sizes.
    """
    if cfg.arch != "bert":
        raise ValueError(f"encoder_chain plans the BERT encoder block; cfg.arch is {cfg.arch!r}")
    if batch < 1 or not 1 <= seq <= cfg.max_seq_len:
        raise ValueError(f"need batch >= 1 and 1 <= seq <= {cfg.max_seq_len}, got batch={batch}, seq={seq}")
    return {"boundary_bytes": batch * seq * cfg.d_model * itemsize, "invariant_bytes": 0, "fixed_bytes": 0}
