"""One computation that XLA compiles on its own: a ``lax.cond`` branch, or a one-trip ``while`` body.

:mod:`jaxremat.layer_pass` runs each layer's forward pass, recompute and backward pass through
:func:`isolate`: XLA fuses a branch or a loop body among its own ops only, so the same program gives
the same bits wherever it runs (docs/framework-differences.md, section 2, item 3). The predicate,
True at run time, is one XLA cannot fold (:func:`predicate`, :func:`run_time_true`), so the branch
is not inlined and the loop not removed. Outputs nothing else reads are read into a value that is
(:func:`alive`, :func:`tie`), or XLA would drop them and compile a smaller computation. A
computation that updates large buffers (a layer writing its residuals into their stacks, a layer's
backward pass writing its gradients) is the body of a ``lax.while_loop`` that runs once, with the
buffers as loop state: XLA updates a loop's state in place, where it copies every buffer a branch
updates whole.

Source: ``jax.lax.cond``, ``jax.lax.while_loop``, ``jax.custom_jvp``.
"""

from __future__ import annotations

import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jcore

from .same_program import opaque, unbatched
from .slice_order import alive, numeric_entries, take  # re-exported: callers name them here

__all__ = ["ONCE_SCOPE", "alive", "isolate", "predicate", "run_time_true", "runs_once", "take", "tie"]

_tree = jax.tree_util


def predicate(tree):
    """A float32 scalar read from ``tree`` for :func:`isolate`'s predicate: its first numeric entry
    that is traced (a ``jax.core.Tracer``), else its first numeric entry.

    A traced value, because XLA folds a predicate computed from constants, and then inlines the
    branch. Give values that are not batched under ``jax.vmap`` first (a stack's parameters): a
    batched predicate turns ``lax.cond`` into a select that runs both branches.
    """
    leaves = [a for a in _tree.tree_leaves(tree) if numeric_entries([a])]
    traced = [a for a in leaves if isinstance(a, jax.core.Tracer)]
    entries = numeric_entries((traced or leaves)[:1])
    return jnp.real(entries[0]).astype(jnp.float32) if entries else jnp.float32(0.0)


def run_time_true(pred_value):
    """``(bits(pred_value) >> 31) <= 0``: True for every value, unknown to XLA before run time.

    Never batched under ``jax.vmap`` (:func:`jaxremat.same_program.unbatched`).
    """
    value = unbatched(lax.stop_gradient(jnp.asarray(pred_value, jnp.float32)))
    return (lax.bitcast_convert_type(value, jnp.int32) >> 31) <= 0


def _zeros_like_avals(out_avals, out_tree):
    leaves = [jnp.zeros(a.shape, a.dtype) for a in out_avals]
    leaves = [z if a.memory_space == jcore.MemorySpace.Device else jax.device_put(z, a.memory_space)
              for z, a in zip(leaves, out_avals)]
    return _tree.tree_unflatten(out_tree, leaves)


def _numeric(avals) -> bool:
    return all(jnp.issubdtype(a.dtype, jnp.number) or a.dtype == jnp.bool_ for a in avals)


def isolate(fn: Callable, operand, pred_value, buffers=None):
    """``fn(operand)`` as an XLA computation of its own: a ``lax.cond`` branch XLA cannot inline.

    XLA compiles a branch as a program fused among its own ops. The predicate,
    ``(bits(pred_value) >> 31) <= 0`` (:func:`predicate`; an arithmetic shift of an int32 gives 0 or
    -1), is True for every value, but XLA does not know it before run time, so the conditional
    stays; the other branch returns zeros and never runs. Outputs of a non-numeric dtype (PRNG
    keys) get ``fn`` in both branches instead. Op by op (``jax.disable_jit()``) nothing is fused and
    ``fn`` runs as it is.

    With ``buffers`` (large arrays the computation updates in place, such as a stack of residuals
    it writes one slot of), ``fn(operand, buffers)`` returns ``(out, buffers)`` and the computation
    is the body of a ``lax.while_loop`` that runs once (:func:`_loop_once`): a loop's state is
    updated in place, where a conditional's outputs are new buffers and XLA copies every buffer
    the branch updates whole.
    """
    if jax.config.jax_disable_jit:
        return fn(operand) if buffers is None else fn(operand, buffers)
    if buffers is not None:
        return _loop_once(fn, operand, buffers, pred_value)
    pred = run_time_true(pred_value)
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(operand)
    out_avals, out_tree = closed.out_avals, jax.tree_util.tree_structure(shapes)
    branch = lambda op: fn(opaque(op))  # noqa: E731
    if not _numeric(out_avals):
        return lax.cond(pred, branch, branch, operand)
    return lax.cond(pred, branch, lambda _: _zeros_like_avals(out_avals, out_tree), operand)


ONCE_SCOPE = "jaxremat_isolated_once"
"""The ``jax.named_scope`` of :func:`_loop_once`'s ``while`` equation (:func:`runs_once` reads it)."""


def runs_once(eqn) -> bool:
    """Whether a jaxpr equation is the loop of :func:`isolate` with ``buffers``, which runs once.

    Read from the equation's name stack (innermost scope :data:`ONCE_SCOPE`, under any
    transformation), so that program walkers can count its body once where the trip count of a
    ``while`` loop is not known from the program.
    """
    return eqn.primitive.name == "while" and re.search(
        rf"(^|[/(]){ONCE_SCOPE}\)*$", str(eqn.source_info.name_stack)) is not None


def _loop_once(fn: Callable, operand, buffers, pred_value):
    """``fn(operand, buffers)`` as the body of a ``lax.while_loop`` of trip count one, unknown to XLA.

    The loop runs while its counter is below ``int(pred)`` (:func:`run_time_true`: 1 at run time, which XLA
    cannot prove, so its while-loop simplifier keeps the loop). Its state is ``operand`` (passed
    through unchanged: no copy), ``buffers`` (updated in place), the outputs (zeros at entry) and
    the counter. The body reads ``operand`` through ``lax.optimization_barrier`` together with the
    counter, so XLA's loop-invariant code motion cannot hoist the computation out of the loop (where
    it would be fused with what surrounds it).

    JAX has no reverse mode for a ``while`` loop: differentiated (second order through the reverse
    segment loop), the computation is the ``lax.cond`` of :func:`isolate` instead (a
    ``jax.custom_jvp``), which the cost of a copy of ``buffers`` does not matter to.
    """
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(operand, buffers)
    out_tree = jax.tree_util.tree_structure(shapes[0])
    out_avals = closed.out_avals[:out_tree.num_leaves]
    pred = run_time_true(pred_value)
    if not _numeric(out_avals):
        return lax.cond(pred, fn, fn, operand, buffers)

    def body(state):
        op, bufs, _, n, bound = state
        op_read, n_read = lax.optimization_barrier((op, n))
        out, bufs = fn(op_read, bufs)
        return op, bufs, out, n_read + 1, bound

    @jax.custom_jvp
    def once(operand, buffers, pred):
        init = (operand, buffers, _zeros_like_avals(out_avals, out_tree), jnp.int32(0), pred.astype(jnp.int32))
        with jax.named_scope(ONCE_SCOPE):
            _, bufs, out, _, _ = lax.while_loop(lambda st: st[3] < st[4], body, init)
        return out, bufs

    @once.defjvp
    def once_jvp(primals, tangents):
        operand, buffers, pred = primals
        zeros = lambda o, b: (_zeros_like_avals(out_avals, out_tree), b)  # noqa: E731
        return jax.jvp(lambda o, b: lax.cond(pred, fn, zeros, o, b), primals[:2], tangents[:2])

    return once(operand, buffers, pred)


def tie(tree, alive_value, last: bool = False):
    """``tree`` with ``alive_value`` read into one entry of its first float leaf, bits unchanged.

    The entry is the first one (the last one with ``last``).

    Adds ``-0.0 * (alive_value != alive_value)``, which is -0.0 for every value (NaN included),
    to one entry: ``x + -0.0 == x`` for every float ``x`` (signed zeros and NaN included). What
    ``alive_value`` reads stays in the program as long as ``tree`` is needed.
    """
    leaves, treedef = _tree.tree_flatten(tree)
    alive_value = unbatched(lax.stop_gradient(jnp.asarray(alive_value, jnp.float32)))
    for j, a in enumerate(leaves):
        if jnp.issubdtype(jnp.result_type(a), jnp.floating):
            t = (np.float32(-0.0) * (alive_value != alive_value).astype(jnp.float32)).astype(a.dtype)
            leaves[j] = a + t if jnp.ndim(a) == 0 else a.at[(-1 if last else 0,) * jnp.ndim(a)].add(t)
            break
    return _tree.tree_unflatten(treedef, leaves)
