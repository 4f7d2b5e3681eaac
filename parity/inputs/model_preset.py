"""A model preset: a named configuration and the batch it is trained on (a ``--model`` value).

The built-in presets are in :mod:`parity.inputs.presets`; presets backed by real checkpoints are
built by :mod:`parity.inputs.pretrained`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

from jaxremat.models import TransformerConfig

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
