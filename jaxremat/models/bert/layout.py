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
