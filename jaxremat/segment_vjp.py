"""The reverse segment loop as one ``jax.custom_vjp``: per-layer parameters, no copies, no XLA undoing.

:func:`remat_segments` runs ``carry, y_i = fn(params[i], carry, xs[i], consts)`` for i = 0..N-1
under a list of :class:`jaxremat.spec.schedules.Segment` s and differentiates it by the algorithm
of Chen et al. 2016 (arXiv:1604.06174), written out:

* forward: a plain segment runs its layers keeping each layer's residuals (the leaves of its
  ``jax.vjp`` closure, stacked over the layers); a checkpointed segment keeps only its input (the
  *boundary*) and runs its layers without keeping anything;
* backward, segments in reverse: a plain segment pulls the cotangent back layer by layer through
  the kept residuals; a checkpointed one first recomputes its layers from its boundary (under its
  inner schedule for ``nested``, else keeping every residual), then pulls back through them.

Why by hand rather than ``jax.checkpoint`` around nested ``lax.scan`` s (``method="checkpoint"``
of :func:`jaxremat.render.remat_scan`). Measured on XLA:CPU, jax 0.10.2 (docs/memory-model.md):
nested scans hand each segment its parameters as one k-layer slice, and XLA materialises that
slice, and the slice of their gradients, in temp memory; a schedule with segments of two lengths
splits the stacked parameters and concatenates their gradients (more copies); and a checkpointed
group of one segment is an outer loop of trip count one, which XLA's while-loop simplifier
removes, after which the recompute is scheduled next to the forward pass and saves nothing.
Here every layer reads its own slice ``params[i]`` (``lax.dynamic_index_in_dim``), every layer's
gradient is written into the one gradient buffer in place (``lax.dynamic_update_index_in_dim``),
and a recompute sits in the backward pass by construction: it starts from the cotangent that
reaches its segment.

Policies. A checkpointed segment with a ``jax.checkpoint`` policy is differentiated by JAX itself,
``jax.vjp(jax.checkpoint(segment, policy=policy))`` over that segment's k-layer parameter slice,
so every policy (names, dots, offload) keeps exactly what JAX's remat keeps; the price is that
slice and its gradient slice in temp memory while the segment runs. A segment plan
(:class:`jaxremat.spec.segment_plan.SegmentPlan`) gives each segment its own policy: segments run
as groups of equal length, kind and policy, each group under its own.

Bits. The per-layer pullbacks are the same functions in a plain segment's forward and in a
checkpointed segment's recompute, and gradients of closed-over arrays (``consts``) are summed in
the same order (last layer first) under every schedule, so every schedule computes the same
operations on the same values as ``none``.

Limits: forward-mode differentiation (``jax.jvp``, ``jax.jacfwd``, Hessian-vector products by
``jvp`` of ``grad``) is not defined through a ``custom_vjp``; ``method="checkpoint"`` supports it.
Reverse over reverse (``grad`` of ``grad``) works.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .spec.schedules import Segment

__all__ = ["remat_segments"]

_tree = jax.tree_util
_FLOAT0 = jax.dtypes.float0


def _differentiable(leaf) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)


def _take(tree, i):
    """Slice ``i`` of every leaf's leading axis (``i`` may be traced)."""
    return _tree.tree_map(lambda a: lax.dynamic_index_in_dim(a, i, 0, keepdims=False), tree)


def _slots(tree) -> list:
    """Per leaf of ``tree``: the leaf if it is differentiable, else None."""
    return [a if _differentiable(a) else None for a in _tree.tree_leaves(tree)]


def _zeros(tree) -> list:
    return [None if a is None else jnp.zeros_like(a) for a in _slots(tree)]


def _cotangent(template, slots: list):
    """A cotangent tree for ``template``: ``slots`` where given, float0 zeros where not differentiable."""
    leaves, treedef = _tree.tree_flatten(template)
    out = [s if s is not None else (np.zeros(np.shape(a), _FLOAT0) if not _differentiable(a) else jnp.zeros_like(a))
           for a, s in zip(leaves, slots)]
    return _tree.tree_unflatten(treedef, out)


def _ct_slots(ct_tree, template) -> list:
    """The differentiable cotangent leaves of ``ct_tree`` aligned with ``template``'s leaves."""
    slots = _slots(template)
    if ct_tree is None:
        return [None if t is None else jnp.zeros_like(t) for t in slots]
    cts = _tree.tree_leaves(ct_tree)
    return [None if t is None else c for c, t in zip(cts, slots)]


def _put(acc: list, values: list, i, k: int | None = None) -> list:
    """Write ``values`` into slice ``i`` (or slices ``i .. i+k``) of the accumulators, in place."""
    def put(a, v):
        v = v.astype(a.dtype)
        return lax.dynamic_update_index_in_dim(a, v, i, 0) if k is None else lax.dynamic_update_slice_in_dim(a, v, i, 0)
    return [a if a is None else put(a, v) for a, v in zip(acc, values)]


def _isolated(tree):
    """``isolate(fn, operand)``: ``fn(operand)`` as a branch of ``lax.cond``, predicated on ``tree``.

    XLA compiles a loop body or a cond branch as a computation of its own: its buffers (e.g. the
    stacked residuals of a recompute, and the zeros ``lax.scan`` initialises them with) exist only
    while it runs, it cannot start before its operands (the cotangent) exist, and its ops are fused
    among themselves only. A ``lax.scan`` of length one is removed by XLA's while-loop simplifier,
    which moves its body into the caller; measured on XLA:CPU (jax 0.10.2), the scheduler then
    allocated a recompute's residuals at the start of the program (``segments(2)`` at N=8 compiled
    to no-remat's temp bytes), and a lone layer fused into its surroundings rounded differently
    from the same layer in ``none``'s loop (gradients a few float32 eps apart at d_model 16). So
    every single-step loop here runs its step as a cond branch instead, with ``fn`` in both
    branches and a predicate XLA cannot fold (an entry of ``tree`` equals itself).
    """
    floats = [a for a in _tree.tree_leaves(tree) if a is not None and _differentiable(a)]
    if not floats:
        return _direct
    first = jnp.ravel(floats[0])[0]
    return lambda fn, operand: lax.cond(first == first, fn, fn, operand)


def _direct(fn, operand):
    return fn(operand)


def _scan(step, carry, n: int, *, isolate_on=None):
    """``lax.scan(step, carry, arange(n))``; for n == 1 the step runs isolated (see :func:`_isolated`)."""
    if n > 1:
        return lax.scan(step, carry, jnp.arange(n))
    c, ys = _isolated(carry if isolate_on is None else isolate_on)(lambda c: step(c, jnp.int32(0)), carry)
    return c, _tree.tree_map(lambda a: a[None], ys)


def _reverse(compute, accumulate, state, n: int):
    """For i = n-1 .. 0: ``state = accumulate(state, compute(i, state[0]), i)``.

    ``compute`` is pure and returns small values (one layer's or one segment's gradients); the
    full-size gradient buffers in ``state`` are only touched by ``accumulate``, outside any cond,
    so XLA updates them in place. For n == 1, ``compute`` runs isolated (see :func:`_isolated`).
    """
    if n > 1:
        body = lambda st, i: (accumulate(st, compute(i, st[0]), i), None)
        return lax.scan(body, state, jnp.arange(n), reverse=True)[0]
    i = jnp.int32(0)
    return accumulate(state, _isolated(state[0])(lambda ct_c: compute(i, ct_c), state[0]), i)


def _after(values, ct_c: list):
    """``values``, made data-dependent on the cotangent in ``state``, bits unchanged.

    A recompute reads only its boundary and the parameters, both known since the forward pass, so
    XLA's scheduler may run it early, with the forward pass, and keep its residuals live as long as
    no remat at all would (measured: ``segments(2)`` at N=8 compiled to no-remat's temp bytes).
    ``lax.optimization_barrier`` did not prevent it on XLA:CPU (jax 0.10.2: the barrier is expanded
    away before scheduling). Adding ``-0.0 * |c|``, with ``c`` one entry of the incoming cotangent,
    is the identity on every float (``x + -0.0 == x``, signed zeros and NaN included) but makes the
    recompute wait for the backward pass of the layers above it. The tie is ``-0.0 * (c != 0)``,
    which is -0.0 for every ``c`` (0, inf and NaN included: ``-0.0 * 0.0`` and ``-0.0 * 1.0`` are
    both -0.0), so a non-finite cotangent entry does not leak into the recomputed values.
    """
    cts = [c for c in ct_c if c is not None]
    if not cts:
        return values
    first = jnp.ravel(cts[0])[0]
    tie = -0.0 * (first != 0).astype(first.dtype)

    def tied(a):
        return a + tie.astype(a.dtype) if _differentiable(a) else a

    return _tree.tree_map(tied, values)


@dataclasses.dataclass
class _Pullback:
    """How a ``jax.vjp`` closure is rebuilt: its treedef, and per leaf ``("input", j)`` or ``("kept", r)``."""

    treedef: Any = None
    sources: tuple = ()


def _vjp(fn, meta: _Pullback, p, c, x, consts):
    """``jax.vjp`` of ``fn(p, c, x, consts)``; the closure leaves that are not ``p``/``x``/``consts`` leaves.

    Leaves that are inputs are read again in the backward pass instead of being stacked: a layer's
    weights are residuals of its matrix products, and stacking them would copy the parameters.
    """
    (c_out, y), pullback = jax.vjp(fn, p, c, x, consts)
    leaves, treedef = _tree.tree_flatten(pullback)
    ids = {id(a): j for j, a in enumerate(_tree.tree_leaves((p, x, consts)))}
    sources, kept = [], []
    for leaf in leaves:
        if id(leaf) in ids:
            sources.append(("input", ids[id(leaf)]))
        else:
            sources.append(("kept", len(kept)))
            kept.append(leaf)
    meta.treedef, meta.sources = treedef, tuple(sources)
    return c_out, y, kept


def _rebuild(meta: _Pullback, kept: list, p, x, consts):
    inputs = _tree.tree_leaves((p, x, consts))
    return _tree.tree_unflatten(meta.treedef, [inputs[j] if s == "input" else kept[j] for s, j in meta.sources])


@dataclasses.dataclass(frozen=True)
class _Group:
    """``n_seg`` consecutive segments of ``k`` layers from ``start``, all of one kind."""

    start: int
    k: int
    n_seg: int
    checkpointed: bool
    inner: Any
    policy: Any = None


def _groups(segments, policies) -> list[_Group]:
    """Runs of equal segments; ``policies`` holds each segment's ``jax.checkpoint`` policy (compared by identity)."""
    out: list[_Group] = []
    for s, p in zip(segments, policies):
        last = out[-1] if out else None
        if last and (last.k, last.checkpointed, last.inner) == (s.length, s.checkpointed, s.inner) and last.policy is p:
            out[-1] = dataclasses.replace(last, n_seg=last.n_seg + 1)
        else:
            out.append(_Group(s.start, s.length, 1, s.checkpointed, s.inner, p))
    return out


def _flat_ys(ys, n_seg: int, k: int):
    return _tree.tree_map(lambda t: t.reshape((n_seg * k,) + t.shape[2:]), ys)


class _Stack:
    """The layer function and its inputs inside one forward or backward pass.

    ``state`` in the backward pass is ``(carry slots, params grads, xs grads, consts grads)``:
    lists aligned with the leaves of the carry, ``params``, ``xs`` and ``consts``, None where a
    leaf is not differentiable; the gradient lists are full-size buffers updated in place.
    """

    def __init__(self, fn, params, xs, consts, policy, carry_template, ct_ys=None):
        self.fn, self.params, self.xs, self.consts, self.policy = fn, params, xs, consts, policy
        self.carry_template, self.ct_ys = carry_template, ct_ys

    def plain(self, base, length: int, c):
        """Layers ``base .. base + length`` keeping nothing; (carry, stacked ys)."""
        def step(c, i):
            return self.fn(_take(self.params, base + i), c, _take(self.xs, base + i), self.consts)
        return _scan(step, c, length)

    def _chunk(self, start, k):
        sl = lambda t: _tree.tree_map(lambda a: lax.dynamic_slice_in_dim(a, start, k, 0), t)
        return sl(self.params), sl(self.xs)

    def _segment_fn(self, policy):
        def segment(chunk, c, xs_chunk, consts):
            return lax.scan(lambda c, layer: self.fn(layer[0], c, layer[1], consts), c, (chunk, xs_chunk))
        return jax.checkpoint(segment, policy=policy, prevent_cse=False)

    def _policies(self, segments, policies):
        return [self.policy] * len(segments) if policies is None else list(policies)

    def forward(self, segments, base, c, policies=None):
        """Forward over ``segments`` (starts relative to ``base``): (carry, ys, residuals, metas).

        ``policies``: one ``jax.checkpoint`` policy per segment (segment plans), else the stack's.
        """
        residuals, metas, ys_parts = [], [], []
        for g in _groups(segments, self._policies(segments, policies)):
            a, meta = base + g.start, _Pullback()
            if not g.checkpointed:
                def step(c, i, a=a, meta=meta):
                    c, y, kept = _vjp(self.fn, meta, _take(self.params, a + i), c, _take(self.xs, a + i), self.consts)
                    return c, (y, kept)
                c, (ys, res) = _scan(step, c, g.n_seg * g.k)
            elif g.inner is None and g.policy is not None:
                def step(c, s, a=a, g=g, meta=meta):
                    chunk, xs_chunk = self._chunk(a + s * g.k, g.k)
                    c, ys, kept = _vjp(self._segment_fn(g.policy), meta, chunk, c, xs_chunk, self.consts)
                    return c, (ys, kept)
                c, (ys, res) = _scan(step, c, g.n_seg)
                ys = _flat_ys(ys, g.n_seg, g.k)
            else:
                def step(c, s, a=a, g=g):
                    out, ys = self.plain(a + s * g.k, g.k, c)
                    return out, (ys, c)
                c, (ys, res) = _scan(step, c, g.n_seg)
                ys, meta = _flat_ys(ys, g.n_seg, g.k), None
            residuals.append(res)
            metas.append(meta)
            ys_parts.append(ys)
        ys = ys_parts[0] if len(ys_parts) == 1 else _tree.tree_map(lambda *t: jnp.concatenate(t), *ys_parts)
        return c, ys, residuals, metas

    def _ct_out(self, ct_c: list, j, k: int | None = None):
        """The cotangent of one layer's (or k layers') outputs: the carry's and the y's."""
        if self.ct_ys is None:
            ct_y = None
        elif k is None:
            ct_y = _take(self.ct_ys, j)
        else:
            ct_y = _tree.tree_map(lambda a: lax.dynamic_slice_in_dim(a, j, k, 0), self.ct_ys)
        return _cotangent(self.carry_template, ct_c), ct_y

    def _accumulate(self, state, grads, j, k=None):
        """Add one layer's (or k layers' from j) gradients into ``state``; the new carry cotangent."""
        _, gp, gx, gk = state
        dp, dc, dx, dk = grads
        gk = [None if g is None else g + d for g, d in zip(gk, _ct_slots(dk, self.consts))]
        return (_ct_slots(dc, self.carry_template), _put(gp, _ct_slots(dp, self.params), j, k),
                _put(gx, _ct_slots(dx, self.xs), j, k), gk)

    def backward(self, segments, base, residuals, metas, state, policies=None):
        """Pull ``state`` back through ``segments`` (starts relative to ``base``) in reverse."""
        groups = _groups(segments, self._policies(segments, policies))
        for g, res, meta in reversed(list(zip(groups, residuals, metas))):
            a = base + g.start
            if not g.checkpointed:
                def compute(i, ct_c, a=a, res=res, meta=meta):
                    p, x = _take(self.params, a + i), _take(self.xs, a + i)
                    return _rebuild(meta, _take(res, i), p, x, self.consts)(self._ct_out(ct_c, a + i))
                state = _reverse(compute, lambda st, grads, i, a=a: self._accumulate(st, grads, a + i),
                                 state, g.n_seg * g.k)
            elif g.inner is None and g.policy is not None:
                def compute(s, ct_c, a=a, g=g, res=res, meta=meta):
                    start = a + s * g.k
                    kept = _after(_take(res, s), ct_c)  # JAX's own remat: recompute what the policy did not keep
                    chunk, xs_chunk = self._chunk(start, g.k)
                    return _rebuild(meta, kept, chunk, xs_chunk, self.consts)(self._ct_out(ct_c, start, g.k))
                state = _reverse(compute, lambda st, grads, s, a=a, g=g: self._accumulate(st, grads, a + s * g.k, g.k),
                                 state, g.n_seg)
            else:
                state = self._backward_checkpointed(g, a, res, state)
        return state

    def _backward_checkpointed(self, g: _Group, a, boundaries, state):
        """Each segment in reverse: recompute it from its boundary, then pull back through it."""
        inner = g.inner.segments_for(g.k) if g.inner is not None else (Segment(0, g.k, False),)

        def segment(state, s):
            start = a + s * g.k
            metas = []

            def recompute(b):
                _, _, inner_res, inner_metas = self.forward(inner, start, b)
                metas[:] = [inner_metas]
                return inner_res

            isolate = _isolated(state[0]) if g.n_seg == 1 else _direct
            inner_res = isolate(recompute, _after(_take(boundaries, s), state[0]))
            return self.backward(inner, start, inner_res, metas[0], state)

        if g.n_seg == 1:
            return segment(state, jnp.int32(0))
        return lax.scan(lambda st, s: (segment(st, s), None), state, jnp.arange(g.n_seg), reverse=True)[0]


def remat_segments(fn: Callable, params: Any, carry: Any, xs: Any, consts: list, segments: tuple[Segment, ...],
                   policy: "Callable | None | Sequence[Callable | None]") -> tuple[Any, Any]:
    """Run ``fn`` over the stacked layers under ``segments``, differentiated by the reverse segment loop.

    Args:
        fn: ``(layer_params, carry, layer_xs, consts) -> (carry, y)`` for one layer (``y`` may be
            None); a pure function whose closure holds no value that is differentiated (pass
            those as ``consts``, e.g. with ``jax.closure_convert``).
        params: pytree, every leaf with leading layer axis N.
        carry: pytree threaded through the layers (same structure, shapes, dtypes in and out).
        xs: pytree of per-layer inputs with leading axis N, or None.
        consts: list of arrays every layer reads (differentiated; their gradient sums the layers').
        segments: contiguous segments covering ``[0, N)`` (``Schedule.segments_for(N)``).
        policy: ``jax.checkpoint`` policy of the checkpointed segments (None keeps nothing; for
            ``nested`` it applies to the inner segments), or a tuple or list of them, one per
            segment in ``segments`` (a segment plan's per-segment policies; equal entries must be
            the same object for their segments to run as one group).

    Raises:
        ValueError: a per-segment ``policy`` of another length than ``segments``.

    Returns:
        ``(carry, ys)``: the carry after layer N-1 and the stacked ``y`` s (None if ``fn`` gives None).

    Source: Chen et al. 2016, arXiv:1604.06174 (Algorithm 1); ``jax.custom_vjp``, ``jax.vjp``.
    """
    n_layer = sum(s.length for s in segments)
    per_segment = None
    if isinstance(policy, (tuple, list)):
        if len(policy) != len(segments):
            raise ValueError(f"remat_segments: {len(policy)} per-segment policies for {len(segments)} segments; "
                             "give one per segment, or one policy for all")
        per_segment, policy = tuple(policy), None
    carry_template = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)), carry)
    metas_of_fwd: list = []

    @jax.custom_vjp
    def run(params, carry, xs, consts):
        return _Stack(fn, params, xs, consts, policy, carry_template).plain(0, n_layer, carry)

    def run_fwd(params, carry, xs, consts):
        c, ys, residuals, metas = _Stack(fn, params, xs, consts, policy, carry_template).forward(
            segments, 0, carry, per_segment)
        metas_of_fwd[:] = [metas]
        return (c, ys), (params, xs, consts, residuals)

    def run_bwd(saved, ct):
        params, xs, consts, residuals = saved
        ct_c, ct_ys = ct
        stack = _Stack(fn, params, xs, consts, policy, carry_template, ct_ys=ct_ys)
        state = (_ct_slots(ct_c, carry_template), _zeros(params), _zeros(xs), _zeros(consts))
        ct_c, gp, gx, gk = stack.backward(segments, 0, residuals, metas_of_fwd[0], state, per_segment)
        unflat = lambda tree, slots: _tree.tree_unflatten(_tree.tree_structure(tree), slots)
        return unflat(params, gp), unflat(carry_template, ct_c), unflat(xs, gx), list(gk)

    run.defvjp(run_fwd, run_bwd)
    return run(params, carry, xs, consts)
