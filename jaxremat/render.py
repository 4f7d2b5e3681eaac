"""Render a neutral remat schedule onto any stack of blocks as nested ``lax.scan`` s.

The stack is given as parameters stacked on a leading layer axis N (any pytree) and a
``block_fn(layer_params, carry, layer_xs) -> carry``; nothing here knows about transformers.

Why scans: XLA:CPU merges the recompute of ``jax.checkpoint`` on a Python-unrolled stack of
layers back into the forward computation, so compiled memory does not drop. Remat of a
``lax.scan`` body survives compilation, so every segment schedule becomes nested scans.

Structure. ``schedule.segments_for(N)`` gives contiguous segments. Consecutive segments of equal
length ``k`` and equal ``checkpointed`` flag form one *group* of ``n_seg`` segments:

* checkpointed group -- the group's params are split off the stack (``lax.split``, whose
  transpose is a concatenate, so no gradient is padded or summed with zeros) and reshaped to
  ``(n_seg, k, ...)``; an outer ``lax.scan`` over the ``n_seg`` segments has the body
  ``jax.checkpoint(inner lax.scan over k layers, policy=policy, prevent_cse=False)``. The
  forward pass therefore keeps each segment's input (its boundary) plus whatever ``policy``
  saves, and recomputes the segment interior in the backward pass (Chen et al. 2016,
  arXiv:1604.06174).
* not-checkpointed group -- one plain ``lax.scan`` over its ``n_seg * k`` layers; every
  residual of every layer is kept, as without remat.

``none`` is one plain scan over all N layers. Rounding is the schedule's (see
:mod:`jaxremat.spec.schedules`): ``every_k(3)`` at N=5 gives a group (1 segment x 3 layers) and a
remainder group (1 x 2); ``sqrt`` at N=8 gives ``segments(3)`` = 2 checkpointed segments of 2
layers then a plain scan over the last 4.

Bitwise equality with ``none`` (measured on XLA:CPU, jax 0.10.2; tests/jaxremat/test_render.py).
Op by op (``jax.disable_jit()``) every schedule gives the same bits as ``none``: the recompute
runs the same primitives on the same values. Under ``jax.jit``: at the default config (N=8,
D=64, T=64, B=4; float32 and float64; with and without dropout) every schedule is bitwise.
Groups whose segments hold >= 2 layers were bitwise at every shape measured: their inner scan
keeps the no-remat structure (recompute in a forward loop, stacked residuals read back in a
backward loop). A group of 1-layer segments (``full``, a 1-layer remainder such as
``every_k(2)`` at N=5) runs an inner scan of trip count 1, which XLA's while-loop simplifier
removes; the layer is then compiled outside a loop body, its reductions are emitted differently,
and at small shapes (D=16, D=32) gradients differ in the last bits (<= 4.5e-7 of each tensor's
largest entry in float32, 5.7e-16 in float64). With
``XLA_FLAGS=--xla_disable_hlo_passes=simplify-while-loops`` those cases are bitwise again.

``prevent_cse=False``: ``jax.checkpoint`` by default wraps its recompute in an optimization
barrier so XLA's common-subexpression elimination cannot merge the recompute with the original
forward computation (which would silently undo remat). Inside ``lax.scan`` the recompute lives in
the body of the backward loop and the original in the forward loop, two different while-loop
computations that CSE cannot merge, so the barrier is unnecessary; the ``jax.checkpoint``
docstring says so ("when used inside a lax.scan, this CSE prevention mechanism is unnecessary")
and the barrier can block fusion.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
from jax import lax

from .policies import to_jax_policy
from .spec.schedules import Schedule, Segment

__all__ = ["ScanGroup", "plan_groups", "remat_scan", "stack_depth"]


@dataclasses.dataclass(frozen=True)
class ScanGroup:
    """Layers ``[start, stop)`` run as ``n_seg`` segments of ``k`` layers each.

    Checkpointed: one outer scan over ``n_seg`` whose body is a checkpointed inner scan over ``k``.
    Not checkpointed: one plain scan over ``n_seg * k`` layers.
    """

    start: int
    stop: int
    k: int
    n_seg: int
    checkpointed: bool
    inner: Any = None


def plan_groups(segments: tuple[Segment, ...]) -> tuple[ScanGroup, ...]:
    """Group consecutive segments with equal length and equal ``checkpointed`` flag.

    Example: ``every_k(2)`` at N=5 -> ``(ScanGroup(0, 4, 2, 2, True), ScanGroup(4, 5, 1, 1, True))``.

    Raises:
        ValueError: segments are empty, not contiguous from 0, or empty-length.
    """
    if not segments:
        raise ValueError("a schedule must resolve to at least one segment")
    groups: list[ScanGroup] = []
    expect = 0
    for seg in segments:
        if seg.start != expect or seg.length < 1:
            raise ValueError(f"segments must be contiguous, non-empty and start at 0; got {segments}")
        expect = seg.stop
        last = groups[-1] if groups else None
        if (last is not None and last.k == seg.length and last.checkpointed == seg.checkpointed
                and last.inner == seg.inner):
            groups[-1] = dataclasses.replace(last, stop=seg.stop, n_seg=last.n_seg + 1)
        else:
            groups.append(ScanGroup(seg.start, seg.stop, seg.length, 1, seg.checkpointed, seg.inner))
    return tuple(groups)


def stack_depth(stacked_params: Any, xs: Any = None) -> int:
    """The common leading-axis size N of every leaf of ``stacked_params`` (and ``xs``).

    Raises:
        ValueError: no leaves, a scalar leaf, or leading axes that differ (message lists them).
    """
    leaves = jax.tree_util.tree_leaves(stacked_params) + jax.tree_util.tree_leaves(xs)
    if not leaves:
        raise ValueError("stacked_params has no array leaves; cannot infer the number of layers")
    sizes = {leaf.shape[0] if getattr(leaf, "ndim", 0) >= 1 else None for leaf in leaves}
    if None in sizes or len(sizes) != 1:
        raise ValueError(
            "every leaf of stacked_params and xs needs the same leading layer axis; "
            f"got leading sizes {sorted(s for s in sizes if s is not None)}"
            + (" and a scalar leaf" if None in sizes else "")
        )
    return sizes.pop()


def _split_groups(tree: Any, groups: tuple[ScanGroup, ...]) -> list[Any]:
    """Per-group slices of a stacked pytree along axis 0 (static sizes; one split per leaf)."""
    if len(groups) == 1:
        return [tree]
    sizes = [g.stop - g.start for g in groups]
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    parts = [lax.split(leaf, sizes, axis=0) for leaf in leaves]
    return [jax.tree_util.tree_unflatten(treedef, [p[i] for p in parts]) for i in range(len(groups))]


def _segment_major(tree: Any, g: ScanGroup) -> Any:
    """Reshape leading axis ``n_seg * k`` to ``(n_seg, k)``."""
    return jax.tree_util.tree_map(lambda a: a.reshape((g.n_seg, g.k) + a.shape[1:]), tree)


def remat_scan(
    block_fn: Callable[[Any, Any, Any], Any],
    stacked_params: Any,
    carry: Any,
    schedule: Schedule,
    *,
    xs: Any = None,
    policy: Any = None,
    with_outputs: bool = False,
) -> Any:
    """Run ``carry = block_fn(params[i], carry, xs[i])`` for i = 0..N-1 under a remat schedule.

    Args:
        block_fn: ``(layer_params, carry, layer_xs) -> carry`` for one layer; ``layer_params``
            and ``layer_xs`` are the i-th slices (leading axis removed). Must return a carry of
            the same structure, shapes and dtypes. With ``with_outputs=True`` it returns
            ``(carry, y)``, ``y`` a per-layer output (e.g. the layer's updated running statistics).
        stacked_params: pytree of arrays with a common leading layer axis N.
        carry: pytree threaded through the layers (e.g. the (B, T, D) residual stream).
        schedule: a :mod:`jaxremat.spec.schedules` value, resolved with ``segments_for(N)``.
        xs: optional extra per-layer pytree with leading axis N (e.g. (N,) dropout keys); the
            same slice is fed to the recompute, so random masks are reproduced exactly.
        policy: what a checkpointed segment keeps inside itself: a policy name or
            :class:`jaxremat.spec.policies.Policy` (rendered by
            :func:`jaxremat.policies.to_jax_policy`), a raw ``jax.checkpoint`` policy, or None
            (keep nothing). For nested schedules it applies to the inner segments; an outer
            segment keeps only its input.
        with_outputs: if True, ``block_fn`` returns ``(carry, y)`` and the result is
            ``(carry, ys)``, the ``y`` of every layer stacked on a leading axis N in layer order
            (as ``lax.scan``'s ``ys``). Each layer's ``y`` comes out once, from the forward pass:
            a recompute in the backward pass produces values, not outputs, so state carried out
            this way (Flax ``batch_stats``) is updated once per step under every schedule.

    Returns:
        The carry after the N layers; ``(carry, ys)`` with ``with_outputs=True``.

    Raises:
        ValueError: leaves of ``stacked_params``/``xs`` disagree on N, or the schedule is
            invalid for depth N (e.g. ``segments(s)`` with ``s > N``).

    Source: ``jax.checkpoint`` + ``jax.lax.scan``; Chen et al. 2016, arXiv:1604.06174.
    """
    jax_policy = to_jax_policy(policy)
    n_layer = stack_depth(stacked_params, xs)
    groups = plan_groups(schedule.segments_for(n_layer))
    param_parts = _split_groups(stacked_params, groups)
    xs_parts = _split_groups(xs, groups) if xs is not None else [None] * len(groups)

    def layer_step(c, layer):
        layer_params, layer_xs = layer
        out = block_fn(layer_params, c, layer_xs)
        return out if with_outputs else (out, None)

    def run_segment(c, seg_params, seg_xs):
        return lax.scan(layer_step, c, (seg_params, seg_xs))  # (carry, ys of the k layers)

    def segment_step_for(g: ScanGroup):
        if g.inner is None:
            body = jax.checkpoint(run_segment, policy=jax_policy, prevent_cse=False)
        else:  # nested: the outer segment keeps its input only; its recompute runs the inner schedule
            def run_inner(c, seg_params, seg_xs):
                out = remat_scan(block_fn, seg_params, c, g.inner, xs=seg_xs, policy=jax_policy,
                                 with_outputs=with_outputs)
                return out if with_outputs else (out, None)

            body = jax.checkpoint(run_inner, prevent_cse=False)
        return lambda c, seg: body(c, *seg)

    ys_parts = []
    for g, p, x in zip(groups, param_parts, xs_parts):
        if g.checkpointed:
            carry, ys = lax.scan(segment_step_for(g), carry, (_segment_major(p, g), _segment_major(x, g)))
            ys = jax.tree_util.tree_map(lambda a: a.reshape((g.n_seg * g.k,) + a.shape[2:]), ys)
        else:
            carry, ys = run_segment(carry, p, x)
        ys_parts.append(ys)
    if not with_outputs:
        return carry
    if len(ys_parts) == 1:
        return carry, ys_parts[0]
    return carry, jax.tree_util.tree_map(lambda *a: jax.numpy.concatenate(a, axis=0), *ys_parts)
