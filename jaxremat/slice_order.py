"""When a layer reads its parameter slices and writes its gradients: as late and as early as they can be.

A layer's isolated computations (:mod:`jaxremat.layer_pass`) read the layer's parameter slices
``params[i]`` (``lax.dynamic_index_in_dim``: a copy, one buffer per slice) and its backward pass
writes the slices' gradients into the stacked gradient buffers in place. XLA's scheduler orders what
has no data dependence as it likes. Measured (XLA:CPU, jax 0.10.2) on a user's MLP block
``x + tanh(x @ W1 + b1) @ W2``: in the backward pass it computed ``dW2``, then sliced both ``W1[i]``
and ``W2[i]``, and only then wrote ``dW2`` into its buffer (three weight-sized buffers live at once,
where ``lax.scan(jax.checkpoint(block))`` holds two); in the forward pass it sliced ``W1[i]`` and
``W2[i]`` together before the first product (two). ``lax.optimization_barrier`` does not order them:
XLA:CPU removes the barriers before it schedules.

Here the programs are evaluated equation by equation with data dependences that fix the order:

* :func:`pull_back_in_place` (a layer's backward pass): each parameter gradient is written into its
  buffer as soon as the equation that computes it has run, and a parameter slice is taken when an
  equation first reads it, at an index computed from the gradient buffers written so far
  (:func:`index_after`), so it waits for those writes;
* :func:`eval_slicing_late` (a layer's forward pass and recompute): a parameter slice is taken when an
  equation first reads it, at an index computed from the value computed last.

The equations are the same, bound on the same values; the index is the same number. Measured:
one weight-sized buffer live at a time in both passes (docs/memory-model.md, section 7), and the
gradients of every schedule bitwise with ``none`` (tests/jaxremat/test_bitwise_jit.py).

Source: ``jax.make_jaxpr``, ``lax.dynamic_index_in_dim``, ``lax.dynamic_update_index_in_dim``.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jcore

from .same_program import bind_eqn, unbatched

__all__ = ["alive", "eval_slicing_late", "index_after", "numeric_entries", "pull_back_in_place", "take"]

_tree = jax.tree_util


def take(tree, i):
    """Slice ``i`` of every leaf's leading axis (``i`` may be traced)."""
    return _tree.tree_map(lambda a: lax.dynamic_index_in_dim(a, i, 0, keepdims=False), tree)


def numeric_entries(tree) -> list:
    """One entry of every numeric leaf of ``tree`` (key, float0 and empty leaves skipped)."""
    out = []
    for a in _tree.tree_leaves(tree):
        dt = jnp.result_type(a)
        if not (jnp.issubdtype(dt, jnp.number) or dt == jnp.bool_) or np.size(a) == 0:
            continue
        out.append(jnp.ravel(a)[0] if jnp.ndim(a) else jnp.asarray(a))
    return out


def alive(*trees, alive=None):
    """A float32 scalar, 0.0 or NaN, that reads one entry of every leaf of ``trees`` (and ``alive``).

    Read into a value that is used (:func:`jaxremat.isolation.tie`), it keeps the outputs ``trees`` came from in the
    program though nothing else reads them, and it orders work: what reads the tied value cannot
    start before ``trees`` exist (a recompute waits for its cotangent).
    """
    vals = [jnp.real(v).astype(jnp.float32) * np.float32(0.0) for v in numeric_entries(trees)]
    if alive is not None:
        vals.append(alive)
    out = vals[0] if vals else jnp.float32(0.0)
    for v in vals[1:]:
        out = out + v
    return out


def pull_back_in_place(pull: Callable, params, i, args, grads: list) -> tuple:
    """``pull(params[i], *args)`` with ``params[i]`` read late and its gradients written into ``grads`` early.

    Args:
        pull: ``(layer_params, *args) -> (param_slots, rest)``: ``param_slots`` one entry per leaf of
            ``params`` (the gradient of that leaf's slice, or None where it has none), ``rest`` any
            pytree.
        params: the stacked parameters (leading layer axis).
        i: the layer index (may be traced).
        args: the other inputs of ``pull`` (a tuple of pytrees).
        grads: one gradient buffer per leaf of ``params`` (stacked like it), or None where there is none.

    Returns:
        ``(rest, grads)``: ``pull``'s other outputs and the buffers with slice ``i`` written.
    """
    p_leaves, p_tree = _tree.tree_flatten(params)
    a_leaves, a_tree = _tree.tree_flatten(args)
    out_trees = []

    def flat_pull(*leaves):
        p = _tree.tree_unflatten(p_tree, leaves[:len(p_leaves)])
        slots, rest = pull(p, *_tree.tree_unflatten(a_tree, leaves[len(p_leaves):]))
        flat_rest, rest_tree = _tree.tree_flatten(rest)
        out_trees.append((tuple(s is not None for s in slots), rest_tree))
        return [s for s in slots if s is not None] + flat_rest

    sds = lambda a: jax.ShapeDtypeStruct(jax.numpy.shape(a), jax.numpy.result_type(a))  # noqa: E731
    closed = jax.make_jaxpr(flat_pull)(*[jax.ShapeDtypeStruct(a.shape[1:], a.dtype) for a in p_leaves],
                                       *map(sds, a_leaves))
    has_slot, rest_tree = out_trees[0]
    jaxpr = closed.jaxpr
    slot_of = [k for k, h in enumerate(has_slot) if h]  # jaxpr output o < n_slots -> params leaf slot_of[o]
    n_slots = len(slot_of)
    state = {"grads": list(grads), "written": set()}
    env: dict = dict(zip(jaxpr.constvars, closed.consts))
    env.update(zip(jaxpr.invars[len(p_leaves):], a_leaves))
    lazy = dict(zip(jaxpr.invars[:len(p_leaves)], range(len(p_leaves))))

    def read(v):
        if isinstance(v, jcore.Literal):
            return v.val
        if v not in env:  # a parameter slice, first read: after the gradient writes so far
            written = [state["grads"][slot_of[o]] for o in sorted(state["written"])]
            env[v] = take(p_leaves[lazy[v]], index_after(i, alive(written)) if written else i)
        return env[v]

    def write_ready(last=False):
        for o, v in enumerate(jaxpr.outvars[:n_slots]):
            k = slot_of[o]
            if o in state["written"] or grads[k] is None or (isinstance(v, jcore.Var) and v not in env and not last):
                continue
            g = state["grads"][k]
            value = read(v).astype(g.dtype)
            state["grads"][k] = lax.dynamic_update_index_in_dim(g, value, i, 0)
            state["written"].add(o)

    write_ready()
    for eqn in jaxpr.eqns:
        outs = bind_eqn(eqn, [read(v) for v in eqn.invars])
        env.update((v, o) for v, o in zip(eqn.outvars, outs) if not isinstance(v, jcore.DropVar))
        write_ready()
    write_ready(last=True)
    rest = _tree.tree_unflatten(rest_tree, [read(v) for v in jaxpr.outvars[n_slots:]])
    return rest, state["grads"]


def index_after(i, value):
    """``i`` (an int32 index), computed from ``value`` (a float32 scalar, :func:`alive`): a slice at it waits for
    ``value``. ``select((bits(value) >> 31) <= 0, i, 0)``: the predicate is True for every value (an arithmetic
    shift of an int32 gives 0 or -1), which XLA does not know, so it keeps the dependence."""
    bits = lax.bitcast_convert_type(unbatched(lax.stop_gradient(jnp.asarray(value, jnp.float32))), jnp.int32)
    return lax.select((bits >> 31) <= 0, i, jnp.zeros_like(i))


def eval_slicing_late(jaxpr, args: list, lazy: dict) -> list:
    """``jaxpr`` (no constvars) evaluated on ``args``; the argument at a position in ``lazy`` is sliced late.

    Args:
        jaxpr: a ``jax.core.Jaxpr`` (``jit`` calls already inlined, as :class:`jaxremat.layer_pass.LayerProgram` has them).
        args: one value per input of ``jaxpr``; those at the positions in ``lazy`` are not read.
        lazy: ``position -> (stack, i)``: that input is ``stack[i]``, sliced when an equation first reads
            it, at an index computed from the last floating value computed before (:func:`index_after`).

    Returns:
        The outputs of ``jaxpr``, a list.
    """
    lazy_vars = {jaxpr.invars[k]: v for k, v in lazy.items()}
    env: dict = {v: a for v, a in zip(jaxpr.invars, args) if v not in lazy_vars}
    last: list = []  # the floating value computed last, once there is one

    def read(v):
        if isinstance(v, jcore.Literal):
            return v.val
        if v not in env:
            stack, i = lazy_vars[v]
            env[v] = take(stack, index_after(i, alive(last[0])) if last else i)
        return env[v]

    for eqn in jaxpr.eqns:
        outs = bind_eqn(eqn, [read(v) for v in eqn.invars])
        env.update((v, o) for v, o in zip(eqn.outvars, outs) if not isinstance(v, jcore.DropVar))
        floats = [o for o in outs if jnp.issubdtype(jnp.result_type(o), jnp.floating) and jnp.size(o)]
        last[:] = floats[-1:] or last
    return [read(v) for v in jaxpr.outvars]
