"""Remat schedules and named policies for your own Flax models (NNX and Linen).

Both entry points run a *stacked* block -- every variable carries a leading layer axis N -- over
an input as :func:`jaxremat.render.remat_scan` does: nested ``lax.scan`` s, with
``jax.checkpoint(policy=...)`` around the checkpointed segments. Nothing here knows what the block
computes (an MLP-Mixer block, a conv block, a transformer block).

* :func:`remat_stack` (Flax NNX): ``stack`` is an ``nnx.Module`` made the usual way, e.g.
  ``nnx.split_rngs(splits=N)`` + ``nnx.vmap(in_axes=(0,), out_axes=0)`` over the block's
  constructor. Inside each scan step the layer is rebuilt with ``nnx.merge`` from its slice of the
  stacked state and called; it works under ``jax.jit``, ``nnx.jit``, ``jax.grad`` and ``nnx.grad``.
  :class:`RematStack` is the same as a module attribute.
* :func:`linen_remat_stack` (Flax Linen): ``block.apply`` per layer on that layer's slice of
  stacked variables (e.g. from :func:`linen_init_stack`, or an ``nn.scan`` ed submodule's
  variables with ``variable_axes={"params": 0}``), with one dropout key per layer.

Dropout under remat. The recomputed forward of a checkpointed segment must draw the masks the
forward drew. JAX has no hidden RNG state, so it suffices that the recompute sees the same keys:

* NNX: each ``nnx.RngStream`` inside the stack (``nnx.Dropout(rate, rngs=rngs)`` forks one per
  layer) is fed to the scan as per-layer inputs -- its key and its *counter before the call*. A
  layer draws ``fold_in(key_i, count_i + j)`` for its j-th draw, in the forward and again,
  from the same slice, in the recompute. The counters the layers advance are written back to the
  stack once, after the scan, by the number of draws per layer (carried out of the scan as a
  uint32 per stream, never differentiated): exactly as a plain loop over the layers advances
  them, whatever the schedule, never twice.
* Linen: ``rngs={"dropout": key}`` is split into N layer keys (``jax.random.split(key, N)``),
  scanned alongside the parameters.
* Explicit keys of your own: pass them (leading axis N) as ``xs`` and use them in ``call``.

Source: ``jax.checkpoint`` + ``jax.lax.scan``; Chen et al. 2016, arXiv:1604.06174. NNX API:
``flax.nnx.split`` / ``nnx.merge`` / ``nnx.update`` (flax 0.12).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import flax.errors
import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from .custom_vjp import check_custom_vjp_residuals
from .fit import FittedPlan, fit_jax
from .flax_checks import (BUILD_HINT, LINEN_HINT, BlockContractError, check_carry, check_declared_shapes,
                          check_linen_shapes, check_one_layer, check_stacked)
from .lint import check_plan, plan_checked
from .planner import DEFAULT_MENU
from .policies import policy_name, to_jax_policy
from .render import remat_scan
from .spec.lint import resolve_plan
from .spec.plan import check_default_policy
from .spec.schedules import Schedule

__all__ = ["RematStack", "linen_init_stack", "linen_remat_stack", "plan_stack", "remat_stack", "resolve_policy",
           "resolve_schedule"]


def resolve_schedule(schedule: Schedule | str) -> Schedule:
    """A :mod:`jaxremat.spec.schedules` value, or a name such as ``"sqrt"``, ``"every_k(2)"``.

    Raises:
        ValueError: unknown name (the message lists the valid ones), or a plan with a policy
            (``"sqrt+save_dots"``; :func:`remat_stack` takes those).
    """
    value, policy = resolve_plan(schedule)
    if policy is not None:
        raise ValueError(f"{schedule!r} names a policy; give the schedule here and the policy as policy=")
    return value


def resolve_policy(policy: Any) -> Callable[..., bool] | None:
    """A ``jax.checkpoint`` policy from None, a ``jax.checkpoint_policies`` callable, a policy name
    (``"save_dots"``, MaxText's ``"minimal"``, ...) or a :class:`jaxremat.spec.policies.Policy`.

    Policies over op classes (matrix products) apply to any block. Policies over activation names
    keep only values the block tags with ``jax.ad_checkpoint.checkpoint_name`` under the names of
    :mod:`jaxremat.spec.names`; in an untagged block of your own they keep nothing.

    Raises:
        ValueError: unknown policy name (from ``jaxremat.policies.to_jax_policy``).
    """
    return to_jax_policy(policy)


def _default_call(layer, carry, layer_xs):
    return layer(carry) if layer_xs is None else layer(carry, layer_xs)


def remat_stack(
    stack: nnx.Module,
    x: Any,
    schedule: Schedule | str = "none",
    *,
    policy: Any = None,
    xs: Any = None,
    call: Callable[[nnx.Module, Any, Any], Any] | None = None,
    custom_vjp_residuals: str = "recompute",
) -> Any:
    """Run ``x`` through the N layers of a stacked NNX block under a remat schedule and policy.

    Args:
        stack: an ``nnx.Module`` whose every variable has a leading layer axis N (parameters,
            RNG keys and counters, any other state), e.g. built with ``nnx.vmap`` over the
            block's constructor and ``nnx.split_rngs(splits=N)``.
        x: the carry entering layer 0, e.g. a ``(B, T, D)`` float array (any pytree).
        schedule: a :mod:`jaxremat.spec.schedules` value, its name (``"none"``, ``"full"``,
            ``"every_k(2)"``, ``"sqrt"``, ``"segments(4)"``), a plan ``"SCHEDULE+POLICY"``, or a
            segment plan ``"plan(3*2+save_dots,1+attention_only,4:store)"`` whose segments name
            their own policies (:mod:`jaxremat.spec.segment_plan`).
        policy: what a checkpointed segment may keep besides its input: None (nothing), a
            ``jax.checkpoint_policies`` callable, or a policy name / spec policy (see
            :func:`resolve_policy`). For a segment plan, the default of the segments that name
            no policy of their own (a segment's own policy wins).
        xs: optional per-layer inputs (pytree, leading axis N), e.g. your own dropout keys.
        call: ``(layer, carry, layer_xs) -> carry`` for one layer; default ``layer(carry)``, or
            ``layer(carry, layer_xs)`` when ``xs`` is given. Extra arguments for every layer
            (masks, positions): close over them, ``call=lambda m, h, _: m(h, mask)``.
        custom_vjp_residuals: ``"recompute"`` (default) or ``"save"``: whether a checkpointed
            segment runs a ``jax.custom_vjp`` op's forward rule again in the backward pass, or keeps
            the rule's residuals and outputs from the forward pass (:func:`jaxremat.render.remat_scan`).

    Returns:
        The carry after the N layers (same structure, shapes and dtypes as ``x``). The stack's
        RNG counters are advanced as a plain loop over the layers advances them.

    Raises:
        ValueError: the stack (or ``xs``) is not stacked on one leading axis N (the message names
            the odd variables), or is one block, unstacked (a Flax layer holding a variable of the
            shape it declares for one layer, or a layer that fails on its slice while the whole
            stack runs as one block; :mod:`jaxremat.flax_checks`); the schedule is invalid for N
            (e.g. ``segments(s)`` with s > N, a segment plan whose lengths do not sum to N), or a
            policy is given twice (plan and ``policy=``; for a segment plan: ``policy=`` keeps
            something while every checkpointed segment names its own);
            a layer returns a carry of another shape or dtype; a layer writes a variable other
            than its RNG counters (e.g. BatchNorm running statistics: call it with
            ``use_running_average=True``), which a scanned pure layer cannot write back;
            ``custom_vjp_residuals`` is not ``"recompute"`` or ``"save"``, or is ``"save"`` where the stack
            runs ``jax.checkpoint`` (one layer, or ``method="checkpoint"``) with JAX's ``jax_remat3`` flag
            on; ``method="reverse_loop"`` keeps ``fwd``'s outputs there on JAX >= 0.11
            (:func:`jaxremat.render.remat_scan`).

    Warns:
        RematPolicyWarning: the policy keeps nothing it names in this block (no kept
            ``checkpoint_name`` tag; no matrix product without batch dimensions under a
            ``jax.vmap``), or the schedule checkpoints nothing (:func:`jaxremat.lint.check_plan`).

    Source: :func:`jaxremat.render.remat_scan`; ``flax.nnx.split`` / ``merge`` / ``update``.
    """
    schedule, policy = resolve_plan(schedule, policy)
    jax_policy = resolve_policy(policy)
    check_custom_vjp_residuals(custom_vjp_residuals)
    call = call or _default_call
    check_declared_shapes(stack)
    graphdef, counts, rest = nnx.split(stack, nnx.RngCount, ...)
    n_layer = check_stacked((counts, rest), "stack", BUILD_HINT)
    if xs is not None:
        n_xs = check_stacked(xs, "xs", "give every per-layer input a leading axis N")
        if n_xs != n_layer:
            raise ValueError(f"xs has leading axis {n_xs} but the stack has {n_layer} layers")
    segs = schedule.segments_for(n_layer)  # ValueError here, before tracing, when invalid for N
    check_default_policy(segs, None if jax_policy is None else policy_name(policy), "remat_stack")
    block_fn = _nnx_block_fn(graphdef, call)
    delta0 = jax.tree.map(lambda c: jnp.zeros(c.shape[1:], c.dtype), counts)
    first = lambda t: jax.tree.map(lambda a: a[0], t)
    check_one_layer(lambda a: block_fn(first(a[0]), a[1], None if a[2] is None else first(a[2])),
                    lambda a: call(nnx.merge(graphdef, *a[0], copy=True), a[1][0], a[2]),
                    ((counts, rest), (x, delta0), xs), x)
    check_plan(block_fn, (counts, rest), (x, delta0), schedule, xs=xs, policy=policy, where="remat_stack",
               custom_vjp_residuals=custom_vjp_residuals)
    with plan_checked():
        out, delta = remat_scan(block_fn, (counts, rest), (x, delta0), schedule, xs=xs, policy=jax_policy,
                                custom_vjp_residuals=custom_vjp_residuals)
    if jax.tree.leaves(counts):
        nnx.update(stack, jax.tree.map(lambda c, d: c + d, counts, delta))
    return out


def plan_stack(stack: nnx.Module, x: Any, budget: Any, *, policies: Sequence = DEFAULT_MENU,
               call: Callable[[nnx.Module, Any, Any], Any] | None = None,
               loss: Callable[[Any], Any] | None = None) -> FittedPlan:
    """The least-recompute plan for ``remat_stack(stack, x, plan)`` within ``budget``, checked on the compiled program.

    One call for the expert path of docs/planner.md (:mod:`jaxremat.fit`): the menu of one layer, the
    planner, the plan's compiled temporary bytes of ``jit(grad(loss))`` against the budget, and its
    gradients against ``none``'s byte for byte on ``x``.

    Args:
        stack: a stacked NNX block, as :func:`remat_stack` takes it (a stack without RNG streams).
        x: the input of layer 0 (an array, e.g. (B, D) or (B, T, D) float32).
        budget: bytes (int), ``"2GiB"``, or ``"50%"`` of ``none``'s compiled temporary bytes.
        policies: the checkpoint options (:data:`jaxremat.planner.DEFAULT_MENU`).
        call: as :func:`remat_stack`'s ``call``.
        loss: ``y -> scalar`` the gradients are taken of (default: the sum of ``y``).

    Returns:
        :class:`jaxremat.fit.FittedPlan` (``plan``, measured ``peak_bytes`` and ``none_peak_bytes``,
        ``grads_bitwise_equal``).

    Raises:
        ValueError: a bad budget or policy, a stack :func:`remat_stack` refuses, or no plan measured
            within the budget (the message names the least reached and its plan).
    """
    graphdef, state = nnx.split(stack)
    one = call or (lambda m, h, _: m(h))

    def run(s, h, plan):
        return remat_stack(nnx.merge(graphdef, s), h, plan, call=call)

    return fit_jax(run, lambda s, h: one(nnx.merge(graphdef, s), h, None), state, x, budget, policies, loss)


def _nnx_block_fn(graphdef: Any, call: Callable) -> Callable:
    """``(layer_state, (carry, counter deltas), layer_xs) -> (carry, counter deltas)`` for remat_scan."""

    def block_fn(layer_state, carry, layer_xs):
        h, _ = carry
        layer_counts, layer_rest = layer_state
        # copy=True: fresh Variables at this trace level (the layer advances its RNG counters).
        counts_in, rest_in = jax.tree.leaves(layer_counts), nnx.to_flat_state(layer_rest)
        rest_in = [(p, jax.tree.leaves(v)) for p, v in rest_in]
        layer = nnx.merge(graphdef, layer_counts, layer_rest, copy=True)
        out = call(layer, h, layer_xs)
        check_carry(h, out)
        _, new_counts, new_rest = nnx.split(layer, nnx.RngCount, ...)
        _check_unwritten(rest_in, new_rest)
        delta = jax.tree.unflatten(jax.tree.structure(new_counts),
                                   [new - old for new, old in zip(jax.tree.leaves(new_counts), counts_in)])
        return out, delta

    return block_fn


def _check_unwritten(before: list, after: nnx.State) -> None:
    """ValueError naming a non-RNG variable the layer assigned during its call.

    ``before`` is ``[(path, leaves)]`` read before the call; a written variable holds a new array.
    """
    a = nnx.to_flat_state(after)
    written = ["/".join(map(str, p)) for (p, old), (_, v) in zip(before, a)
               if [id(x) for x in old] != [id(x) for x in jax.tree.leaves(v)]]
    if written or len(before) != len(a):
        raise BlockContractError(f"the block wrote variables during its call: {written or 'new variables'}. A layer of a "
                         "stack runs as a pure function inside lax.scan and its writes cannot be stacked back; "
                         "only RNG counters are written back. Keep such state fixed during the stacked call "
                         "(e.g. nnx.BatchNorm(use_running_average=True)) or update it outside the stack")


class RematStack(nnx.Module):
    """An NNX module running a stacked block under a fixed schedule and policy (see :func:`remat_stack`).

    Attributes:
        layers: the stacked block (every variable with leading axis N).
        schedule: a :mod:`jaxremat.spec.schedules` value (a name is parsed at construction).
        policy: None, a ``jax.checkpoint_policies`` callable, or a policy name.
        custom_vjp_residuals: ``"recompute"`` or ``"save"`` (see :func:`remat_stack`).

    Raises:
        ValueError: an unknown schedule name, or ``custom_vjp_residuals`` not ``"recompute"`` / ``"save"``.
    """

    def __init__(self, layers: nnx.Module, schedule: Schedule | str = "none", policy: Any = None,
                 custom_vjp_residuals: str = "recompute"):
        self.layers = layers
        self.schedule = resolve_schedule(schedule)
        self.policy = policy
        self.custom_vjp_residuals = check_custom_vjp_residuals(custom_vjp_residuals)

    def __call__(self, x: Any, xs: Any = None) -> Any:
        """``remat_stack(self.layers, x, self.schedule, policy=..., xs=xs, custom_vjp_residuals=...)``."""
        return remat_stack(self.layers, x, self.schedule, policy=self.policy, xs=xs,
                           custom_vjp_residuals=self.custom_vjp_residuals)


def linen_init_stack(block: nn.Module, key: jax.Array, x: Any, n_layer: int, **init_kwargs) -> dict:
    """Variables of N independently initialised copies of a Linen ``block``, stacked on axis 0.

    ``jax.vmap`` of ``block.init({"params": k, "dropout": k}, x, **init_kwargs)`` over
    ``jax.random.split(key, n_layer)``: each leaf gains a leading axis N.

    Raises:
        ValueError: ``n_layer`` is not an integer >= 1.
    """
    if isinstance(n_layer, bool) or not isinstance(n_layer, int) or n_layer < 1:
        raise ValueError(f"n_layer must be an integer >= 1, got {n_layer!r}")
    init = lambda k: block.init({"params": k, "dropout": k}, x, **init_kwargs)
    return jax.vmap(init)(jax.random.split(key, n_layer))


def linen_remat_stack(
    block: nn.Module,
    variables: Any,
    x: Any,
    schedule: Schedule | str = "none",
    *,
    rngs: dict[str, jax.Array] | None = None,
    policy: Any = None,
    xs: Any = None,
    mutable: Sequence[str] | str = (),
    custom_vjp_residuals: str = "recompute",
    **apply_kwargs,
) -> Any:
    """Run ``x`` through N layers of a Linen ``block`` with stacked ``variables`` under a schedule.

    Layer i computes ``block.apply(variables[i], carry, [xs[i],] rngs={name: keys[name][i]},
    [mutable=mutable,] **apply_kwargs)``, where ``keys[name] = jax.random.split(rngs[name], N)``.

    Args:
        block: an unbound Linen module for one layer; it maps the carry to a carry of the same
            shapes and dtypes.
        variables: that block's variables (e.g. ``{"params": ...}``), every leaf with leading
            axis N (:func:`linen_init_stack`, or an ``nn.scan`` ed submodule's variables).
        x: the carry entering layer 0 (any pytree of arrays).
        schedule: schedule value, name or plan ``"SCHEDULE+POLICY"``, as in :func:`remat_stack`.
        rngs: optional ``{collection: key}`` (e.g. ``{"dropout": key}``); each key is split into
            one key per layer, scanned with the parameters, so the recompute redraws the forward's masks.
        policy: as in :func:`remat_stack`.
        xs: optional per-layer inputs (leading axis N), passed as the second positional argument.
        mutable: collections the block writes (e.g. ``["batch_stats"]`` for ``nn.BatchNorm`` in
            training mode), as in ``block.apply``. Each layer's updated collections come out once,
            from the forward pass (:func:`jaxremat.render.remat_scan` ``with_outputs``), so running
            statistics are updated once per step under every schedule.
        custom_vjp_residuals: ``"recompute"`` (default) or ``"save"``, as in :func:`remat_stack`.
        **apply_kwargs: static keyword arguments of ``block.__call__`` (e.g. ``train=True``).

    Returns:
        The carry after the N layers; with ``mutable``, ``(carry, updated)``, ``updated`` the
        written collections with a leading axis N (``{"batch_stats": ...}``; merge them into
        ``variables`` for the next step).

    Raises:
        ValueError: ``variables``/``xs`` not stacked on one leading axis N (or not stacked at all:
            a leaf of the shape ``block.init`` gives one layer), an invalid schedule for N, a block
            that changes the carry's shapes or dtypes, or a block that writes a collection not in
            ``mutable`` (the message names it and says to pass ``mutable=[...]``), or
            ``custom_vjp_residuals`` not ``"recompute"`` / ``"save"``.

    Warns:
        RematPolicyWarning: as :func:`remat_stack`.
    """
    schedule, policy = resolve_plan(schedule, policy)
    jax_policy = resolve_policy(policy)
    check_custom_vjp_residuals(custom_vjp_residuals)
    mutable = [mutable] if isinstance(mutable, str) else list(mutable)
    n_layer = check_stacked(variables, "variables", LINEN_HINT)
    if xs is not None and check_stacked(xs, "xs", "give every per-layer input a leading axis N") != n_layer:
        raise ValueError(f"xs leading axis differs from the {n_layer} stacked layers")
    segs = schedule.segments_for(n_layer)
    check_default_policy(segs, None if jax_policy is None else policy_name(policy), "linen_remat_stack")
    _check_linen_unstacked(block, variables, x, xs, rngs, apply_kwargs)
    layer_keys = {name: jax.random.split(k, n_layer) for name, k in (rngs or {}).items()}
    block_fn = _linen_block_fn(block, mutable, apply_kwargs)
    check_plan(block_fn, variables, x, schedule, xs=(layer_keys, xs), policy=policy, with_outputs=bool(mutable),
               where="linen_remat_stack", custom_vjp_residuals=custom_vjp_residuals)
    with plan_checked():
        return remat_scan(block_fn, variables, x, schedule, xs=(layer_keys, xs), policy=jax_policy,
                          with_outputs=bool(mutable), custom_vjp_residuals=custom_vjp_residuals)


def _linen_block_fn(block: nn.Module, mutable: list, apply_kwargs: dict) -> Callable:
    """``(layer_vars, carry, (keys, layer_xs)) -> carry`` (``(carry, updated)`` with ``mutable``)."""

    def block_fn(layer_vars, carry, layer_in):
        keys, layer_xs = layer_in
        args = (carry,) if layer_xs is None else (carry, layer_xs)
        try:
            result = block.apply(layer_vars, *args, rngs=keys or None, mutable=mutable or False, **apply_kwargs)
        except flax.errors.ModifyScopeVariableError as exc:
            col = re.search(r'collection "([^"]+)"', str(exc))
            col = col.group(1) if col else "COLLECTION"
            raise BlockContractError(
                f"the block writes collection {col!r} during its call (e.g. nn.BatchNorm in training mode); pass "
                f"mutable=[{col!r}] to linen_remat_stack to get (carry, updated) back, each layer's {col} taken "
                f"once from the forward pass under every schedule, or run the block without writing it "
                f"(e.g. use_running_average=True)") from exc
        out = result[0] if mutable else result
        check_carry(carry, out)
        return result

    return block_fn


def _check_linen_unstacked(block: nn.Module, variables: Any, x: Any, xs: Any, rngs: Any, apply_kwargs: dict) -> None:
    """ValueError when ``variables`` hold one layer's shapes (``block.init`` traced, nothing computed)."""
    first = None if xs is None else jax.tree.map(lambda a: a[0], xs)

    def init(key, carry, layer_xs):
        args = (carry,) if layer_xs is None else (carry, layer_xs)
        streams = {"params": key, "dropout": key, **{name: key for name in rngs or {}}}
        return block.init(streams, *args, **apply_kwargs)

    try:
        expected = jax.eval_shape(init, jax.random.key(0), x, first)
    except Exception:  # a block whose init needs more than this: no declared shapes to compare
        return
    check_linen_shapes(variables, expected)
