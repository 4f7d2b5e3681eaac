"""Hugging Face ``BertModel`` with its own gradient checkpointing beside torchref's encoder under ``full``.

One training step (forward, the contrastive loss, backward) of four variants on the same weights and
batch: the peer with ``gradient_checkpointing_enable()`` (non-reentrant), torchref's
:class:`torchref.encoder.Encoder` under ``full``, and both without checkpointing. Measured: the peak
and peak activation bytes (torch's MemTracker on CPU, the CUDA allocator on a GPU model), the step
time (interleaved rounds, ratios with their spread), and the loss and gradients of the checkpointed
peer against torchref ``full`` within :data:`parity.checks.compare.TOLERANCES`. Reached through
PyTorch's ``peer_step_rows`` verb (:mod:`parity.runners.torch_framework`).
"""

from __future__ import annotations

# Deferred imports: transformers (an optional dependency) loads only when the peer step runs.

import time

import numpy as np
import torch

from jaxremat.models import TransformerConfig
from jaxremat.spec import parse_schedule
from torchref.encoder import Encoder, contrastive_loss, encoder_loss, mean_pool
from torchref.memory import peak_step_bytes

from parity.checks.compare import compare_bitwise, cross_check, max_rel_err
from parity.checks.peer import hf_bert_model, transformers_available
from parity.inputs.checkpoints import hf_to_canonical
from parity.runners.torch_loss_terms import loss_term_scale


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
    mask = ids != cfg.pad_token_id
    types = torch.zeros_like(ids)
    ours = Encoder.from_params(cfg, params).train()
    peers = {}
    for checkpointing in (True, False):
        peer = hf_bert_model(cfg, params).train()  # checkpointing acts in training mode only
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

    The peer is ``transformers.BertModel`` built from our weights (:func:`parity.checks.peer.hf_bert_model`),
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


def peer_step_rows(cfg: TransformerConfig, params: dict, tokens: np.ndarray, *, repeats: int = 3) -> list[dict]:
    """``[hf_checkpointing_peer(...)]`` for a BERT encoder, a skipped row when ``transformers`` is not installed
    (``ok`` None, never passed), ``[]`` for another architecture."""
    if cfg.arch != "bert":
        return []
    if not transformers_available():
        return [{"check": PEER_STEP_CHECK, "dtype": cfg.dtype, "ok": None,
                 "note": "skipped: transformers is not installed (pip install -e '.[dev]')"}]
    return [hf_checkpointing_peer(cfg, params, tokens, repeats=repeats)]
