"""Model shapes for memory estimates at real sizes: presets, explicit shapes, a Hugging Face ``config.json``.

Framework-neutral (imports neither JAX nor PyTorch). A shape is a :class:`EstimateShape`: the
:class:`jaxremat.models.TransformerConfig`, the batch (B, T) and the precision, from one of three
sources, each of whose fields an explicit option may override:

* a preset (:data:`REAL_SIZE_PRESETS` at real sizes, and every run preset of
  :data:`parity.inputs.presets.PRESETS`, e.g. ``minilm-l6`` at any B and T);
* a Hugging Face ``config.json`` (GPT-2 or BERT keys; :func:`parity.inputs.checkpoints.config_from_hf`),
  the file or its directory;
* explicit sizes (``n_layer``, ``d_model``, ``n_head``, ``seq_len``, ``batch_size``; ``d_ff``
  defaults to ``4 * d_model`` and ``vocab`` to GPT-2's 50257), a GPT.

``precision`` is ``"float32"`` or ``"bfloat16"``: bfloat16 is the harness's mixed precision,
float32 parameters, gradients and AdamW state with the forward pass computed in bfloat16
(``TransformerConfig(compute_dtype="bfloat16")``).

:func:`resolve_shape` checks everything a compile would trip on later, with one line per error:
sizes that do not divide (``n_head`` not dividing ``d_model``), a sequence longer than the
model's positions, and absurd sizes (:func:`check_real_size`: a tensor of the step over
:data:`MAX_TENSOR_BYTES`, more layers than :data:`MAX_LAYERS`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from jaxremat.models import TransformerConfig, get_model, param_shapes

from parity.inputs.checkpoints import config_from_hf
from parity.inputs.model_preset import ModelPreset
from parity.inputs.presets import PRESETS

__all__ = ["ESTIMATE_PRECISIONS", "EstimateShape", "MAX_LAYERS", "MAX_TENSOR_BYTES", "REAL_SIZE_PRESETS",
           "check_real_size", "estimate_presets", "resolve_shape"]

GPT2_VOCAB = 50257
ESTIMATE_PRECISIONS = ("float32", "bfloat16")
"""float32, or bfloat16 mixed precision (float32 parameters, bfloat16 compute)."""

MAX_TENSOR_BYTES = 2**48
"""No tensor of one step may exceed 256 TiB: over a thousand times the largest accelerator's memory
(141 GB), so such a shape is a typo (an extra digit), not a model to plan for one device."""

MAX_LAYERS = 100_000
"""More layers than any trained transformer by two orders of magnitude: a typo."""


def _gpt(name: str, n_layer: int, d_model: int, n_head: int, seq: int, batch: int, what: str) -> ModelPreset:
    cfg = TransformerConfig(vocab_size=GPT2_VOCAB, n_layer=n_layer, d_model=d_model, n_head=n_head,
                            d_ff=4 * d_model, max_seq_len=seq)
    return ModelPreset(name, cfg, batch_size=batch, seq_len=seq,
                       description=f"{what}: {n_layer} layers, d_model {d_model}, {n_head} heads, d_ff {4 * d_model}, "
                                   f"vocab {GPT2_VOCAB}, T={seq}, B={batch}")


REAL_SIZE_PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    _gpt("gpt2-124m", 12, 768, 12, 1024, 8, "GPT-2 small (124M parameters)"),
    _gpt("gpt2-350m", 24, 1024, 16, 1024, 8, "GPT-2 medium (350M parameters)"),
    _gpt("gpt-1.3b", 24, 2048, 16, 2048, 8, "the 1.3B GPT of /work/shared/seeds/002 (A100 80GB table)"),
)}
"""Presets at real sizes, for estimates only (they do not execute on this CPU)."""


def _count(n: int) -> str:
    """``1.32B``, ``124.4M``, ``27.3K``, ``512``."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'B' else 1}f}{unit}"
    return str(n)


def estimate_presets() -> dict[str, ModelPreset]:
    """Every preset an estimate accepts: the real sizes, then the run presets (``gpt-small``, ``minilm-l6``, ...)."""
    return {**REAL_SIZE_PRESETS, **PRESETS}


@dataclasses.dataclass(frozen=True)
class EstimateShape:
    """One model at one batch shape and precision, as the estimates take it.

    Attributes:
        name: the preset's name, the config file's path, or ``"custom"`` (explicit sizes).
        config: the model (``dtype="float32"``; ``compute_dtype="bfloat16"`` for bfloat16).
        batch_size: B (sequences per step; sentences for a BERT encoder).
        seq_len: T (tokens per sequence the model reads).
        precision: ``"float32"`` or ``"bfloat16"`` (:data:`ESTIMATE_PRECISIONS`).
    """

    name: str
    config: TransformerConfig
    batch_size: int
    seq_len: int
    precision: str = "float32"

    @property
    def parameter_count(self) -> int:
        """Number of parameters (every stacked layer)."""
        return sum(math.prod(s) for s in param_shapes(self.config).values())

    def describe(self) -> str:
        """``"gpt-1.3b: 24L D2048 H16 F8192 V50257 T2048 B8 float32 materialized, 1.32B parameters"``; bfloat16 says
        ``"bfloat16 compute (float32 parameters, gradients and AdamW)"``: mixed precision keeps those in float32."""
        c = self.config
        precision = ("bfloat16 compute (float32 parameters, gradients and AdamW)" if self.precision == "bfloat16"
                     else self.precision)
        return (f"{self.name}: {c.n_layer}L D{c.d_model} H{c.n_head} F{c.d_ff} V{c.vocab_size} T{self.seq_len} "
                f"B{self.batch_size} {precision} {c.attention}, {_count(self.parameter_count)} parameters")


def _read_hf(path: str | Path) -> TransformerConfig:
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        hf = json.loads(file.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise ValueError(f"{file} not found: give a Hugging Face config.json or its directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file} is not valid JSON: {exc}") from None
    try:
        return config_from_hf(hf)
    except ValueError as exc:
        raise ValueError(f"{file}: {str(exc).removeprefix('config.json: ')}") from None


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _base(model, config_path, sizes: dict) -> tuple[str, TransformerConfig, int | None, int | None, bool]:
    """``(name, config, preset batch, preset seq, positions fixed)`` of the one source given."""
    if model is not None and config_path is not None:
        raise ValueError("give a preset or a config.json, not both")
    if model is not None:
        presets = estimate_presets()
        if model not in presets:
            raise ValueError(f"unknown model {model!r}; valid models: {', '.join(presets)}")
        p = presets[model]
        return model, p.config.replace(dtype="float32"), p.batch_size, p.seq_len, True
    if config_path is not None:
        return str(config_path), _read_hf(config_path), None, None, True
    missing = [k for k in ("n_layer", "d_model", "n_head") if sizes.get(k) is None]
    if missing:
        raise ValueError(f"give a preset, a config.json, or explicit sizes; missing {', '.join(missing)} "
                         "(d_ff defaults to 4 * d_model, vocab to 50257)")
    for k in ("n_layer", "d_model", "n_head"):
        _positive(k, sizes[k])
    d = sizes["d_model"]
    if d % sizes["n_head"]:
        raise ValueError(f"n_head ({sizes['n_head']}) must divide d_model ({d}); choose n_head among the divisors "
                         f"of {d}")
    return "custom", None, None, None, False


_FIELDS = {"n_layer": "n_layer", "d_model": "d_model", "n_head": "n_head", "d_ff": "d_ff", "vocab": "vocab_size"}


def resolve_shape(model: str | None = None, *, config_path: str | Path | None = None, n_layer: int | None = None,
                  d_model: int | None = None, n_head: int | None = None, d_ff: int | None = None,
                  vocab: int | None = None, seq_len: int | None = None, batch_size: int | None = None,
                  precision: str = "float32", attention: str = "materialized") -> EstimateShape:
    """The :class:`EstimateShape` of a preset, a config.json or explicit sizes (module docstring).

    Args:
        model: a preset name (:func:`estimate_presets`), or None.
        config_path: a Hugging Face ``config.json`` (or its directory), or None.
        n_layer, d_model, n_head, d_ff, vocab: model sizes; with a preset or a config they
            override its fields; alone (no preset, no config) ``n_layer``, ``d_model``, ``n_head``,
            ``seq_len`` and ``batch_size`` are needed.
        seq_len: T; with a preset or a config at most its positions (``n_positions``).
        batch_size: B (even for a BERT encoder, whose batch holds sentence pairs).
        precision: ``"float32"`` or ``"bfloat16"``.
        attention: ``"materialized"`` or ``"fused"`` (:attr:`TransformerConfig.attention`).

    Returns:
        The shape, checked by :func:`check_real_size`.

    Raises:
        ValueError: one line naming the bad value and the fix: an unknown preset, both a preset and
            a config, missing or non-positive sizes, ``n_head`` not dividing ``d_model``, a
            sequence longer than the model's positions, an odd BERT batch, an unknown precision or
            attention, an absurd size.
    """
    sizes = {"n_layer": n_layer, "d_model": d_model, "n_head": n_head, "d_ff": d_ff, "vocab": vocab}
    for k, v in {**sizes, "seq_len": seq_len, "batch_size": batch_size}.items():
        if v is not None:
            _positive(k, v)
    if precision not in ESTIMATE_PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(ESTIMATE_PRECISIONS)}, got {precision!r}")
    name, cfg, batch0, seq0, fixed_positions = _base(model, config_path, sizes)
    batch, seq = batch_size or batch0, seq_len or seq0
    if batch is None or seq is None:
        raise ValueError("explicit sizes need seq_len and batch_size too")
    changes = {field: sizes[opt] for opt, field in _FIELDS.items() if sizes[opt] is not None}
    if cfg is None:
        changes.setdefault("d_ff", 4 * d_model)
        changes.setdefault("vocab_size", GPT2_VOCAB)
        cfg = TransformerConfig(**changes, max_seq_len=seq)
    elif changes:
        try:
            cfg = cfg.replace(**changes)
        except ValueError as exc:
            raise ValueError(f"{name} with {', '.join(f'{k}={v}' for k, v in changes.items())}: {exc}") from None
    if fixed_positions and seq > cfg.max_seq_len:
        raise ValueError(f"{name} has {cfg.max_seq_len} positions; seq_len {seq} exceeds them (use seq_len <= "
                         f"{cfg.max_seq_len})")
    if get_model(cfg.arch).batch == "sentence_pairs" and batch % 2:
        raise ValueError(f"{name} is a {cfg.arch} encoder trained on sentence pairs: batch_size must be even, "
                         f"got {batch}")
    try:
        cfg = cfg.replace(dropout=0.0, dtype="float32", attention=attention,
                          compute_dtype="bfloat16" if precision == "bfloat16" else None)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    shape = EstimateShape(name, cfg, batch, seq, precision)
    check_real_size(shape)
    return shape


def _largest_tensors(shape: EstimateShape) -> dict[str, int]:
    """Elements of the largest tensors of one training step, by what they are."""
    c, B, T = shape.config, shape.batch_size, shape.seq_len
    out = {"stacked MLP weights (n_layer x d_model x d_ff)": c.n_layer * c.d_model * c.d_ff,
           "token embedding (vocab x d_model)": c.vocab_size * c.d_model,
           "logits (B x T x vocab)": B * T * c.vocab_size,
           "MLP activations (B x T x d_ff)": B * T * c.d_ff}
    if c.attention == "materialized":
        out["attention probabilities (B x n_head x T x T)"] = B * c.n_head * T * T
    return out


def check_real_size(shape: EstimateShape) -> None:
    """Refuse absurd sizes before any compile: more than :data:`MAX_LAYERS` layers, or a tensor of
    the step over :data:`MAX_TENSOR_BYTES` (4-byte elements).

    Raises:
        ValueError: one line naming the tensor, its size and the limit.
    """
    if shape.config.n_layer > MAX_LAYERS:
        raise ValueError(f"n_layer {shape.config.n_layer} is absurd (more than {MAX_LAYERS:,} layers); check the "
                         "value")
    for what, elements in _largest_tensors(shape).items():
        if 4 * elements > MAX_TENSOR_BYTES:
            raise ValueError(f"the {what} would hold {4 * elements / 2**40:,.0f} TiB, over the "
                             f"{MAX_TENSOR_BYTES // 2**40} TiB that no device comes near; check the sizes")
