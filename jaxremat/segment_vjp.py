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

Limits: forward-mode differentiation of the stack itself (``jax.jvp``, ``jax.jacfwd``) is not
defined through a ``custom_vjp``; ``method="checkpoint"`` supports it. Forward over reverse
(``jax.jvp`` of ``jax.grad``, Hessian-vector products) works: the forward and backward passes
are ordinary code. Reverse over reverse (``grad`` of ``grad``) works.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .layer_pass import LayerProgram, differentiated_policy, isolate, predicate, rebuild, tie
from .slice_order import alive, pull_back_in_place, take
from .same_program import batched_with
from .spec.schedules import Segment

__all__ = ["remat_segments"]

_tree = jax.tree_util
_FLOAT0 = jax.dtypes.float0


def _differentiable(leaf) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)


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


def _first_index():
    """Index 0 as a run-time value, for a layer or segment run outside a loop.

    A constant index reaches the isolated computations (:func:`jaxremat.layer_pass.isolate`) as a
    constant operand, and XLA specialises them to it (a dynamic slice folded into a static one), so
    the layer compiles otherwise than in a loop. Measured (XLA:CPU, jax 0.10.2): the BERT encoder at
    d_model 16 under ``plan(1+save_nothing,3:store)``, layer 0's attention gradients 1.5e9 ULP from
    ``none`` (``tests/jaxremat/test_planner_menus.py``); behind ``lax.optimization_barrier`` bitwise.
    """
    return lax.optimization_barrier(jnp.int32(0))


def _scan(step, carry, n: int):
    """``lax.scan(step, carry, arange(n))``; for n == 1 the step runs once, outside any loop."""
    if n > 1:
        return lax.scan(step, carry, jnp.arange(n))
    c, ys = step(carry, _first_index())
    return c, _tree.tree_map(lambda a: a[None], ys)


def _reverse(step, state, n: int):
    """For i = n-1 .. 0: ``state = step(state, i)``."""
    if n > 1:
        return lax.scan(lambda st, i: (step(st, i), None), state, jnp.arange(n), reverse=True)[0]
    return step(state, _first_index())


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
    """Runs of equal segments; ``policies`` holds each segment's ``jax.checkpoint`` policy (compared by identity).

    A checkpointed segment without an inner schedule whose policy saves everything
    (``jax.checkpoint_policies.everything_saveable``) keeps what a plain segment keeps: it runs as one.
    """
    out: list[_Group] = []
    for s, p in zip(segments, policies):
        if s.checkpointed and s.inner is None and p is jax.checkpoint_policies.everything_saveable:
            s, p = dataclasses.replace(s, checkpointed=False), None
        last = out[-1] if out else None
        if last and (last.k, last.checkpointed, last.inner) == (s.length, s.checkpointed, s.inner) and last.policy is p:
            out[-1] = dataclasses.replace(last, n_seg=last.n_seg + 1)
        else:
            out.append(_Group(s.start, s.length, 1, s.checkpointed, s.inner, p))
    return out


def _one_layer(res, n: int):
    """``res`` as stacked residuals: a layer run alone returned its residuals unstacked."""
    return _tree.tree_map(lambda a: a[None], res) if n == 1 else res


def _flat_ys(ys, n_seg: int, k: int):
    return _tree.tree_map(lambda t: t.reshape((n_seg * k,) + t.shape[2:]), ys)


class _Stack:
    """The layer function and its inputs inside one forward or backward pass.

    ``state`` in the backward pass is ``(carry slots, params grads, xs grads, consts grads)``:
    lists aligned with the leaves of the carry, ``params``, ``xs`` and ``consts``, None where a
    leaf is not differentiable; the gradient lists are full-size buffers updated in place.
    Every layer's forward and backward pass runs isolated (:mod:`jaxremat.layer_pass`); outputs
    that nothing reads are read into a value that is (:func:`jaxremat.layer_pass.tie`).
    """

    def __init__(self, fn, params, xs, consts, policy, carry_template, pred_source, ct_ys=None, lean=False,
                 as_differentiated=None):
        self.fn, self.params, self.xs, self.consts, self.policy = fn, params, xs, consts, policy
        self.carry_template, self.ct_ys, self.lean = carry_template, ct_ys, lean
        # policy -> the policy as JAX differentiates it (:func:`differentiated_policy`); shared by the
        # forward and backward passes' stacks, so that each policy is asked once
        self.as_differentiated = {} if as_differentiated is None else as_differentiated
        self.pred = predicate(pred_source)
        self._programs: dict = {}

    def program(self, policy=None, carry_out: bool = True) -> LayerProgram:
        """The layer's forward program, split for ``policy`` (one per policy object).

        ``carry_out``: the policy's recompute also returns the layer's carry (a segment of several
        layers recomputes the next layer from it); for a one-layer segment it returns only the
        residuals, and the forward pass saves only what they need.
        """
        key = (id(policy), carry_out or policy is None)
        if key not in self._programs:
            split = policy
            if policy is not None:
                if id(policy) not in self.as_differentiated:
                    self.as_differentiated[id(policy)] = (policy, differentiated_policy(
                        self.fn, self.params, self.carry_template, self.xs, self.consts, policy))
                split = self.as_differentiated[id(policy)][1]
            self._programs[key] = (policy, LayerProgram(self.fn, self.params, self.xs, self.consts,
                                                        self.carry_template, split, self.pred, key[1]))
        return self._programs[key][1]

    def plain(self, base, length: int, c):
        """Layers ``base .. base + length`` keeping nothing; (carry, stacked ys). Not differentiated."""
        def step(c, i):
            return self.fn(take(self.params, base + i), c, take(self.xs, base + i), self.consts)
        return _scan(step, c, length)

    def layer_grads(self, i, res, j, state, ct_y, live):
        """Layer ``i``'s backward pass from its residuals ``res[j]`` (stacked), isolated: the new ``state``.

        The stacked residuals are sliced inside (a slice taken outside would be a copy); layer
        ``i``'s gradients are written into the gradient buffers of ``state`` inside too, which the
        computation updates in place (:func:`jaxremat.layer_pass.isolate`'s ``buffers``; returned
        as outputs, one layer's gradients would be a second buffer beside them). The predicate
        reads ``live``.
        """
        prog = self.program()
        ct_c, gp, gx, gk = state

        def run(op, buffers):
            params, xs, consts, i, res, j, ct_c, ct_y = op
            ct_c = batched_with(ct_c, (params, xs, consts, res, ct_y))
            x = take(xs, i)
            kept, meta = prog.residuals(params, xs, consts, i, take(res, j)), prog.meta

            def pull(p, kept, x, consts, ct_c, ct_y):
                dp, dc, dx, dk = rebuild(meta, kept, p, x, consts)((_cotangent(self.carry_template, ct_c), ct_y))
                return _ct_slots(dp, self.params), (_ct_slots(dc, self.carry_template), _ct_slots(dx, self.xs),
                                                    _ct_slots(dk, self.consts))
            (dc, dx, dk), gp = pull_back_in_place(pull, params, i, (kept, x, consts, ct_c, ct_y), buffers[0])
            _, _, gx, gk = self._accumulate((None, []) + tuple(buffers[1:]), (dc, [], dx, dk), i)
            return dc, (gp, gx, gk)
        dc, (gp, gx, gk) = isolate(run, (self.params, self.xs, self.consts, i, res, j, ct_c, ct_y), self.pred + live,
                                   (gp, gx, gk))
        return dc, gp, gx, gk

    def _policies(self, segments, policies):
        return [self.policy] * len(segments) if policies is None else list(policies)

    def forward(self, segments, base, c, live, policies=None):
        """Forward over ``segments`` (starts relative to ``base``): (carry, ys, residuals, live).

        ``live`` (:func:`jaxremat.layer_pass.alive`) is read by every layer's predicate, so each
        layer waits for what the one before left unused to be read (and freed).

        ``policies``: one ``jax.checkpoint`` policy per segment (segment plans), else the stack's.
        A plain group keeps every layer's residuals; a checkpointed one its segments' boundaries
        (and, under a policy, what the policy saves of each layer).
        """
        residuals, ys_parts = [], []
        for g in _groups(segments, self._policies(segments, policies)):
            a = base + g.start
            if not g.checkpointed:
                prog = self.program()

                def step(carry, i, a=a, prog=prog):
                    c, stacks, live = carry
                    c, y, stacks, _ = prog.forward(self.params, self.xs, self.consts, a + i, c, live, stacks, i)
                    return (c, stacks, live), y
                n = g.n_seg * g.k
                (c, res, live), ys = _scan(step, (c, self._stacks(prog, n, alive(c)), live), n)
                res = _one_layer(res, n)
            else:  # keep the boundary; run the layers as a plain segment does, their residuals unused
                prog = self.program(g.policy if g.inner is None else None, g.k > 1 or not self.lean)

                def step(carry, s, a=a, g=g, prog=prog):
                    def layer(carry, j):
                        c, live = carry
                        c, y, kept, saved = prog.forward(self.params, self.xs, self.consts, a + s * g.k + j, c, live)
                        return (c, alive(kept, alive=live)), (y, saved)
                    (out, live), (ys, saved) = _scan(layer, carry, g.k)
                    return (out, live), (ys, (carry[0], saved))
                (c, live), (ys, res) = _scan(step, (c, live), g.n_seg)
                ys = _flat_ys(ys, g.n_seg, g.k)
            residuals.append(res)
            ys_parts.append(ys)
        ys = ys_parts[0] if len(ys_parts) == 1 else _tree.tree_map(lambda *t: jnp.concatenate(t), *ys_parts)
        return c, ys, residuals, live

    def _stacks(self, prog: LayerProgram, n: int, live):
        """Zero buffers for ``n`` layers' residuals, made once ``live`` is (not earlier); None for n == 1."""
        return None if n == 1 else [tie(z, live) for z in prog.stacks(n)]

    def _ct_y(self, j):
        """The cotangent of layer ``j``'s ``y`` output."""
        return None if self.ct_ys is None else take(self.ct_ys, j)

    def _accumulate(self, state, slots, j):
        """Add layer ``j``'s gradient slots into ``state``; the new carry cotangent."""
        _, gp, gx, gk = state
        dc, dp, dx, dk = slots
        gk = [None if g is None else g + d for g, d in zip(gk, dk)]
        return dc, _put(gp, dp, j), _put(gx, dx, j), gk

    def _backward_layers(self, a, n: int, res, state, live):
        """Layers ``a + n - 1 .. a`` in reverse, from their stacked residuals ``res``."""
        return _reverse(lambda st, i: self.layer_grads(a + i, res, i, st, self._ct_y(a + i), live), state, n)

    def backward(self, segments, base, residuals, state, live, policies=None):
        """Pull ``state`` back through ``segments`` (starts relative to ``base``) in reverse.

        ``live``: read by the first computations (what the caller left unused).
        """
        groups = _groups(segments, self._policies(segments, policies))
        for g, res in reversed(list(zip(groups, residuals))):
            a = base + g.start
            if not g.checkpointed:
                state = self._backward_layers(a, g.n_seg * g.k, res, state, live)
            else:
                state = self._backward_checkpointed(g, a, res, state, live)
        return state

    def _backward_checkpointed(self, g: _Group, a, res, state, live_in):
        """Each segment in reverse: recompute it from its boundary, then pull back through it.

        The recompute's predicates read the cotangent that reaches the segment, so it runs in
        the backward pass (else XLA may run it with the forward pass and keep its residuals as
        long as no remat would); the backward's predicates read the recompute's last carry and
        ys, which nothing else reads, so that its computations keep every output.
        """
        boundaries, saved = res

        def segment(state, s):
            start = a + s * g.k
            b, live = take(boundaries, s), alive(state[0], alive=live_in)
            if g.inner is not None:
                inner = g.inner.segments_for(g.k)
                c, ys, inner_res, live = self.forward(inner, start, b, live)
                return self.backward(inner, start, inner_res, state, alive(c, ys, alive=live))
            prog, seg_saved = self.program(g.policy, g.k > 1 or not self.lean), take(saved, s)

            def layer(carry, j):
                c, stacks = carry
                c, y, stacks = prog.recompute(self.params, self.xs, self.consts, start + j, c, take(seg_saved, j),
                                              live, stacks, j)
                return (c, stacks), y
            (c, kept), ys = _scan(layer, (b, self._stacks(prog, g.k, live)), g.k)
            return self._backward_layers(start, g.k, _one_layer(kept, g.k), state, alive(c, ys))

        if g.n_seg == 1:
            return segment(state, _first_index())
        return lax.scan(lambda st, s: (segment(st, s), None), state, jnp.arange(g.n_seg), reverse=True)[0]


def _predicate_source(params, consts, xs) -> Callable:
    """``(params, consts, xs, carry_or_cotangent) -> value`` for the isolated computations' predicate.

    The first leaf of ``params``, ``consts`` or ``xs`` that is traced where the stack is called
    (a value XLA cannot fold; arrays closed over by the caller are constants), else the carry
    (the cotangent in the backward pass). Parameters first: they are not batched under ``jax.vmap``.
    """
    groups = (params, consts, xs)
    for g, tree in enumerate(groups):
        for j, leaf in enumerate(_tree.tree_leaves(tree)):
            if isinstance(leaf, jax.core.Tracer) and jnp.issubdtype(jnp.result_type(leaf), jnp.number):
                return lambda *trees, g=g, j=j: _tree.tree_leaves(trees[g])[j]
    return lambda *trees: trees[3]


def remat_segments(fn: Callable, params: Any, carry: Any, xs: Any, consts: list, segments: tuple[Segment, ...],
                   policy: "Callable | None | Sequence[Callable | None]", lean: bool = False) -> tuple[Any, Any]:
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
        lean: a checkpointed one-layer segment under a policy saves only what its residuals need
            (its recompute does not rebuild its output carry), where by default it saves what every
            segment saves per layer, the carry's needs included (so that saved bytes are linear in
            a segment's length). ``remat_scan`` sets it under ``custom_vjp_residuals="save"``: a
            saved value the carry reads would change the forward pass's program (see
            :func:`jaxremat.render.remat_scan`).

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
    source = _predicate_source(params, consts, xs)
    as_differentiated: dict = {}

    @jax.custom_vjp
    def run(params, carry, xs, consts):
        return _Stack(fn, params, xs, consts, policy, carry_template, None).plain(0, n_layer, carry)

    def run_fwd(params, carry, xs, consts):
        stack = _Stack(fn, params, xs, consts, policy, carry_template, source(params, consts, xs, carry), lean=lean,
                       as_differentiated=as_differentiated)
        c, ys, residuals, live = stack.forward(segments, 0, carry, alive(), per_segment)
        if _groups(segments, stack._policies(segments, per_segment))[-1].checkpointed:
            # the last segment's unused residuals: read into its boundary
            boundaries, saved = residuals[-1]
            residuals[-1] = (tie(boundaries, live, last=True), saved)
        return (c, ys), (params, xs, consts, residuals)

    def run_bwd(saved, ct):
        params, xs, consts, residuals = saved
        ct_c, ct_ys = ct
        stack = _Stack(fn, params, xs, consts, policy, carry_template, source(params, consts, xs, ct_c), ct_ys=ct_ys,
                       lean=lean, as_differentiated=as_differentiated)
        state = (_ct_slots(ct_c, carry_template), _zeros(params), _zeros(xs), _zeros(consts))
        ct_c, gp, gx, gk = stack.backward(segments, 0, residuals, state, alive(), per_segment)
        unflat = lambda tree, slots: _tree.tree_unflatten(_tree.tree_structure(tree), slots)
        return unflat(params, gp), unflat(carry_template, ct_c), unflat(xs, gx), list(gk)

    run.defvjp(run_fwd, run_bwd)
    return run(params, carry, xs, consts)
