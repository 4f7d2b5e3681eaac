"""Built-in model presets of the parity suite (names accepted by ``--model``)."""

from __future__ import annotations

import dataclasses

from jaxremat.spec import TransformerConfig

from .data import BYTE_VOCAB_SIZE


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    """A named configuration plus the batch it is trained on.

    Attributes:
        name: the ``--model`` value.
        config: the transformer (dtype is replaced per run by ``--dtype``).
        batch_size: windows per batch B.
        seq_len: tokens per window T (model input length).
        description: one line for ``--help``.
    """

    name: str
    config: TransformerConfig
    batch_size: int
    seq_len: int
    description: str


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            "gpt-small",
            TransformerConfig(vocab_size=BYTE_VOCAB_SIZE, n_layer=8, d_model=64, n_head=4, d_ff=256, max_seq_len=64),
            batch_size=4,
            seq_len=64,
            description="GPT-2-style, 8 layers, d_model 64, 4 heads, d_ff 256, byte vocabulary, B=4, T=64 (default)",
        ),
        ModelPreset(
            "gpt-tiny",
            TransformerConfig(vocab_size=BYTE_VOCAB_SIZE, n_layer=4, d_model=32, n_head=2, d_ff=64, max_seq_len=16),
            batch_size=2,
            seq_len=16,
            description="GPT-2-style, 4 layers, d_model 32, 2 heads, d_ff 64, B=2, T=16 (for quick checks)",
        ),
    )
}


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``; raises ValueError listing the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(PRESETS)}") from None
