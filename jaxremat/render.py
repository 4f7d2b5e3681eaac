"""Render a neutral remat schedule onto any stack of blocks: :func:`remat_scan`.

The stack is given as parameters stacked on a leading layer axis N (any pytree) and a
``block_fn(layer_params, carry, layer_xs) -> carry``; nothing here knows about transformers.
``schedule.segments_for(N)`` gives contiguous segments; a checkpointed segment keeps only its
input (its boundary) and recomputes its layers in the backward pass (Chen et al. 2016,
arXiv:1604.06174).

Two renderings, chosen with ``method``:

* ``"reverse_loop"`` (default): :func:`jaxremat.segment_vjp.remat_segments`, the reverse segment
  loop written out as one ``jax.custom_vjp`` over per-layer ``lax.scan`` s. Every layer reads its
  own parameter slice and writes its own gradient slice in place, and a recompute runs in the
  backward pass by construction, so XLA's compiled temp memory follows the chain model (measured:
  docs/memory-model.md). Reverse mode (``grad``, ``vjp``, ``grad`` of ``grad``) and forward over
  reverse (``jax.jvp`` of ``jax.grad``); not ``jax.jvp`` of the stack itself.
* ``"checkpoint"``: ``jax.checkpoint(policy=...)`` around scanned segments, JAX's own remat. Also
  differentiable in forward mode (``jax.jvp``, Hessian-vector products). Its compiled memory is
  XLA's to keep (measured on XLA:CPU, jax 0.10.2): a group of equal segments is an outer scan over
  a ``(n_seg, k, ...)`` view of the parameters, whose k-layer slice and gradient slice XLA
  materialises per segment; segments of several lengths ``lax.split`` the parameters and
  concatenate their gradients (copies); a checkpointed group of ONE segment is an outer loop of
  trip count one that XLA's while-loop simplifier removes, after which the recompute is scheduled
  with the forward pass and saves nothing (``segments(2)``, ``sqrt`` at N <= 6).
  :func:`jaxremat.survival.survival_check` tells whether a given program kept its saving.

Bitwise equality with ``none`` (measured on XLA:CPU, jax 0.10.2; tests/jaxremat/test_render.py,
tests/jaxremat/test_bitwise_jit.py): in the reverse loop every plan gives the bits of ``none``, op by
op and under ``jit``, at every width (each layer runs as one isolated XLA computation,
:mod:`jaxremat.layer_pass`). ``method="checkpoint"``: op by op every schedule gives ``none``'s bits
for the stacked parameters, but not for an array the block closes over (a trained value not passed
as a stacked parameter) under a schedule with segments of several layers: JAX's scan transpose sums
its gradient per segment, then across segments (``(g3 + g2) + (g1 + g0)`` at N=4 under
``every_k(2)``), where ``none`` and the reverse loop add it layer by layer, last layer first
(measured: 1 ULP op by op and 8 under ``jit`` at N=4, D=16; 128 ULP op by op at N=8, D=128;
docs/framework-differences.md, section 10). ``full`` and the reverse loop are bitwise.
Under ``jit`` one-layer segments at small widths round apart
(docs/framework-differences.md, section 2).

One layer. A stack of N = 1 runs as ``method="checkpoint"`` whatever ``method`` says: there every
schedule is one segment, XLA removes the scan of one trip and merges ``full``'s recompute with the
forward pass, so every schedule compiles to ``none``'s program (measured bitwise under ``jit`` on the
GPT block at d_model 4-96 with and without dropout and bfloat16, and on MLP stacks of four shape
families, for ``full``, ``every_k(2)``, ``sqrt`` and one-segment plans with ``save_dots`` and
``save_nothing``), and the reverse loop's isolated layer kept its residuals in buffers of its own
(an MLP layer at D 512, F 2048, B 256: 7.34 MB of temp against 2.62; docs/memory-model.md, section 7).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.extend
from jax import lax

from .custom_vjp import check_custom_vjp_residuals, custom_vjp_policy, save_custom_vjp_residuals
from .policies import policy_name, to_jax_policy
from .segment_vjp import remat_segments
from .spec.lint import resolve_plan
from .spec.plan import RematPlan, check_default_policy
from .spec.schedules import Schedule, Segment

__all__ = ["METHODS", "ScanGroup", "plan_groups", "remat_scan", "stack_depth"]


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
    policy: Any = None


def plan_groups(segments: tuple[Segment, ...]) -> tuple[ScanGroup, ...]:
    """Group consecutive segments with equal length, ``checkpointed`` flag, inner schedule and policy.

    ``policy`` is the segment's own :class:`jaxremat.spec.policies.Policy` (segment plans), None
    where it follows the renderer's ``policy=``.

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
                and last.inner == seg.inner and last.policy == seg.policy):
            groups[-1] = dataclasses.replace(last, stop=seg.stop, n_seg=last.n_seg + 1)
        else:
            groups.append(ScanGroup(seg.start, seg.stop, seg.length, 1, seg.checkpointed, seg.inner, seg.policy))
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


METHODS = ("reverse_loop", "checkpoint")
"""The renderings of :func:`remat_scan` (see the module docstring)."""


def remat_scan(
    block_fn: Callable[[Any, Any, Any], Any],
    stacked_params: Any,
    carry: Any,
    schedule: Schedule | RematPlan | str,
    *,
    xs: Any = None,
    policy: Any = None,
    with_outputs: bool = False,
    method: str = "reverse_loop",
    custom_vjp_residuals: str = "recompute",
    carry_sharding: Any = None,
) -> Any:
    """Run ``carry = block_fn(params[i], carry, xs[i])`` for i = 0..N-1 under a remat schedule.

    Args:
        block_fn: ``(layer_params, carry, layer_xs) -> carry`` for one layer; ``layer_params``
            and ``layer_xs`` are the i-th slices (leading axis removed). Must return a carry of
            the same structure, shapes and dtypes. With ``with_outputs=True`` it returns
            ``(carry, y)``, ``y`` a per-layer output (e.g. the layer's updated running statistics).
        stacked_params: pytree of arrays with a common leading layer axis N.
        carry: pytree threaded through the layers (e.g. the (B, T, D) residual stream).
        schedule: a :mod:`jaxremat.spec.schedules` value or its name (``"sqrt"``,
            ``"every_k(2)"``, ``"nested(sqrt,sqrt)"``, a segment plan
            ``"plan(3*2+save_dots,1+attention_only,4:store)"``), resolved with ``segments_for(N)``;
            or a whole plan, schedule and policy together (a :class:`jaxremat.spec.plan.RematPlan`
            or its name, ``"sqrt+save_dots"``), read as :func:`torchref.render.forward_blocks`
            reads it (:func:`jaxremat.spec.lint.resolve_plan`).
        xs: optional extra per-layer pytree with leading axis N (e.g. (N,) dropout keys); the
            same slice is fed to the recompute, so random masks are reproduced exactly.
        policy: what a checkpointed segment keeps inside itself: a policy name or
            :class:`jaxremat.spec.policies.Policy` (rendered by
            :func:`jaxremat.policies.to_jax_policy`), a raw ``jax.checkpoint`` policy, or None
            (keep nothing). For nested schedules it applies to the inner segments; an outer
            segment keeps only its input. For a segment plan it is the default of the segments
            that name no policy of their own; a segment's own policy wins (rendered the same way).
        with_outputs: if True, ``block_fn`` returns ``(carry, y)`` and the result is
            ``(carry, ys)``, the ``y`` of every layer stacked on a leading axis N in layer order
            (as ``lax.scan``'s ``ys``). Each layer's ``y`` comes out once, from the forward pass:
            a recompute in the backward pass produces values, not outputs, so state carried out
            this way (Flax ``batch_stats``) is updated once per step under every schedule.
        method: ``"reverse_loop"`` (default; compiled memory as the chain model predicts; reverse
            mode and ``jax.jvp`` of ``jax.grad``) or ``"checkpoint"`` (``jax.checkpoint`` over
            scanned segments; also ``jax.jvp`` of the stack itself). A stack of one layer runs as
            ``"checkpoint"`` under either. See the module docstring.
        custom_vjp_residuals: what a checkpointed segment does with the block's ``jax.custom_vjp``
            ops. ``"recompute"`` (default): like any op, recomputed in the backward pass, the rule's
            ``fwd`` running again there. ``"save"``: the outputs of each rule's ``fwd`` (its
            residuals and its result) are kept from the forward pass, so ``fwd`` runs once per layer
            and never in the backward pass; costs their bytes per checkpointed layer. Counts and bytes
            measured per schedule: :mod:`jaxremat.custom_vjp`.
        carry_sharding: under a device mesh, the sharding of the carry at every block boundary
            (a ``jax.sharding.Sharding`` for every leaf, or a pytree of them matching ``carry``),
            applied with ``jax.lax.with_sharding_constraint`` to each block's input and output,
            in the forward pass and in every recompute alike (e.g. the batch-sharded residual
            stream, :func:`jaxremat.sharding.activation_sharding`). Without it XLA's SPMD
            partitioner propagates shardings into each block on its own, and may split a
            recomputed block's matmuls differently from the forward pass's (another summation
            order: gradients a few ULP off ``none``; measured in docs/sharding.md). None (default):
            no constraint.

    Returns:
        The carry after the N layers; ``(carry, ys)`` with ``with_outputs=True``.

    Raises:
        ValueError: leaves of ``stacked_params``/``xs`` disagree on N, an unknown schedule name
            or ``method``, or the schedule is invalid for depth N (e.g. ``segments(s)`` with
            ``s > N``, a segment plan whose lengths do not sum to N), ``custom_vjp_residuals`` is
            not ``"recompute"`` or ``"save"``, or a ``policy`` that keeps something while every
            checkpointed segment of a segment plan names its own
            (:func:`jaxremat.spec.plan.check_default_policy`), or a plan that names a policy
            given together with ``policy=``, or a policy in the default rendering with JAX's
            ``jax_remat3`` flag on under JAX < 0.11 (wrong gradients measured there), or
            ``custom_vjp_residuals="save"`` with ``jax.checkpoint`` segments (``method="checkpoint"``, or a
            stack of one layer) and ``jax_remat3`` on: JAX then runs each rule's primal, not its ``fwd``, in a
            checkpointed forward pass, so there are no residuals to keep (JAX 0.10.2 and 0.12.0.1 measured).

    Warns:
        RematPolicyWarning: ``custom_vjp_residuals="save"`` on a block with no ``jax.custom_vjp`` op.

    Source: Chen et al. 2016, arXiv:1604.06174; ``jax.custom_vjp`` (``"reverse_loop"``),
    ``jax.checkpoint`` + ``jax.lax.scan`` (``"checkpoint"``).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    schedule, policy = resolve_plan(schedule, policy)
    jax_policy = to_jax_policy(policy)
    n_layer = stack_depth(stacked_params, xs)
    if method == "reverse_loop" and n_layer == 1:
        method = "checkpoint"  # one layer: see the module docstring, "One layer"
    segments = schedule.segments_for(n_layer)
    check_default_policy(segments, None if jax_policy is None else policy_name(policy), "remat_scan")
    save = check_custom_vjp_residuals(custom_vjp_residuals) == "save"
    if save:
        block_fn, jax_policy = save_custom_vjp_residuals(block_fn), custom_vjp_policy(jax_policy)
    policy_of = _segment_policies(jax_policy, save)
    if carry_sharding is not None:
        block_fn = _constrain_carry(block_fn, carry_sharding, with_outputs)
    if save and method == "checkpoint":
        _refuse_remat3_save(segments, n_layer)
    if method == "reverse_loop":
        if save:
            segments = _one_layer_segments(segments)
        per_segment = (tuple(policy_of(s.policy) for s in segments) if any(s.policy is not None for s in segments)
                       else jax_policy)
        if any(s.checkpointed for s in segments):  # a plan that checkpoints nothing runs no policy
            _refuse_remat3_policy(per_segment, save)
        return _reverse_loop(block_fn, stacked_params, carry, segments, xs, per_segment, with_outputs, save)
    return _checkpoint_scan(block_fn, stacked_params, carry, segments, xs, jax_policy, with_outputs, policy_of)


def _one_layer_segments(segments: tuple[Segment, ...]) -> tuple[Segment, ...]:
    """Every checkpointed segment (without an inner schedule) split into segments of one layer.

    Under ``custom_vjp_residuals="save"`` in the reverse loop: a saved output of a rule's ``fwd``
    read by the carry (``h + op(h)``) is rounded on its own, where the forward pass fused it into
    the carry (XLA:CPU: one fused multiply-add), so a carry recomputed from it is not the forward's;
    each layer's input is kept instead (docs/framework-differences.md, section 10).
    """
    out = []
    for seg in segments:
        if seg.checkpointed and seg.inner is None and seg.length > 1:
            out += [dataclasses.replace(seg, start=i, stop=i + 1) for i in range(seg.start, seg.stop)]
        else:
            out.append(seg)
    return tuple(out)


def _refuse_remat3_policy(per_segment, save: bool = False) -> None:
    """Refuse a policy in the reverse segment loop under ``jax_remat3`` on JAX < 0.11: measured wrong
    gradients op by op there (max relative error 1.66 at ``full+save_dots``; docs/usage.md, "JAX versions").
    ``save``: the policy is ``custom_vjp_residuals="save"``'s, which ``method='checkpoint'`` refuses under the
    flag too (:func:`_refuse_remat3_save`), so the message does not offer it."""
    policies = per_segment if isinstance(per_segment, tuple) else (per_segment,)
    if any(p is not None for p in policies) and jax.config.jax_remat3 and jax.__version_info__ < (0, 11):
        what = "custom_vjp_residuals='save' (a policy" if save else "a policy"
        way_out = "pass custom_vjp_residuals='recompute'" if save else "pass method='checkpoint'"
        raise ValueError(f"remat_scan: {what} in the reverse segment loop{')' if save else ''} under jax_remat3 "
                         f"gives wrong gradients on JAX {jax.__version__}; turn the flag off "
                         f"(jax.config.update('jax_remat3', False)), {way_out}, or use JAX >= 0.11")


def _refuse_remat3_save(segments: tuple[Segment, ...], n_layer: int) -> None:
    """Refuse ``custom_vjp_residuals="save"`` through ``jax.checkpoint`` under ``jax_remat3``: there a checkpointed
    forward pass runs a ``custom_vjp``'s primal, not its ``fwd``, so nothing of the rule is kept and ``fwd``
    runs in every recompute, as under ``"recompute"`` (docs/usage.md, "JAX versions")."""
    if jax.config.jax_remat3 and any(seg.checkpointed for seg in segments):
        way_out = "pass method='reverse_loop', " if n_layer > 1 and jax.__version_info__ >= (0, 11) else ""
        one_layer = " (a stack of one layer runs jax.checkpoint under either method)" if n_layer == 1 else ""
        raise ValueError(f"remat_scan: custom_vjp_residuals='save' keeps nothing through jax.checkpoint under "
                         f"jax_remat3{one_layer}: JAX runs each custom_vjp's primal in the checkpointed forward pass, "
                         f"not its fwd; {way_out}turn the flag off (jax.config.update('jax_remat3', False)), or pass "
                         f"custom_vjp_residuals='recompute'")


def _constrain_carry(block_fn: Callable, sharding: Any, with_outputs: bool) -> Callable:
    """``block_fn`` with its carry pinned to ``sharding`` on the way in and on the way out."""
    def pin(carry):  # one Sharding is a pytree prefix of any carry: it applies to every leaf
        return lax.with_sharding_constraint(carry, sharding)

    def constrained(layer_params, carry, layer_xs):
        out = block_fn(layer_params, pin(carry), layer_xs)
        return (pin(out[0]), out[1]) if with_outputs else pin(out)

    return constrained


def _segment_policies(default: Callable | None, save_custom_vjp: bool) -> Callable[[Any], Callable | None]:
    """``policy_of(spec_policy)``: the ``jax.checkpoint`` policy of a segment that names ``spec_policy``
    (its own, from a segment plan), or ``default`` for None. One callable per distinct policy, so that
    segments naming equal policies group together."""
    cache: dict = {}

    def policy_of(spec_policy):
        if spec_policy is None:
            return default
        if spec_policy not in cache:
            p = to_jax_policy(spec_policy)
            cache[spec_policy] = custom_vjp_policy(p) if save_custom_vjp else p
        return cache[spec_policy]

    return policy_of


def _reverse_loop(block_fn, stacked_params, carry, segments, xs, jax_policy, with_outputs, lean=False):
    """``method="reverse_loop"``: closure-convert one layer and hand it to :func:`remat_segments`."""
    def layer(p, c, x):
        out = block_fn(p, c, x)
        return out if with_outputs else (out, None)

    fn, consts = _closure_convert(layer, stacked_params, carry, xs)
    out, ys = remat_segments(fn, stacked_params, carry, xs, consts, segments, jax_policy, lean)
    return (out, ys) if with_outputs else out


def _closure_convert(layer, stacked_params, carry, xs):
    """``(fn(p, c, x, consts), consts)``: ``layer`` with every array it closes over made explicit.

    Like ``jax.closure_convert``, but every closed-over array becomes an argument, not only the
    ones that may carry a tangent: a layer's closed-over mask or constant is then read again in the
    backward pass instead of being kept once per layer or segment among the residuals.
    """
    tree = jax.tree_util
    slice0 = lambda t: tree.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), t)
    carry_sds = tree.tree_map(lambda a: jax.ShapeDtypeStruct(jax.numpy.shape(a), jax.numpy.result_type(a)), carry)
    flat, in_tree = tree.tree_flatten((slice0(stacked_params), carry_sds, None if xs is None else slice0(xs)))
    closed, out_shape = jax.make_jaxpr(lambda *leaves: layer(*tree.tree_unflatten(in_tree, leaves)),
                                       return_shape=True)(*flat)
    out_tree = tree.tree_structure(out_shape)

    def fn(p, c, x, consts):
        outs = jax.extend.core.jaxpr_as_fun(jax.extend.core.ClosedJaxpr(closed.jaxpr, consts))(
            *tree.tree_leaves((p, c, x)))
        return tree.tree_unflatten(out_tree, outs)

    return fn, list(closed.consts)


def _checkpoint_scan(block_fn, stacked_params, carry, segments, xs, jax_policy, with_outputs, policy_of=None):
    """``method="checkpoint"``: ``jax.checkpoint`` around nested scans (JAX's own remat).

    ``policy_of(group.policy)`` is a group's ``jax.checkpoint`` policy (its own, for a segment
    plan's segments); ``jax_policy`` that of groups naming none and of nested inner segments.
    """
    policy_of = policy_of or (lambda spec_policy: jax_policy)
    groups = plan_groups(segments)
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
            body = jax.checkpoint(run_segment, policy=policy_of(g.policy), prevent_cse=False)
        else:  # nested: the outer segment keeps its input only; its recompute runs the inner schedule
            def run_inner(c, seg_params, seg_xs):
                out = remat_scan(block_fn, seg_params, c, g.inner, xs=seg_xs, policy=jax_policy,
                                 with_outputs=with_outputs, method="checkpoint")
                return out if with_outputs else (out, None)

            body = jax.checkpoint(run_inner, prevent_cse=False)
        return lambda c, seg: body(c, *seg)

    ys_parts = []
    for g, p, x in zip(groups, param_parts, xs_parts):
        if g.checkpointed and g.k == 1 and g.inner is None:
            # One-layer segments: checkpoint the layer in a scan over the layers. A (n_seg, 1, ...)
            # view would give XLA a unit axis whose layout it changes with a copy of the parameters.
            body = jax.checkpoint(lambda c, layer: layer_step(c, layer), policy=policy_of(g.policy), prevent_cse=False)
            carry, ys = lax.scan(body, carry, (p, x))
        elif g.checkpointed:
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
