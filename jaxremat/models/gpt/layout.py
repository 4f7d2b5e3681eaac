"""The canonical parameter layout of the GPT-2-style decoder (``TransformerConfig(arch="gpt")``).

Embeddings ``wte`` (tokens, tied to the output head) and ``wpe`` (learned positions), the stacked
per-block entries ``h.*`` (:mod:`jaxremat.models.block`), and the final LayerNorm ``ln_f``.
"""

from __future__ import annotations

from ..block import block_param_shapes


def gpt_param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every GPT parameter, in a fixed order (embeddings, stacked blocks, final norm).

    Args:
        cfg: a :class:`jaxremat.models.TransformerConfig` with ``arch="gpt"``.
    """
    D, V, T = cfg.d_model, cfg.vocab_size, cfg.max_seq_len
    return {
        "wte": (V, D),
        "wpe": (T, D),
        **block_param_shapes(cfg),
        "ln_f.weight": (D,),
        "ln_f.bias": (D,),
    }
