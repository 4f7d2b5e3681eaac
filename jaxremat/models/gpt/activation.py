"""What one transformer block keeps for its backward pass, tensor by tensor, in JAX and PyTorch.

A pure-Python account (no PyTorch; JAX only to ask which rows its ``logsumexp`` keeps, see
:func:`outside_tensors`) of the tensors each framework keeps from the forward
pass of one GPT block without remat (``none``), with shapes as formulas of B (batch), T
(sequence), D (``d_model``), F (``d_ff``), H (``n_head``), hd (``head_dim``) and the dtype.
It is checked *exactly* (bytes and shapes, tensor by tensor) against the measured lists,
:func:`jaxremat.block_memory.block_residuals` and :func:`torchref.block_memory.block_saved`
(``tests/models/gpt/test_activation.py``, with hypothesis over small sizes).

Each tensor carries ``name``, the block step whose backward pass first reads it: the activation
region (:data:`jaxremat.spec.names.ACTIVATION_NAMES`) of the op that keeps it, or None for the
causal mask, which is kept by the masking step outside any named region. That is how the PyTorch
recorder labels saved tensors; the JAX account uses the same rule, so the two lists can be set
side by side by name.

Why the lists are so close: PyTorch's fused kernels (``native_layer_norm``, ``softmax``,
``gelu``) save their input (or output) and one or two statistics and recompute the rest inside
their backward kernels; JAX's block is built from :mod:`jaxremat.ops`, whose ``custom_jvp`` rules
read as little (LayerNorm: its normalised input and ``rsqrt``; GELU: its derivative; softmax: its
output). JAX keeps the normalised input of each LayerNorm where PyTorch keeps its input, and no
causal mask (the softmax's backward does not need it), so one JAX block keeps ``T^2`` bytes and
``2BT`` elements fewer than PyTorch's (``docs/memory-model.md``; before :mod:`jaxremat.ops`,
autodiff of the composed primitives kept about 2.2x PyTorch's bytes).

Korthikanti et al. 2022 (arXiv:2205.05198, section 4) count ``sbh(34 + 5as/h)`` bytes per layer
in 16-bit with dropout; without dropout their terms are ``8BTD + 2BTF`` elements plus ``BHT^2``
(the softmax output), which is exactly the PyTorch account below minus the LayerNorm statistics
(``4BT``) and the boolean causal mask (``T^2`` bytes) they leave out (:func:`korthikanti_layer_bytes`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

from ...spec.schedules import Schedule
from ..config import TransformerConfig

# Deferred imports: JAX (and jaxremat.memory, which loads it) only where the JAX account's cross-entropy rows ask
# the installed JAX what its logsumexp keeps (_jax_logsumexp_keeps_its_max); the account is otherwise pure Python.

FRAMEWORKS = ("jax", "torch")
_ITEMSIZE = {"float32": 4, "float64": 8, "bool": 1, "int32": 4, "int64": 8}


@dataclasses.dataclass(frozen=True)
class TensorAccount:
    """One tensor a framework keeps for the backward pass.

    Attributes:
        name: block step (activation name) whose backward first reads it; None for the causal mask.
        what: what the tensor holds, in words.
        shape: its shape (as the framework reports it).
        dtype: ``"float32"``, ``"float64"``, ``"bool"``, ``"int32"`` or ``"int64"``.
        bytes: bytes it occupies (PyTorch: its storage's size, which for a view is the whole storage).
        tag: JAX only, the ``checkpoint_name`` the measured residual carries (None if untagged).
        per_layer: False for a tensor that does not depend on the layer (JAX's causal-mask
            broadcasts): a scan hoists it out of the loop, so a stack keeps it once, not N times.
    """

    name: str | None
    what: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    tag: str | None = None
    per_layer: bool = True


def _t(name, what, shape, dtype, *, tag=None, per_layer=True, nbytes=None) -> TensorAccount:
    shape = tuple(int(s) for s in shape)
    size = nbytes if nbytes is not None else math.prod(shape) * _ITEMSIZE[dtype]
    return TensorAccount(name, what, shape, dtype, int(size), tag, per_layer)


def _check(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> None:
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    if batch < 1 or not 1 <= seq <= cfg.max_seq_len:
        raise ValueError(f"need batch >= 1 and 1 <= seq <= {cfg.max_seq_len}, got batch={batch}, seq={seq}")
    if cfg.dropout:
        raise ValueError(f"the activation model covers dropout 0 (got {cfg.dropout}); with dropout both "
                         "frameworks also keep a mask per dropout site; use cfg.replace(dropout=0.0)")


def check_sizes(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> None:
    """Raise ValueError for an unknown framework, sizes out of range or dropout (the checks every count
    here makes; the planners' menus, measured on the block, need no more)."""
    _check(framework, cfg, batch, seq)


def _check_materialized(cfg: TransformerConfig) -> None:
    if getattr(cfg, "attention", "materialized") != "materialized":
        raise ValueError(f"the per-tensor account covers attention='materialized' (got {cfg.attention!r}): a fused "
                         "attention call keeps what its implementation keeps; measure it instead")


def _jax_layer_norm(B, T, D, dt, name) -> list[TensorAccount]:
    return [
        _t(name, "rsqrt(var + eps)", (B, T, 1), dt),
        _t(name, "normalised input (x - mean) * rsqrt(var + eps)", (B, T, D), dt),
    ]


def jax_block_tensors(cfg: TransformerConfig, batch: int, seq: int) -> list[TensorAccount]:
    """The residuals of one JAX block under ``none``, in JAX's program order (see module doc).

    The block is built from :mod:`jaxremat.ops` (LayerNorm, GELU and the masked softmax as
    ``custom_jvp`` s whose backward reads what PyTorch's reads; attention products as one
    ``dot_general`` each, so no unit axis is squeezed into a second copy).
    """
    _check("jax", cfg, batch, seq)
    _check_materialized(cfg)
    B, T, D, F, H, hd, dt = batch, seq, cfg.d_model, cfg.d_ff, cfg.n_head, cfg.head_dim, cfg.dtype
    return [
        *_jax_layer_norm(B, T, D, dt, "attn_norm"),
        _t("qkv_proj", "ln_1 output, input of the qkv projection", (B, T, D), dt, tag="attn_norm"),
        _t("attn_scores", "q, heads split", (B, H, T, hd), dt),
        _t("attn_scores", "k, heads split", (B, H, T, hd), dt),
        _t("attn_out", "v, heads split", (B, H, T, hd), dt),
        _t("attn_out", "softmax probabilities (read by probs @ v and by the softmax's backward)",
           (B, H, T, T), dt, tag="attn_probs"),
        _t("out_proj", "attention context, heads merged: input of the out projection", (B, T, D), dt),
        *_jax_layer_norm(B, T, D, dt, "mlp_norm"),
        _t("mlp_hidden", "ln_2 output, input of the MLP up-projection", (B, T, D), dt, tag="mlp_norm"),
        _t("mlp_act", "GELU derivative gelu'(x) at the up-projection output", (B, T, F), dt),
        _t("mlp_out", "GELU output, input of the MLP down-projection", (B, T, F), dt, tag="mlp_act"),
    ]


def torch_block_tensors(cfg: TransformerConfig, batch: int, seq: int) -> list[TensorAccount]:
    """The tensors one PyTorch block saves under ``none`` (block input excluded), in save order.

    q, k, v are copies made by the head split's ``reshape``, except when B == 1 or H == 1: then
    the reshape is a view of the qkv projection's output and the one storage (3D wide) is counted
    once, where ``q @ k^T`` saves it.
    """
    _check("torch", cfg, batch, seq)
    _check_materialized(cfg)
    B, T, D, F, H, hd, dt = batch, seq, cfg.d_model, cfg.d_ff, cfg.n_head, cfg.head_dim, cfg.dtype
    isz = _ITEMSIZE[dt]
    if B == 1 or H == 1:
        qkv = [_t("attn_scores", "q, k, v: views of the qkv projection output (one storage)",
                  (B * H, hd, T), dt, nbytes=B * T * 3 * D * isz)]
        v = []
    else:
        qkv = [_t("attn_scores", "k^T, heads split (a copy)", (B * H, hd, T), dt),
               _t("attn_scores", "q, heads split (a copy)", (B * H, T, hd), dt)]
        v = [_t("attn_out", "v, heads split (a copy)", (B * H, T, hd), dt)]
    return [
        _t("attn_norm", "ln_1 mean", (B, T, 1), dt),
        _t("attn_norm", "ln_1 rstd", (B, T, 1), dt),
        _t("qkv_proj", "ln_1 output, input of the qkv projection", (B * T, D), dt),
        *qkv,
        _t(None, "causal mask ~tril(T, T)", (T, T), "bool"),
        _t("attn_probs", "softmax probabilities", (B, H, T, T), dt),
        *v,
        _t("out_proj", "attention context, heads merged: input of the out projection", (B * T, D), dt),
        _t("mlp_norm", "ln_2 input: residual stream after attention", (B, T, D), dt),
        _t("mlp_norm", "ln_2 mean", (B, T, 1), dt),
        _t("mlp_norm", "ln_2 rstd", (B, T, 1), dt),
        _t("mlp_hidden", "ln_2 output, input of the MLP up-projection", (B * T, D), dt),
        _t("mlp_act", "MLP up-projection output, GELU input", (B * T, F), dt),
        _t("mlp_out", "GELU output, input of the MLP down-projection", (B * T, F), dt),
    ]


def block_tensors(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> list[TensorAccount]:
    """:func:`jax_block_tensors` or :func:`torch_block_tensors`.

    Raises:
        ValueError: unknown framework, bad sizes, ``cfg.dropout > 0``, or fused attention (``cfg.attention``).
    """
    _check(framework, cfg, batch, seq)
    return (jax_block_tensors if framework == "jax" else torch_block_tensors)(cfg, batch, seq)


def block_bytes(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Bytes one block keeps under ``none``, block input excluded: what the per-block measurement sees."""
    return sum(t.bytes for t in block_tensors(framework, cfg, batch, seq))


def bytes_by_name(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> dict[str | None, int]:
    """Per-block bytes grouped by :attr:`TensorAccount.name`, in block order."""
    out: dict[str | None, int] = {}
    for t in block_tensors(framework, cfg, batch, seq):
        out[t.name] = out.get(t.name, 0) + t.bytes
    return out


def boundary_bytes(cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Bytes of one block input (B, T, D): what a checkpointed segment keeps."""
    return batch * seq * cfg.d_model * _ITEMSIZE[cfg.dtype]


def layer_bytes(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Bytes one block of a stack keeps under ``none`` (the chain model's unit, in bytes).

    PyTorch: the block's tensors plus its input (saved by ``ln_1``). JAX: the block's per-layer
    tensors (the loop-invariant mask broadcasts are kept once per stack, not per layer; the block
    input is not kept: LayerNorm keeps ``x - mean`` instead).
    """
    tensors = block_tensors(framework, cfg, batch, seq)
    per_layer = sum(t.bytes for t in tensors if t.per_layer)
    return per_layer + (boundary_bytes(cfg, batch, seq) if framework == "torch" else 0)


def stack_invariant_bytes(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Bytes a stack keeps once however deep it is (JAX's hoisted mask broadcasts; 0 in PyTorch)."""
    return sum(t.bytes for t in block_tensors(framework, cfg, batch, seq) if not t.per_layer)


@functools.lru_cache(maxsize=None)
def _jax_logsumexp_keeps_its_max() -> bool:
    """Whether the installed ``jax.nn.logsumexp`` keeps ``|max|`` (float) and the ``max >= x`` mask (bool) for its
    backward pass besides ``exp(x - logsumexp)``.

    JAX up to 0.12.0.1 differentiates its composed primitives and keeps all three; JAX 0.12.1 gives it a
    ``custom_jvp`` that keeps the exp alone. Traced once on an abstract (1, 2) float32 input, with
    :func:`jaxremat.memory.saved_residuals`; the only JAX the account asks for (the cross-entropy's rows).
    """
    import jax
    import jax.numpy as jnp

    from ...memory import saved_residuals
    x = jax.ShapeDtypeStruct((1, 2), jnp.float32)  # abstract: no device starts (an estimate runs without one)
    kept = saved_residuals(lambda v: jax.nn.logsumexp(v, axis=-1).sum(), x)
    return len([r for r in kept if not r.is_argument]) > 1


def outside_tensors(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> list[TensorAccount]:
    """Tensors kept outside the block stack: embedding, final LayerNorm, tied head, cross-entropy.

    Token ids: JAX gets (B, T+1) int32, PyTorch int64 (as the parity runners pass them). JAX's
    cross-entropy keeps ``exp(logits - logsumexp)``, and with JAX <= 0.12.0.1 also ``|max|`` and the
    ``max >= logits`` mask: the rows follow the installed JAX (:func:`_jax_logsumexp_keeps_its_max`).
    """
    _check(framework, cfg, batch, seq)
    B, T, D, V, dt = batch, seq, cfg.d_model, cfg.vocab_size, cfg.dtype
    if framework == "jax":
        return [
            _t(None, "embedding gather indices", (B, T, 1), "int32"),
            *_jax_layer_norm(B, T, D, dt, None),
            _t(None, "ln_f output, input of the tied head", (B, T, D), dt),
            _t(None, "cross-entropy: exp(logits - logsumexp)", (B, T, V), dt),
            *([_t(None, "cross-entropy: |logsumexp max|", (B, T), dt),
               _t(None, "cross-entropy: max >= logits mask", (B, T), "bool")]
              if _jax_logsumexp_keeps_its_max() else []),
            _t(None, "cross-entropy: target indices", (B, T, 1, 1), "int32"),
        ]
    return [
        _t(None, "token ids (the whole (B, T+1) storage the inputs view)", (B, T + 1), "int64"),
        _t(None, "ln_f input: the last block's output", (B, T, D), dt),
        _t(None, "ln_f mean", (B, T, 1), dt),
        _t(None, "ln_f rstd", (B, T, 1), dt),
        _t(None, "ln_f output, input of the tied head", (B * T, D), dt),
        _t(None, "log_softmax output", (B * T, V), dt),
        _t(None, "targets (a copy)", (B * T,), "int64"),
        _t(None, "cross-entropy total weight", (), dt),
    ]


def predict_saved_bytes(framework: str, cfg: TransformerConfig, batch: int, seq: int, schedule: Schedule) -> int:
    """Activation bytes the whole model keeps after its forward pass under ``schedule``.

    Outside tensors, plus per segment: a checkpointed segment keeps its input (one boundary), a
    plain one keeps ``length * layer_bytes``; in JAX the stack's invariants once when any plain
    segment exists. Parameters are not counted.

    Raises:
        ValueError: as :func:`block_tensors`, or a schedule invalid for ``cfg.n_layer``.
    """
    segs = schedule.segments_for(cfg.n_layer)
    unit, bnd = layer_bytes(framework, cfg, batch, seq), boundary_bytes(cfg, batch, seq)
    total = sum(t.bytes for t in outside_tensors(framework, cfg, batch, seq))
    total += sum(bnd if s.checkpointed else s.length * unit for s in segs)
    if any(not s.checkpointed for s in segs):
        total += stack_invariant_bytes(framework, cfg, batch, seq)
    return total


def _chain_peak(segs, unit: int, bnd: int, inv: int) -> int:
    """Largest live stack bytes over the backward pass (the chain model of :mod:`.cost`, in bytes)."""
    kept_below, peak = 0, 0
    for j, seg in enumerate(segs):
        if seg.inner is None:
            seg_peak = seg.length * unit + (bnd if seg.checkpointed else 0)
        else:
            seg_peak = _chain_peak(seg.inner.segments_for(seg.length), unit, bnd, inv)
        live = j * bnd + kept_below + seg_peak + inv
        peak = max(peak, live)
        kept_below += 0 if seg.checkpointed else seg.length * unit
    return peak


def predict_peak_activation_bytes(framework: str, cfg: TransformerConfig, batch: int, seq: int,
                                  schedule: Schedule) -> int:
    """Predicted peak of live activation bytes over one training step (parameters, gradients and
    optimizer state excluded).

    The chain model (Chen et al. 2016, arXiv:1604.06174; :func:`jaxremat.spec.peak_units`) in
    bytes: while checkpointed segment j is recomputed and run backward, the boundaries below it,
    what plain segments below it keep, and segment j's recomputed layers are live, plus the
    outside tensors and the gradient of the logits (B, T, V) the backward pass starts from; the
    peak is the largest of these and of the end of the forward pass. Working buffers of a single
    op are not modelled; the measurement adds them (the report flags gaps above 10%). JAX's
    reverse segment loop (:mod:`jaxremat.segment_vjp`) reads each layer's parameters and writes
    each layer's gradient in place, so no copy of the parameters is added.
    """
    segs = schedule.segments_for(cfg.n_layer)
    unit, bnd = layer_bytes(framework, cfg, batch, seq), boundary_bytes(cfg, batch, seq)
    inv = chain_invariant_bytes(framework, cfg, batch, seq)
    outside = sum(t.bytes for t in outside_tensors(framework, cfg, batch, seq))
    stack = max(_chain_peak(segs, unit, bnd, inv),
                predict_saved_bytes(framework, cfg, batch, seq, schedule) - outside)
    return non_stack_peak_bytes(framework, cfg, batch, seq) + stack


def chain_invariant_bytes(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> int:
    """The stack invariants the chain's peak holds while a segment is recomputed: JAX's
    :func:`stack_invariant_bytes` (kept once per stack by the compiled loop); 0 in PyTorch, whose
    recompute builds its own masks."""
    return stack_invariant_bytes(framework, cfg, batch, seq) if framework == "jax" else 0


def non_stack_peak_bytes(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Bytes outside the block stack at the backward pass's peak: the tensors kept outside it
    (:func:`outside_tensors`) and the gradient of the logits (B, T, V) the backward pass starts from.

    :func:`predict_peak_activation_bytes` is this plus the stack's peak; the planner
    (:func:`jaxremat.planner.plan_gpt`, :func:`torchref.planner.plan_gpt`) gives the stack what a
    budget leaves after it.
    """
    outside = sum(t.bytes for t in outside_tensors(framework, cfg, batch, seq))
    return outside + batch * seq * cfg.vocab_size * _ITEMSIZE[cfg.dtype]


def korthikanti_layer_bytes(batch: int, seq: int, d_model: int, n_head: int, *, bytes_per_element: int = 2,
                            dropout: bool = True, d_ff: int | None = None) -> int:
    """Korthikanti et al. 2022 (arXiv:2205.05198, eq. 1), per layer: ``sbh(34 + 5as/h)`` at 2 bytes.

    Generalised to any element size and ``d_ff`` (their F = 4h): ``(8BTD + 2BTF + BHT^2)``
    elements, plus with dropout the masks (``2BTD + BHT^2`` bytes) and the dropped-out
    probabilities (``BHT^2`` elements).
    """
    F = 4 * d_model if d_ff is None else d_ff
    B, T, D, H, e = batch, seq, d_model, n_head, bytes_per_element
    total = (8 * B * T * D + 2 * B * T * F + B * H * T * T) * e
    if dropout:
        total += 2 * B * T * D + B * H * T * T + B * H * T * T * e
    return total
