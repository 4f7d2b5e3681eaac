"""Checks against a peer implementation: our encoders beside Hugging Face ``BertModel``.

With the same weights and the same padded tokens (dropout off, float32 or float64):

* ``torch vs transformers``: :class:`torchref.encoder.Encoder` against ``transformers.BertModel``'s
  ``last_hidden_state``. For a checkpoint directory the peer loads it with its own loader
  (``BertModel.from_pretrained``), so our key mapping is checked too; otherwise the peer is built
  from the config and our weights (:func:`parity.inputs.checkpoints.canonical_to_hf`, strict).
* ``jax vs torch``: :func:`jaxremat.encoder.encode` against the torch encoder (each framework's
  :meth:`parity.runners.framework.Framework.encoder_hidden_states`).

Errors are relative to the reference's largest magnitude over the real (not padded) positions,
against the cross-framework tolerance of the dtype (:data:`parity.checks.compare.TOLERANCES`). Hidden
states at padded positions are computed but used by nothing (pooling and attention mask them
out); their error is reported in the note. Measured on minilm-l6 in float32: jax vs torch
5e-7 on real tokens, 9e-6 on padded ones.
``transformers`` is an optional (``dev``) dependency: without it the first check is reported as
skipped, never as passed.

A training step beside the peer's own checkpointing is PyTorch's alone:
:func:`parity.runners.torch_peer.hf_checkpointing_peer`, reached through the framework's
``peer_step_rows`` verb.
"""

from __future__ import annotations

# Deferred imports: PyTorch and transformers load only when the transformers peer runs (an optional dependency).

from pathlib import Path
from typing import Optional

import numpy as np

from jaxremat.models import TransformerConfig

from parity.checks.compare import tolerance_for
from parity.inputs.checkpoints import canonical_to_hf, hf_config_dict
from parity.runners.framework import FRAMEWORK_NAMES, get_framework, reference_framework


def transformers_available() -> bool:
    """True when ``transformers`` can be imported."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def hf_bert_model(cfg: TransformerConfig, params: dict):
    """``transformers.BertModel`` (no pooler, eager attention, ``cfg.dtype``) holding canonical ``params``.

    Raises:
        ImportError: ``transformers`` is not installed.
        ValueError: the peer's parameter names differ from those ``params`` maps to.
    """
    import torch
    from transformers import BertConfig, BertModel

    with torch.random.fork_rng(devices=[]):
        model = BertModel(BertConfig(**hf_config_dict(cfg), attn_implementation="eager"), add_pooling_layer=False)
        state = {k: torch.from_numpy(v) for k, v in canonical_to_hf(cfg, params).items()}
        model.load_state_dict(state, strict=False)
        expected = set(model.state_dict()) - {"embeddings.position_ids", "embeddings.token_type_ids"}
        if set(state) != expected:
            raise ValueError(f"peer keys differ: only ours {sorted(set(state) - expected)}, "
                             f"only the peer's {sorted(expected - set(state))}")
    return model.to(getattr(torch, cfg.dtype))


def hf_bert_hidden(cfg: TransformerConfig, params: dict, tokens: np.ndarray, checkpoint_dir: Optional[Path] = None) -> np.ndarray:
    """``transformers.BertModel`` last hidden state (B, T, D) of ``tokens`` (B, T), eval mode, in ``cfg.dtype``.

    Args:
        cfg: encoder configuration (``arch="bert"``).
        params: canonical weights; used when ``checkpoint_dir`` is None.
        tokens: (B, T) int ids; the attention mask is ``tokens != cfg.pad_token_id``.
        checkpoint_dir: load the peer from this directory with ``BertModel.from_pretrained``.

    Raises:
        ImportError: ``transformers`` is not installed.
    """
    import torch
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    if checkpoint_dir is not None:
        # transformers' "Loading weights" bar would print before the run's verdict: for this load only, its bars are
        # made silent through transformers' own hook (set_tqdm_hook returns the previous hook, put back after),
        # not its global switch, which also turns huggingface_hub's bars on or off
        set_hook = getattr(hf_logging, "set_tqdm_hook", None)  # transformers >= 5.x; an older one shows its bar
        previous = set_hook(lambda factory, args, kwargs: hf_logging.EmptyTqdm(*args, **kwargs)) if set_hook else None
        try:
            with torch.random.fork_rng(devices=[]):
                model = BertModel.from_pretrained(str(checkpoint_dir), attn_implementation="eager")
        finally:
            if set_hook is not None:
                set_hook(previous)
        model = model.to(getattr(torch, cfg.dtype))
    else:
        model = hf_bert_model(cfg, params)
    model = model.eval()
    ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=(ids != cfg.pad_token_id).long(),
                    token_type_ids=torch.zeros_like(ids))
    return out.last_hidden_state.numpy()


def _rel(a: np.ndarray, b: np.ndarray, rows: np.ndarray) -> float:
    """``max|a - b| / max|b|`` over the positions ``rows`` (B, T) bool of (B, T, D) arrays."""
    a, b = np.asarray(a, np.float64)[rows], np.asarray(b, np.float64)[rows]
    if a.size == 0:
        return 0.0
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("inf")
    return float(np.abs(a - b).max() / np.abs(b).max())


def peer_checks(cfg: TransformerConfig, params: dict, tokens: np.ndarray,
                checkpoint_dir: Optional[Path] = None) -> list[dict]:
    """Hidden-state comparisons of one batch: the reference (PyTorch) vs transformers, every other framework
    vs the reference (:meth:`parity.runners.framework.Framework.encoder_hidden_states`).

    Returns:
        list of dicts with ``check``, ``dtype``, ``max_rel_err`` (float or None), ``tolerance``,
        ``ok`` (True/False, or None when skipped) and ``note``.
    """
    cfg = cfg.replace(dropout=0.0)
    tol = tolerance_for(cfg.dtype).max_rel_err
    ref = reference_framework()
    ours = get_framework(ref).encoder_hidden_states(cfg, params, tokens)
    real = np.asarray(tokens) != cfg.pad_token_id
    out = []
    if transformers_available():
        peer = hf_bert_hidden(cfg, params, tokens, checkpoint_dir)
        err = _rel(ours, peer, real)
        source = f"BertModel.from_pretrained({checkpoint_dir})" if checkpoint_dir else "BertModel with our weights"
        out.append({"check": f"{ref} vs transformers", "dtype": cfg.dtype, "max_rel_err": err, "tolerance": tol,
                    "ok": err <= tol, "note": f"last hidden state at real tokens (padded: {_rel(ours, peer, ~real):.1e}); "
                    f"peer: {source}"})
    else:
        out.append({"check": f"{ref} vs transformers", "dtype": cfg.dtype, "max_rel_err": None, "tolerance": tol,
                    "ok": None, "note": "skipped: transformers is not installed (pip install -e '.[dev]')"})
    for fw in (f for f in FRAMEWORK_NAMES if f != ref):
        mine = get_framework(fw).encoder_hidden_states(cfg, params, tokens)
        err = _rel(mine, ours, real)
        out.append({"check": f"{fw} vs {ref}", "dtype": cfg.dtype, "max_rel_err": err, "tolerance": tol,
                    "ok": err <= tol, "note": f"last hidden state at real tokens (padded: {_rel(mine, ours, ~real):.1e}), "
                    "same weights and tokens"})
    return out

