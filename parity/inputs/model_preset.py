"""A model preset: a named configuration and the batch it is trained on (a ``--model`` value).

The built-in presets are in :mod:`parity.inputs.presets`; presets backed by real checkpoints are
built by :mod:`parity.inputs.pretrained`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

from jaxremat.models import TransformerConfig, get_model

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
        texts: for a BERT checkpoint, the bundled pairs its batches are cut from: ``"sentences"``
            (:func:`parity.inputs.sentences.sentence_batch`, 9-16 tokens a text) or ``"passages"``
            (:func:`parity.inputs.sentences.passage_batch`, 114-145 tokens a text, for T = 128).
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
    texts: str = "sentences"

    def __post_init__(self):
        if self.texts not in ("sentences", "passages"):
            raise ValueError(f"preset {self.name!r}: texts must be 'sentences' or 'passages', got {self.texts!r}")


def with_shape(preset: ModelPreset, batch_size: int | None = None, seq_len: int | None = None) -> ModelPreset:
    """``preset`` at another batch shape (``--batch-size``, ``--seq-len``); ``None`` keeps the preset's.

    A preset with random weights grows its positions to ``seq_len``; a checkpoint's positions are fixed.

    Raises:
        ValueError: one line: a size below 1, a sequence longer than a checkpoint's positions, an odd
            batch for a model trained on sentence pairs.
    """
    changes = {}
    for option, value, key in (("--batch-size", batch_size, "batch_size"), ("--seq-len", seq_len, "seq_len")):
        if value is None:
            continue
        if value < 1:
            raise ValueError(f"{option} must be >= 1, got {value}")
        changes[key] = value
    if not changes:
        return preset
    cfg = preset.config
    if seq_len is not None and seq_len > cfg.max_seq_len:
        if preset.checkpoint is not None:
            raise ValueError(f"--seq-len {seq_len} exceeds {preset.name}'s {cfg.max_seq_len} positions (its checkpoint "
                             f"fixes them): use --seq-len <= {cfg.max_seq_len}")
        cfg = cfg.replace(max_seq_len=seq_len)
    if batch_size is not None and get_model(cfg.arch).batch == "sentence_pairs" and batch_size % 2:
        raise ValueError(f"--batch-size {batch_size}: {preset.name} trains on sentence pairs, so the batch counts "
                         "sentences and must be even")
    return dataclasses.replace(preset, config=cfg, **changes)
