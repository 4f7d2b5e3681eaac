"""Lean building blocks: LayerNorm, GELU and masked softmax whose backward keeps what PyTorch's keeps.

JAX differentiates a composed function primitive by primitive, and every intermediate its
linearization reads becomes a residual: a LayerNorm written as ``(x - mean) * rsqrt(var + eps)``
keeps the centred input, ``2 (x - mean)``, the normalised input and two statistics; a tanh-GELU keeps
its input and four (B, T, F) intermediates; a masked softmax keeps ``exp(scores - max)``, the row
sums, their inverse square and a broadcast mask. PyTorch's fused kernels (``native_layer_norm``,
``gelu``, ``softmax``) save one tensor and one or two statistics and recompute the rest inside their
backward kernels. On the same GPT block that made JAX keep about 2.2x PyTorch's bytes under no
remat (docs/memory-model.md).

Each op here is a :func:`jax.custom_jvp` whose tangent rule is written so that the only values it
reads from the forward pass are the ones PyTorch's backward reads:

===================  ==========================================  ==========================================
op                   residuals (JAX, this module)                PyTorch's saved tensors
===================  ==========================================  ==========================================
:func:`layer_norm`   normalised input (..., D), ``rsqrt`` (..., 1)  input (..., D), mean and rstd (..., 1)
:func:`gelu`         ``gelu'(x)`` (...)                           input (...)
:func:`masked_softmax`  output (..., T)                           output (..., T) (and the mask)
===================  ==========================================  ==========================================

Why ``custom_jvp`` and not ``custom_vjp``: a JVP rule is differentiated like any other code, so the
ops work under forward mode (``jax.jvp``, Hessian-vector products), under ``vmap`` and inside
``jax.checkpoint`` with every policy: the rule's linear part is partially evaluated, its residuals
are ordinary values of the forward pass, and a checkpointed segment recomputes them exactly as it
recomputes any other op, no more often than the schedule says (a ``custom_vjp`` rule's ``fwd``
is re-run inside each recompute instead, and ``optimize_remat=True`` keeps its residuals for the
backward pass instead of recomputing them; see docs/framework-differences.md).

The forward values are bitwise those of the plain formulations (the primal functions are the same
expressions); gradients differ from autodiff of the plain formulations by rounding only (the
derivative is computed by an equivalent formula), within the cross-framework tolerance table
(``tests/jaxremat/test_ops.py``).

Sources: Ba et al. 2016 (LayerNorm, arXiv:1607.06450); Hendrycks & Gimpel 2016 (GELU,
arXiv:1606.08415); PyTorch's ``native_layer_norm_backward``, ``gelu_backward`` and
``_softmax_backward_data`` for what is kept; JAX's ``jax.nn.softmax`` custom JVP
(``jax_softmax_custom_jvp``) for the softmax rule.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from .layer_pass import isolate, predicate

__all__ = ["batched_matmul", "gelu", "layer_norm", "masked_softmax"]


def _stats(x, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return mean, lax.rsqrt(var + eps)


def _layer_norm_parts(x, weight, bias, eps):
    # the statistics as a computation of their own (module docstring, "Bits")
    mean, rstd = isolate(lambda x: _stats(x, eps), x, predicate((weight, x)))
    centred = x - mean
    normed = centred * rstd
    return normed * weight + bias, normed, rstd


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over the last axis (biased variance).

    The math of ``torch.nn.LayerNorm``. Its backward reads the normalised input and ``rsqrt(var +
    eps)`` only (PyTorch's reads the input, mean and rstd: the same bytes).

    Args:
        x: (..., D) float.
        weight, bias: (D,), same dtype as ``x``.
        eps: added to the variance (a Python float).

    Returns:
        (..., D), dtype of ``x``.

    Why ``lax.rsqrt`` and not ``/ jnp.sqrt``: XLA's algebraic simplifier rewrites ``a / sqrt(b)``
    into ``a * rsqrt(b)``, and under ``jit`` it did so in some programs and not in others, so
    gradients drifted in the last bits between remat schedules; with ``rsqrt`` written out every
    program runs the same instruction (tests/jaxremat/test_render.py).
    """
    return _layer_norm_parts(x, weight, bias, eps)[0]


@layer_norm.defjvp
def _layer_norm_jvp(eps, primals, tangents):
    x, weight, bias = primals
    dx, dweight, dbias = tangents
    y, normed, rstd = _layer_norm_parts(x, weight, bias, eps)
    # d normed = rstd * (dx - mean(dx) - normed * mean(normed * dx)); every product below has a
    # tangent operand, so only ``normed``, ``rstd`` and ``weight`` are read from the forward pass.
    dcentred = dx - jnp.mean(dx, axis=-1, keepdims=True)
    dnormed = (dcentred - normed * jnp.mean(normed * dx, axis=-1, keepdims=True)) * rstd
    return y, dnormed * weight + normed * dweight + dbias


def _gelu_tanh_derivative(x):
    c = math.sqrt(2.0 / math.pi)
    x2 = x * x
    t = jnp.tanh(c * (x + 0.044715 * (x2 * x)))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (c * (1.0 + 3.0 * 0.044715 * x2))


def _gelu_erf_derivative(x):
    cdf = 0.5 * lax.erfc(-x * math.sqrt(0.5))
    pdf = jnp.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return cdf + x * pdf


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def gelu(x: jax.Array, approximate: bool = True) -> jax.Array:
    """GELU, ``x * Phi(x)``: the tanh approximation (GPT-2) or the exact erf form (BERT).

    Forward values are bitwise ``jax.nn.gelu(x, approximate=approximate)``; the backward reads one
    tensor of the input's size, the derivative ``gelu'(x)`` computed in the forward pass (PyTorch's
    ``gelu_backward`` reads the input, of the same size).

    Args:
        x: any shape, float.
        approximate: True for ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, False for
            ``0.5 x erfc(-x / sqrt(2))``.

    Returns:
        Same shape and dtype as ``x``.
    """
    return jax.nn.gelu(x, approximate=approximate)


@gelu.defjvp
def _gelu_jvp(approximate, primals, tangents):
    (x,), (dx,) = primals, tangents
    deriv = (_gelu_tanh_derivative if approximate else _gelu_erf_derivative)(x).astype(x.dtype)
    return jax.nn.gelu(x, approximate=approximate), dx * deriv


def _masked_softmax(scores, mask, scale):
    return jax.nn.softmax(jnp.where(mask, scores * scale, -jnp.inf), axis=-1)


def _tagged(y, name):
    return y if name is None else checkpoint_name(y, name)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def masked_softmax(scores: jax.Array, mask: jax.Array, scale: float, name: str | None = None) -> jax.Array:
    """``softmax(where(mask, scores * scale, -inf))`` over the last axis.

    The backward reads the output only: ``d y = y * (t - sum(y * t))`` with ``t = scale * d scores``
    vanishes where the output is 0, so the mask is not needed again (PyTorch keeps the output and
    the mask of ``masked_fill``).

    Args:
        scores: (..., T_q, T_k) float attention scores.
        mask: bool, broadcastable to ``scores``; False entries get probability 0 (e.g. a causal
            ``tril`` (T, T) or a padding mask (B, 1, 1, T)).
        scale: multiplier of the scores (a Python float, e.g. ``1 / sqrt(head_dim)``).
        name: optional ``checkpoint_name`` tag of the output (e.g. ``"attn_probs"``), applied
            inside the rule so that the tagged output and the value the backward reads are one
            residual; tagging outside would leave two copies of the probabilities (the rule's
            and the tag's) among the residuals.

    Returns:
        Probabilities, shape and dtype of ``scores``; a row whose entries are all masked is NaN
        (as ``jax.nn.softmax`` of all ``-inf``).
    """
    return _tagged(_masked_softmax(scores, mask, scale), name)


@masked_softmax.defjvp
def _masked_softmax_jvp(scale, name, primals, tangents):
    scores, mask = primals
    dscores = tangents[0]
    y = _tagged(_masked_softmax(scores, mask, scale), name)
    t = dscores * scale
    return y, y * (t - jnp.sum(y * t, axis=-1, keepdims=True))


def batched_matmul(a: jax.Array, b: jax.Array, *, transpose_b: bool = False) -> jax.Array:
    """``a @ b`` (or ``a @ b^T``) over the shared leading axes, as one ``lax.dot_general``.

    ``jnp.matmul`` squeezes unit batch axes (B == 1 or H == 1) before its ``dot_general``, so the
    backward pass keeps the squeezed operand, a second value beside the unsqueezed one (e.g. the
    attention probabilities kept once by the softmax and once, squeezed, by ``probs @ v``). Here
    the batch axes are passed to ``dot_general`` as they are, and ``transpose_b`` contracts over
    b's last axis instead of materialising ``b^T``.

    Args:
        a: (..., M, K) float.
        b: (..., K, N), or (..., N, K) with ``transpose_b=True``; the same leading axes as ``a``.

    Returns:
        (..., M, N), dtype of ``a``.
    """
    batch = tuple(range(a.ndim - 2))
    contract_b = b.ndim - 1 if transpose_b else b.ndim - 2
    return lax.dot_general(a, b, (((a.ndim - 1,), (contract_b,)), (batch, batch)))
