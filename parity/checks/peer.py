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

A training step beside the peer's own checkpointing (:func:`hf_checkpointing_peer`): ``BertModel``
with ``gradient_checkpointing_enable()`` (non-reentrant) against :class:`torchref.encoder.Encoder`
under ``full``, and both without checkpointing, on the same weights and batch: peak and peak
activation bytes, step time (interleaved rounds, ratios with their spread), and loss and gradients
compared against :data:`parity.checks.compare.TOLERANCES`.
"""

from __future__ import annotations

# Deferred imports: PyTorch and transformers load only when the transformers peer runs (an optional dependency).

import time
from pathlib import Path
from typing import Optional

import numpy as np

from jaxremat.models import TransformerConfig
from jaxremat.spec import parse_schedule

from parity.checks.compare import compare_bitwise, cross_check, max_rel_err, tolerance_for
from parity.inputs.checkpoints import canonical_to_hf, hf_config_dict, hf_to_canonical
from parity.runners.framework import FRAMEWORK_NAMES, get_framework, loss_term_scale, reference_framework


def transformers_available() -> bool:
    """True when ``transformers`` can be imported."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _hf_bert_model(cfg: TransformerConfig, params: dict):
    """``transformers.BertModel`` (no pooler, eager attention, ``cfg.dtype``) holding ``params`` (strict keys)."""
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

    if checkpoint_dir is not None:
        with torch.random.fork_rng(devices=[]):
            model = BertModel.from_pretrained(str(checkpoint_dir), attn_implementation="eager")
        model = model.to(getattr(torch, cfg.dtype))
    else:
        model = _hf_bert_model(cfg, params)
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


PEER_STEP_CHECK = "transformers gradient_checkpointing vs torchref full"
STEP_VARIANTS = ("transformers gradient_checkpointing", "torchref full", "transformers none", "torchref none")
"""The four steps of :func:`hf_checkpointing_peer`, in the order of each timing round."""
NOT_ACTIVATION = ("PARAM", "BUFFER", "GRAD", "OPT")
"""MemTracker categories subtracted from a step's peak to give its peak activation bytes (as
:func:`parity.runners.torch_memory.measure_torch` does)."""


def _hf_grads(cfg: TransformerConfig, model) -> dict:
    """The peer's ``.grad`` of every parameter, mapped to the canonical layout (exact)."""
    grads = {k: p.grad.detach().cpu().numpy() for k, p in model.named_parameters()}
    return hf_to_canonical(cfg, grads)


def _enable_checkpointing(peer) -> str:
    """Turn on the peer's non-reentrant checkpointing of every layer; returns the method's name.

    ``activation_checkpointing_enable`` where it exists (transformers >= 5.25, which deprecates the
    older name), else ``gradient_checkpointing_enable``: the same ``torch.utils.checkpoint`` per layer.
    """
    if hasattr(peer, "activation_checkpointing_enable"):
        peer.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        return "activation_checkpointing_enable"
    peer.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return "gradient_checkpointing_enable"


def _step_variants(cfg: TransformerConfig, params: dict, ids) -> dict:
    """``{variant: (model, loss_fn, grads_fn)}`` of :data:`STEP_VARIANTS`: two peers and one torchref encoder."""
    import torch
    from torchref.encoder import Encoder, contrastive_loss, encoder_loss, mean_pool

    mask = ids != cfg.pad_token_id
    types = torch.zeros_like(ids)
    ours = Encoder.from_params(cfg, params).train()
    peers = {}
    for checkpointing in (True, False):
        peer = _hf_bert_model(cfg, params).train()  # checkpointing acts in training mode only
        if checkpointing:
            _enable_checkpointing(peer)
        peers[checkpointing] = peer

    def peer_loss(peer):
        hidden = peer(input_ids=ids, attention_mask=mask.long(), token_type_ids=types, use_cache=False).last_hidden_state
        return contrastive_loss(mean_pool(hidden, mask))

    return {
        "transformers gradient_checkpointing": (peers[True], lambda: peer_loss(peers[True]),
                                                lambda: _hf_grads(cfg, peers[True])),
        "torchref full": (ours, lambda: encoder_loss(ours, ids, parse_schedule("full")),
                          lambda: ours.to_params(grads=True)),
        "transformers none": (peers[False], lambda: peer_loss(peers[False]), lambda: _hf_grads(cfg, peers[False])),
        "torchref none": (ours, lambda: encoder_loss(ours, ids, parse_schedule("none")),
                          lambda: ours.to_params(grads=True)),
    }


def _ratios(times: dict, a: str, b: str) -> tuple[float, list[float]]:
    """Median and ``[min, max]`` of the per-round ratios ``times[a][r] / times[b][r]``."""
    r = [x / y for x, y in zip(times[a], times[b], strict=True)]
    return float(np.median(r)), [min(r), max(r)]


def _measure_steps(variants: dict, repeats: int) -> tuple[dict, dict, dict]:
    """``(results, memory, times)``: each variant's loss and gradients (first step, also the warm-up), its
    MemTracker peak (second step), and ``repeats`` interleaved timed steps (rounds in :data:`STEP_VARIANTS` order)."""
    from torchref.memory import peak_step_bytes

    def step(model, loss_fn):
        model.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        return loss

    results, memory = {}, {}
    for name, (model, loss_fn, grads_fn) in variants.items():
        loss = step(model, loss_fn)
        results[name] = (loss.detach().numpy().copy(), grads_fn())
        peak = peak_step_bytes(lambda: step(model, loss_fn), model)
        act = peak.peak_bytes - sum(v for k, v in peak.breakdown.items() if k in NOT_ACTIVATION)
        memory[name] = (int(peak.peak_bytes), int(act), peak.source)
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, (model, loss_fn, _) in variants.items():
            t0 = time.perf_counter()
            step(model, loss_fn)
            times[name].append(time.perf_counter() - t0)
    return results, memory, times


def hf_checkpointing_peer(cfg: TransformerConfig, params: dict, tokens: np.ndarray, *, repeats: int = 3) -> dict:
    """Hugging Face ``BertModel`` with gradient checkpointing beside torchref's encoder under ``full``: one training step.

    The peer is ``transformers.BertModel`` built from our weights (as in :func:`hf_bert_hidden`),
    with ``gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})``
    (``activation_checkpointing_enable``, its new name, where transformers has it): every
    ``BertLayer`` recomputed in the backward pass, the same blocks :data:`jaxremat.spec.full` checkpoints. One step is: gradients set to None, forward, the contrastive loss
    (:func:`torchref.encoder.contrastive_loss` of :func:`torchref.encoder.mean_pool` of the last hidden
    state; :func:`torchref.encoder.encoder_loss` for torchref), backward; no optimizer. Dropout is
    off (``cfg.dropout`` is ignored), so both compute the same function. The four steps of
    :data:`STEP_VARIANTS` (each framework with and without checkpointing) run on the same weights and
    batch: the loss and gradients of the first step (also the warm-up), the peak of a second step
    (:func:`torchref.memory.peak_step_bytes`: ``torch MemTracker (cpu)`` with the model tracked, or
    ``torch.cuda.max_memory_allocated`` on a CUDA model), then ``repeats`` timing rounds, each
    running the four steps in turn (A B A B).

    Args:
        cfg: encoder configuration (``arch="bert"``).
        params: canonical weights in ``cfg.dtype``.
        tokens: (B, T) int padded ids of B/2 pairs (rows 2i, 2i+1); mask ``tokens != cfg.pad_token_id``.
        repeats: timing rounds (>= 1).

    Returns:
        dict with
        ``check`` (:data:`PEER_STEP_CHECK`), ``dtype``, ``batch_size``, ``seq_len``;
        ``peak_bytes``, ``peak_activation_bytes``, ``step_time_s`` (median of the rounds): dicts keyed by
        :data:`STEP_VARIANTS`, bytes and seconds; the peak activation is the peak less MemTracker's
        :data:`NOT_ACTIVATION` categories (parameters, buffers, gradients);
        ``peak_ratio``: peak activation bytes of the checkpointed peer over torchref ``full``'s;
        ``time_ratio``, ``time_ratio_range``: median and ``[min, max]`` over the rounds of the step time
        of the checkpointed peer over torchref ``full``'s (same round);
        ``none``: the same three ratios for the two ``none`` steps (``peak_ratio``, ``time_ratio``,
        ``time_ratio_range``), so the first ones can be read against them;
        ``checkpointing_peak_ratio``: ``{"transformers": ..., "torchref": ...}``, each framework's
        checkpointed peak activation over its own ``none``'s;
        ``loss_err`` (loss difference over the loss's term scale, :func:`parity.checks.compare.loss_error`),
        ``loss_abs_diff``, ``max_rel_err_grads`` (:func:`parity.checks.compare.max_rel_err` over the
        canonical gradients), ``worst_grad``, ``tolerance`` (the gradient bound) and ``tolerance_loss``
        of :data:`parity.checks.compare.TOLERANCES` for ``cfg.dtype``: checkpointed peer against
        torchref ``full`` (:func:`parity.checks.compare.cross_check`);
        ``none_max_rel_err_grads``: the same gradient error of the two ``none`` steps;
        ``bitwise_to_none``: ``{"transformers": bool, "torchref": bool}``, whether each framework's
        checkpointed loss and gradients are byte for byte its ``none``'s;
        ``ok``: the checkpointed peer's loss and gradients are within the tolerances;
        ``note``: the counter, the rounds and the peer's version, in words.

    Raises:
        ImportError: ``transformers`` is not installed.
        ValueError: ``repeats`` < 1, or a bad batch (see :func:`torchref.encoder.encoder_loss`).
    """
    import torch
    import transformers

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    cfg = cfg.replace(dropout=0.0)
    ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    results, memory, times = _measure_steps(_step_variants(cfg, params, ids), repeats)
    hf, ours, hf_none, ours_none = STEP_VARIANTS
    cross = cross_check(results[hf][0], results[ours][0], results[hf][1], results[ours][1],
                        loss_term_scale(cfg, params, tokens), cfg.dtype)
    act = {k: m[1] for k, m in memory.items()}
    ratio, spread = _ratios(times, hf, ours)
    none_ratio, none_spread = _ratios(times, hf_none, ours_none)
    bitwise = {fw: compare_bitwise({"loss": results[a][0], **results[a][1]},
                                   {"loss": results[b][0], **results[b][1]}).equal
               for fw, a, b in (("transformers", hf, hf_none), ("torchref", ours, ours_none))}
    return {
        "check": PEER_STEP_CHECK, "dtype": cfg.dtype, "batch_size": int(ids.shape[0]), "seq_len": int(ids.shape[1]),
        "peak_bytes": {k: m[0] for k, m in memory.items()}, "peak_activation_bytes": act,
        "step_time_s": {k: float(np.median(t)) for k, t in times.items()},
        "peak_ratio": act[hf] / act[ours], "time_ratio": ratio, "time_ratio_range": spread,
        "none": {"peak_ratio": act[hf_none] / act[ours_none], "time_ratio": none_ratio, "time_ratio_range": none_spread},
        "checkpointing_peak_ratio": {"transformers": act[hf] / act[hf_none], "torchref": act[ours] / act[ours_none]},
        "loss_err": cross["loss_err"], "loss_abs_diff": cross["loss_abs_diff"],
        "max_rel_err_grads": cross["max_rel_err_grads"], "worst_grad": cross["worst_grad"],
        "tolerance": cross["tolerance"], "tolerance_loss": cross["tolerance_loss"],
        "none_max_rel_err_grads": max_rel_err(results[hf_none][1], results[ours_none][1]),
        "bitwise_to_none": bitwise, "ok": cross["ok"],
        "note": f"one step (forward, contrastive loss, backward; no optimizer; dropout 0) on the same weights and "
                f"batch; peak: {memory[ours][2]}, peak activation = peak less {', '.join(NOT_ACTIVATION)}; time: "
                f"{repeats} interleaved rounds, median [min-max] of the per-round ratios; transformers "
                f"{transformers.__version__} BertModel, eager attention, checkpointing of every layer, use_reentrant=False",
    }
