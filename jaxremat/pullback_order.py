"""A layer's pullback with its parameter slices read late and its parameter gradients written early.

Inside a layer's isolated backward computation (:meth:`jaxremat.segment_vjp._Stack.layer_grads`) a
pullback reads the layer's parameter slices ``params[i]`` and produces their gradients, which are
written into the stacked gradient buffers in place. XLA's scheduler orders what has no data
dependence as it likes: measured (XLA:CPU, jax 0.10.2) on a user's MLP block
``x + tanh(x @ W1 + b1) @ W2``, it computed ``dW2``, then sliced both ``W1[i]`` and ``W2[i]``, and only
then wrote ``dW2`` into its buffer: three weight-sized buffers live at once, where
``lax.scan(jax.checkpoint(block))`` holds two (docs/memory-model.md, section 7).

:func:`pull_back_in_place` evaluates the pullback's program equation by equation and adds the data
dependences that fix the order: a parameter slice is taken only when an equation first reads it,
from the stacked parameter read through ``lax.optimization_barrier`` together with every gradient
buffer as it stands then (so the slice waits for the gradient writes before it), and each parameter
gradient is written into its buffer as soon as the equation that computes it has run. The
equations are the same, bound on the same values: the gradients keep their bits.

Source: ``lax.optimization_barrier``; ``jax.make_jaxpr``.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import core as jcore

from .layer_pass import alive, take
from .same_program import bind_eqn, unbatched

__all__ = ["pull_back_in_place"]

_tree = jax.tree_util


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
            env[v] = take(p_leaves[lazy[v]], _index_after(i, alive(written)) if written else i)
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


def _index_after(i, value):
    """``i``, computed from ``value`` (a float32 scalar, :func:`jaxremat.layer_pass.alive`): a slice at it
    waits for ``value``. ``(bits(value) >> 31) <= 0`` is True for every value, which XLA does not know."""
    bits = lax.bitcast_convert_type(unbatched(lax.stop_gradient(jnp.asarray(value, jnp.float32))), jnp.int32)
    return lax.select((bits >> 31) <= 0, i, jnp.zeros_like(i))
