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
  ``checkpoint_name`` values read rounded in every pass, as a policy saves them;
* :func:`hoist_constants` and :func:`run_time`: values a layer computes from constants alone (a
  causal mask from ``iota``) computed outside its computation and read as run-time operands in every
  pass, as XLA's loop-invariant code motion hoists them out of a ``while`` body but not out of a
  conditional branch.

Source: ``lax.optimization_barrier``, ``jax.custom_batching.custom_vmap``, ``jax.custom_jvp``;
XLA's ``xla_allow_excess_precision`` (``xla/debug_options_flags.cc``) and
``WhileLoopInvariantCodeMotion`` (``xla/service/while_loop_invariant_code_motion.cc``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import core as jcore

__all__ = ["SAVEABLE_PRIMITIVES", "STAY_INLINE_PRIMITIVES", "batched_with", "bind_eqn", "has_effects",
           "hoist_constants", "opaque", "round_saveable", "run_time", "unbatched"]

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


def has_effects(eqn) -> bool:
    """Whether a jaxpr equation has an effect other than a named axis or an internal mutable array."""
    benign = (jcore.NamedAxisEffect, jcore.InternalMutableArrayEffect)
    return any(not isinstance(e, benign) for e in eqn.effects)


STAY_INLINE_PRIMITIVES = frozenset({"broadcast_in_dim", "iota", "reshape", "squeeze", "expand_dims", "transpose",
                                    "rev", "slice", "convert_element_type", "copy", "copy_p"})
"""Primitives :func:`hoist_constants` leaves inside a layer on constant operands: those XLA's loop-invariant
code motion does not hoist on their own (``NotWorthHoistingIndividually``: broadcasts, iotas, reshapes,
transposes, slices), so a broadcast of a hoisted mask is not materialised at its broadcast shape."""


def hoist_constants(jaxpr):
    """Split the values ``jaxpr`` computes from constants alone off into a program of their own.

    XLA's loop-invariant code motion moves what a ``while`` body computes from constants alone (the
    causal mask ``iota >= iota``) out of the loop, so the body reads it from a buffer; a conditional
    branch keeps it, and the branch's fusions compute it inline, where LLVM folds it into the code.
    Measured (XLA:CPU, jax 0.10.2): in the masked softmax's fusion, an inlined mask that is True on a
    whole column let LLVM drop the ``select`` there and contract ``scores * scale - max`` into one
    fused multiply-add (XLA:CPU compiles with ``fp-contract=fast``), where the mask read from a buffer
    keeps the ``select`` between them and rounds the product first: attention probabilities an ULP
    apart, and a GPT stack at d_model 96, N=3 under ``full`` ~2e9 ULP from ``none``, whose layers run
    as one-trip ``while`` bodies where ``full``'s run as branches (``python
    scripts/bitwise_mechanisms.py hoist``). With these values computed outside the layer's
    computation and read as operands in every pass (:func:`run_time`), bitwise.

    Args:
        jaxpr: a ``jax.core.Jaxpr`` without constvars (``convert_constvars_jaxpr``).

    Returns:
        ``(program, cone)``: ``program`` is ``jaxpr`` with the hoisted values as leading inputs, and
        ``cone`` a jaxpr of no inputs that computes them (None when nothing is hoisted: then
        ``program`` is ``jaxpr``). Hoisted are the outputs of equations whose operands are literals
        or values computed from literals alone, with numeric outputs and no effects, whose primitive
        is not in :data:`STAY_INLINE_PRIMITIVES`, and that the rest of the program reads.
    """
    constant, cone_eqns = set(), []
    for eqn in jaxpr.eqns:
        if (not has_effects(eqn) and all(_numeric(v.aval) for v in eqn.outvars)
                and all(isinstance(v, jcore.Literal) or v in constant for v in eqn.invars)):
            constant.update(eqn.outvars)
            cone_eqns.append(eqn)
    roots = {id(e) for e in cone_eqns if e.primitive.name not in STAY_INLINE_PRIMITIVES}
    inside = [e for e in jaxpr.eqns if id(e) not in roots]
    read = {v for e in inside for v in e.invars if isinstance(v, jcore.Var)}
    read.update(v for v in jaxpr.outvars if isinstance(v, jcore.Var))
    hoisted = [v for e in cone_eqns if id(e) in roots for v in e.outvars if v in read]
    if not hoisted:
        return jaxpr, None
    dbg = jaxpr.debug_info
    names = None if dbg.arg_names is None else ("hoisted",) * len(hoisted) + tuple(dbg.arg_names)
    program = _dce(jaxpr.replace(invars=hoisted + list(jaxpr.invars), eqns=inside,
                                 debug_info=dbg._replace(arg_names=names)))
    cone = _dce(jaxpr.replace(invars=[], outvars=hoisted, eqns=cone_eqns,
                              debug_info=dbg._replace(arg_names=(), result_paths=("hoisted",) * len(hoisted))))
    return program, cone


def run_time(values: list, pred) -> list:
    """``values`` as XLA computes them at run time: ``select(pred, v, 0)`` for a ``pred`` XLA cannot fold.

    A value computed from constants alone may be folded into a literal, and a literal that enters a
    one-trip ``while`` loop as its state is sunk into the body (``WhileLoopConstantSinking``) where a
    branch reads its operand: through the select, every pass reads a buffer.

    Args:
        values: arrays (:func:`hoist_constants`' cone outputs).
        pred: a boolean scalar, True at run time and unknown to XLA before it
            (:func:`jaxremat.layer_pass.isolate`'s predicate).
    """
    return [lax.select(jnp.broadcast_to(pred, jnp.shape(v)), v, jnp.zeros_like(v)) for v in values]


def _numeric(aval) -> bool:
    dt = getattr(aval, "dtype", None)
    return dt is not None and (jnp.issubdtype(dt, jnp.number) or dt == jnp.bool_)


def _dce(jaxpr):
    """``jaxpr`` without the equations none of its outputs (nor an effect) needs; inputs kept."""
    live = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if has_effects(eqn) or any(v in live for v in eqn.outvars):
            kept.append(eqn)
            live.update(v for v in eqn.invars if isinstance(v, jcore.Var))
    return jaxpr.replace(eqns=kept[::-1])
