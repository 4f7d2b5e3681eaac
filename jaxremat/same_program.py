"""What keeps one layer's program the same in every pass, beside its isolation (:mod:`jaxremat.layer_pass`).

An isolated computation (a ``lax.cond`` branch, a one-trip ``while`` body) is fused among its own
ops only; these keep what XLA compiles into it the same in ``none``'s forward pass, in a
checkpointed segment's forward pass and in its recompute (docs/framework-differences.md, section 2,
items 6-8):

* :func:`opaque`: the branch reads its operands through ``lax.optimization_barrier``, so XLA cannot
  fold an operand that is a constant of the program into it;
* :func:`unbatched`: a predicate never batched under ``jax.vmap`` (a batched one turns ``lax.cond``
  into a ``select`` run inline); :func:`batched_with`: a layer's carry mapped whenever anything the
  layer reads is, as a scan over the layers maps it;
* :func:`round_saveable`: bfloat16 (any float narrower than float32) matrix products and
  ``checkpoint_name`` values read rounded in every pass, as a policy saves them.

Source: ``lax.optimization_barrier``, ``jax.custom_batching.custom_vmap``, ``jax.custom_jvp``;
XLA's ``xla_allow_excess_precision`` (``xla/debug_options_flags.cc``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["SAVEABLE_PRIMITIVES", "batched_with", "bind_eqn", "opaque", "round_saveable", "unbatched"]

_tree = jax.tree_util


def opaque(tree):
    """``tree``'s numeric leaves read through ``lax.optimization_barrier``: values XLA cannot fold.

    XLA moves an operand of a conditional that is a constant of the program into the branch and
    folds what depends on it alone at compile time (its HLO evaluator), where the same branch run
    on a run-time value computes it with the compiled loops (another summation order). A stack's
    input closed over by the differentiated function, not an argument of ``jit``, is such a
    constant in ``none``'s forward pass, where a checkpointed segment's recompute reads the kept
    boundary. Measured (XLA:CPU, jax 0.10.2): an NNX block with ``nnx.LayerNorm`` under ``full`` at
    N=1, D=12, 198 ULP from ``none`` (its LayerNorm's ``sqrt`` and ``div`` folded into constants);
    behind the barrier bitwise (``python scripts/bitwise_mechanisms.py fold``).

    Args:
        tree: any pytree; leaves of a non-numeric dtype (PRNG keys) and None pass as they are.

    Returns:
        ``tree`` with the same values, its numeric leaves outputs of one barrier.
    """
    leaves, treedef = _tree.tree_flatten(tree)
    idx = [j for j, a in enumerate(leaves) if jnp.issubdtype(jnp.result_type(a), jnp.number)]
    read = lax.optimization_barrier([leaves[j] for j in idx])
    for j, a in zip(idx, read):
        leaves[j] = a
    return _tree.tree_unflatten(treedef, leaves)


@jax.custom_batching.custom_vmap
def unbatched(value):
    """``value`` (a float32 scalar); under ``jax.vmap`` its sum over the mapped axis, not batched.

    A predicate batched by ``jax.vmap`` (read from batched parameters, or from a batched carry
    through :func:`jaxremat.layer_pass.alive`) turns ``lax.cond`` into a ``select`` that runs both branches inline and a
    ``while`` loop into one whose state is selected per example: the computation is fused with what
    surrounds it again. Measured (XLA:CPU, jax 0.10.2): ``jit(vmap(grad))`` over stacked parameters
    at N=3, D=12 under ``every_k(2)+save_dots``, 2,955 ULP from ``none``; with this predicate bitwise.
    The sum still reads every example's value, so the computation waits for all of them.
    """
    return value


@unbatched.def_vmap
def _unbatched_rule(axis_size, in_batched, value):
    return (jnp.sum(value, axis=0) if in_batched[0] else value), False


def batched_with(tree, refs):
    """``tree`` unchanged; under ``jax.vmap``, every numeric leaf mapped once any leaf of ``tree`` or ``refs`` is.

    Whether a value in a layer is batched follows from whether its inputs are, and a ``lax.scan``
    batches its carry when its body does: ``none``'s loop over the layers hands layer 0 a batched
    carry, a segment of one layer run outside any loop an unbatched one. XLA compiles the layer
    for other shapes then, and reduces in another order. Measured (XLA:CPU, jax 0.10.2):
    ``jit(vmap(grad))`` over stacked parameters at N=3, D=12, ``sqrt`` 124 ULP from ``none``;
    with the carry (and, in the backward pass, the cotangent) mapped inside every layer's
    computation, bitwise. Leaves of another dtype (PRNG keys) are left as they are. Outside
    ``jax.vmap`` the leaves pass through unchanged (a ``custom_vmap`` call; nothing is copied).

    Args:
        tree: the values to map (a carry or a cotangent; any pytree).
        refs: what the layer reads besides (parameters, per-layer inputs, constants; any pytree).

    Returns:
        ``tree`` with the same values; under ``jax.vmap`` its unmapped numeric leaves broadcast
        along the mapped axis when any leaf of ``tree`` or ``refs`` is mapped. Differentiable
        (the tangent passes through unchanged).
    """
    leaves, treedef = _tree.tree_flatten(tree)
    idx = [j for j, a in enumerate(leaves) if jnp.issubdtype(jnp.result_type(a), jnp.number)]
    if not idx:
        return tree
    ref_leaves = [a for a in _tree.tree_leaves(refs) if jnp.issubdtype(jnp.result_type(a), jnp.number)]
    out = _batched_with(tuple(leaves[j] for j in idx), tuple(ref_leaves))
    for j, a in zip(idx, out):
        leaves[j] = a
    return _tree.tree_unflatten(treedef, leaves)


@jax.custom_jvp
def _batched_with(leaves: tuple, refs: tuple) -> tuple:
    return _broadcast_mapped(leaves, lax.stop_gradient(refs))


@_batched_with.defjvp
def _batched_with_jvp(primals, tangents):
    return _batched_with(*primals), tangents[0]


@jax.custom_batching.custom_vmap
def _broadcast_mapped(leaves: tuple, refs: tuple) -> tuple:
    return leaves


@_broadcast_mapped.def_vmap
def _broadcast_mapped_rule(axis_size, in_batched, leaves, refs):
    leaves_batched = list(in_batched[0])
    if not any(leaves_batched) and not any(in_batched[1]):
        return leaves, tuple(leaves_batched)
    out = tuple(a if b else jnp.broadcast_to(a, (axis_size,) + jnp.shape(a)) for a, b in zip(leaves, leaves_batched))
    return out, (True,) * len(out)


def bind_eqn(eqn, ins) -> list:
    """The outputs of equation ``eqn`` bound on ``ins`` (a list, one entry per output)."""
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
    return outs if eqn.primitive.multiple_results else [outs]


SAVEABLE_PRIMITIVES = ("dot_general", "name")
"""Primitives whose narrow-float outputs every pass reads rounded (:func:`round_saveable`)."""


def round_saveable(eqn, ins) -> list | None:
    """The outputs of ``eqn`` read through ``lax.optimization_barrier`` when it is a matrix product or a
    ``checkpoint_name`` tag with an output narrower than float32 (bfloat16, float16, float8); else None.

    XLA's ``xla_allow_excess_precision`` (on by default) lets XLA:CPU compute a bfloat16 program in
    float32 and drop a rounding to bfloat16 and back (``convert(convert(x))`` folded to ``x``): the
    consumers of a bfloat16 matrix product read its unrounded float32 result. A value that a policy
    saves (matrix products: ``save_dots``; names: every named policy, ``custom_vjp_residuals="save"``)
    is kept in bfloat16, so the recompute read it rounded where ``none``'s forward pass did not.
    Measured (XLA:CPU, jax 0.10.2): bfloat16 compute, ``every_k(2)+save_dots`` at N=2, D=48, a
    gradient 2.1e9 ULP from ``none`` (a sign flip); with ``--xla_allow_excess_precision=false`` or
    this barrier, bitwise (``python scripts/bitwise_mechanisms.py excess``). The barrier makes every
    pass read the value as it is saved: rounded. Float32 programs are unchanged.

    Args:
        eqn: a jaxpr equation (``eqn.primitive``, ``eqn.params``, ``eqn.outvars``).
        ins: its input values (arrays or tracers).

    Returns:
        The equation's outputs, each through the barrier, or None (bind it as it is).
    """
    if eqn.primitive.name not in SAVEABLE_PRIMITIVES or not any(_narrow_float(v.aval) for v in eqn.outvars):
        return None
    return list(lax.optimization_barrier(bind_eqn(eqn, ins)))


def _narrow_float(aval) -> bool:
    dt = getattr(aval, "dtype", None)
    return dt is not None and jnp.issubdtype(dt, jnp.floating) and jnp.dtype(dt).itemsize < 4
