"""The stacked per-block parameter entries (``h.*``), shared by the GPT and the encoder layouts."""

from __future__ import annotations


def _block_shapes(L: int, D: int, F: int) -> dict[str, tuple[int, ...]]:
    return {
        "h.ln_1.weight": (L, D),
        "h.ln_1.bias": (L, D),
        "h.attn.c_attn.weight": (L, D, 3 * D),
        "h.attn.c_attn.bias": (L, 3 * D),
        "h.attn.c_proj.weight": (L, D, D),
        "h.attn.c_proj.bias": (L, D),
        "h.ln_2.weight": (L, D),
        "h.ln_2.bias": (L, D),
        "h.mlp.c_fc.weight": (L, D, F),
        "h.mlp.c_fc.bias": (L, F),
        "h.mlp.c_proj.weight": (L, F, D),
        "h.mlp.c_proj.bias": (L, D),
    }


def block_param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the per-block tensors, stacked on a leading layer axis N; matrices ``(in, out)``.

    Args:
        cfg: a :class:`jaxremat.models.TransformerConfig` (any ``arch``).
    """
    return _block_shapes(cfg.n_layer, cfg.d_model, cfg.d_ff)


BLOCK_PARAM_NAMES = tuple(_block_shapes(1, 1, 1))
"""The names of the per-block entries, in layout order (the keys of :func:`block_param_shapes`)."""
