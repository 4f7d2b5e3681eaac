"""Plan lint in JAX: warn when a policy will keep nothing it is meant to keep in the given block.

``jax.checkpoint(f, policy=p)`` asks ``p(primitive, *avals, **params)`` for each operation of
``f``'s jaxpr whether its output may be saved. A policy that answers "recompute" everywhere is
full remat, and JAX says nothing. :func:`check_plan` traces one layer of the stack the way the
policy will see it and asks the policy the same questions, before the stack runs:

* a name the policy keeps or offloads that no ``jax.ad_checkpoint.checkpoint_name`` tag in the
  layer carries (an untagged block of your own) -> :class:`RematPolicyWarning` naming the names;
* nothing saveable at all -> the warning says so and why: no matrix product, or every matrix
  product has batch dimensions (``dots_with_no_batch_dims_saveable`` / ``minimal`` under a
  ``jax.vmap`` that batches both operands, e.g. an ensemble of stacks);
* a policy on a schedule that checkpoints nothing (``none``) -> the warning says it has no effect;
* a block with a ``jax.custom_vjp`` op under a plan that recomputes, with
  ``custom_vjp_residuals="recompute"`` -> the warning says how often the op's forward rule
  (``fwd``) runs: in the forward pass and again in every recompute of its layer (8 runs against
  ``none``'s 4 for 4 layers under ``full``; a policy keeps none of the rule's outputs unless it
  keeps everything; a nested schedule's inner checkpointed segments run a third time), and, where
  it runs fewer times, that ``custom_vjp_residuals="save"`` runs it once per layer (a nested
  segment's outer recompute once more; :mod:`jaxremat.custom_vjp`).

Batching. Under ``jax.vmap`` the policy sees the *batched* jaxpr when the vmap is applied inside
the differentiation (``jax.grad(lambda p: jax.vmap(f)(p).sum())``), since ``jax.checkpoint``'s
partial evaluation then runs on the output of the batching rule; with the vmap outside
(``jax.vmap(jax.grad(f))``) it sees the unbatched one. The inputs tell which: the vmaps between
the differentiation and this call appear as batch tracers on top of the inputs. They are
peeled off (``jax._src.interpreters.batching.BatchTracer``: ``val``, ``batch_dim``) and re-applied
as ``jax.vmap`` s around the traced layer. A vmap outside a ``jax.jit`` that is inside the stack's
caller is not visible from here (the jit's inputs are abstract); nor are tracers the block closes over.

The check is best effort: if tracing the layer fails here, nothing is warned (the stack's own
run raises the error). Source: ``jax.checkpoint`` policies (``jax/_src/ad_checkpoint.py``).
"""

from __future__ import annotations

# Deferred imports: JAX is imported inside the functions that trace a plan, so the lint's plain checks import
# without it.

import contextlib
import threading
import warnings
from typing import Any, Callable, Iterator

import jax

from .policies import to_jax_policy
from .spec.cost import recomputed_blocks
from .spec.lint import RematPolicyWarning, no_effect_message, unmatched_message
from .spec.policies import Policy, parse_policy
from .tags import ask_policy, sub_jaxprs, tag_name

__all__ = ["RematPolicyWarning", "block_jaxpr", "check_plan", "plan_checked"]

HOW_TO_TAG = "jax.ad_checkpoint.checkpoint_name(value, name)"
_state = threading.local()


@contextlib.contextmanager
def plan_checked() -> Iterator[None]:
    """Inside this context :func:`check_plan` does nothing (the caller has checked the plan)."""
    prev = getattr(_state, "checked", False)
    _state.checked = True
    try:
        yield
    finally:
        _state.checked = prev


def _batch_chain(leaf: Any) -> tuple[list, Any]:
    """``([(trace, batch_dim), ...] top to bottom, bottom value)`` of the vmaps on top of ``leaf``."""
    try:
        from jax._src.interpreters.batching import BatchTracer
    except ImportError:  # another JAX layout: no batching seen
        return [], leaf
    chain = []
    while isinstance(leaf, BatchTracer):
        chain.append((leaf._trace, leaf.batch_dim))
        leaf = leaf.val
    return chain, leaf


def _depth(trace: Any) -> int:
    n = 0
    while trace is not None:
        n, trace = n + 1, getattr(trace, "parent_trace", None)
    return n


def block_jaxpr(block_fn: Callable, stacked_params: Any, carry: Any, xs: Any = None,
                with_outputs: bool = False, method: str = "reverse_loop") -> tuple[Any, bool]:
    """The jaxpr of the layers' scan as ``jax.checkpoint``'s policy will see it, and whether a vmap batches it.

    The layers run as a ``lax.scan`` (as in :func:`jaxremat.render.remat_scan`), so that under
    ``jax.vmap`` the carry is batched as the stack's is (a scan's carry becomes batched once a
    layer's output is); the body is traced once whatever N is.

    Args:
        block_fn: ``(layer_params, carry, layer_xs) -> carry`` (as for :func:`jaxremat.render.remat_scan`).
        stacked_params: the stacked parameters (leading layer axis N), arrays or tracers.
        carry: the carry entering layer 0.
        xs: optional per-layer inputs (leading axis N).
        with_outputs: ``block_fn`` returns ``(carry, y)``.
        method: the rendering of ``remat_scan``. ``"reverse_loop"`` differentiates inside a
            ``jax.custom_vjp``, whose rule JAX traces unbatched and batches afterwards, so its
            policy sees the unbatched layer whatever vmaps surround the stack.

    Returns:
        ``(ClosedJaxpr, batched)``.
    """
    leaves, treedef = jax.tree_util.tree_flatten((stacked_params, carry, xs))
    chains = [_batch_chain(leaf) for leaf in leaves]
    if method == "reverse_loop":
        chains = [([], bottom) for _, bottom in chains]
    traces = {id(t): t for chain, _ in chains for t, _ in chain}
    levels = sorted(traces.values(), key=_depth, reverse=True)  # top (innermost vmap) first

    def probe(params, c, layer_in):  # a scan, as the stack runs: under vmap its carry is batched as there
        def step(c, layer):
            out = block_fn(layer[0], c, layer[1])
            return (out[0] if with_outputs else out), None

        return jax.lax.scan(step, c, (params, layer_in))[0]

    fn = probe
    for level in levels:  # wrap from the innermost vmap out
        axes = [dict((id(t), d) for t, d in chain).get(id(level)) for chain, _ in chains]
        fn = jax.vmap(fn, in_axes=jax.tree_util.tree_unflatten(treedef, axes))
    structs = [jax.ShapeDtypeStruct(jax.typeof(bottom).shape, jax.typeof(bottom).dtype) for _, bottom in chains]
    return jax.make_jaxpr(fn)(*jax.tree_util.tree_unflatten(treedef, structs)), bool(levels)


def _eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and of the jaxprs in its equations' parameters (scan, pjit, cond, remat)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in sub_jaxprs(eqn):
            yield from _eqns(getattr(sub, "jaxpr", sub))


def _saves(answer: Any) -> bool:
    """A policy's answer read as "saved": True, ``Saveable`` or ``Offloadable`` (not ``Recompute``)."""
    if isinstance(answer, bool):
        return answer
    return type(answer).__name__ != "RecomputeType"


def _findings(jaxpr: Any, jax_policy: Callable) -> tuple[set, bool, list]:
    """(checkpoint_name tags, whether the policy saves any output, batch dims of every dot_general)."""
    tags, saves, dots = set(), False, []
    for eqn in _eqns(jaxpr.jaxpr):
        if tag_name(eqn) is not None:
            tags.add(tag_name(eqn))
        if eqn.primitive.name == "dot_general":
            (_, _), (lhs_b, rhs_b) = eqn.params["dimension_numbers"]
            dots.append(bool(lhs_b or rhs_b))
        if not saves:
            try:
                saves = _saves(ask_policy(jax_policy, eqn))
            except Exception:  # a policy that cannot judge this op does not save it
                pass
    return tags, saves, dots


def _nothing_kept(where: str, name: str, spec: Policy | None, dots: list, batched: bool) -> str:
    if not dots:
        why = "the block has no matrix product (dot_general)" if spec is None or spec.save_dots or spec.offload_dots \
            else "no operation of the block matches it"
    elif all(dots):
        why = (f"every one of its {len(dots)} matrix products has batch dimensions"
               + (" (a jax.vmap around the stack batches both operands)" if batched else ""))
    else:
        why = "no operation of the block matches it"
    return (f"{where}: policy {name!r} keeps nothing in this block: {why}, so every checkpointed segment is "
            "recomputed in full (as save_nothing); choose a policy that matches the block (e.g. save_dots keeps "
            "batched products too), or tag values with " + HOW_TO_TAG)


def _block_jaxpr_once(block_fn, stacked_params, carry, xs, with_outputs, method) -> Callable[[], Any]:
    """``() -> (jaxpr, batched)`` traced on first call, or None when tracing fails (best effort)."""
    memo: list = []

    def get():
        if not memo:
            try:
                memo.append(block_jaxpr(block_fn, stacked_params, carry, xs, with_outputs, method))
            except Exception:  # best effort: the stack's own run raises what is wrong
                memo.append(None)
        return memo[0]

    return get


def _policy_spec(policy: Any) -> Policy | None:
    """``policy`` (a name or a spec Policy) parsed; None for None or a raw ``jax.checkpoint`` policy, which
    cannot be read."""
    if policy is None or (callable(policy) and not isinstance(policy, Policy)):
        return None
    return parse_policy(policy)


def _policy_messages(policy: Any, schedule: Any, n_layer: int, where: str, jaxpr_of: Callable,
                     no_effect: bool) -> list[str]:
    """The lint's messages for one policy (``no_effect``: also check that the schedule checkpoints)."""
    jax_policy = to_jax_policy(policy)
    spec = _policy_spec(policy)
    if jax_policy is None or jax_policy is jax.checkpoint_policies.nothing_saveable:
        return []
    name = spec.name if spec is not None else getattr(policy, "__name__", repr(policy))
    message = no_effect_message(schedule, spec or policy, n_layer, where) if no_effect else None
    if message:
        return [message]
    traced = jaxpr_of()
    if traced is None:
        return []
    jaxpr, batched = traced
    tags, saves, dots = _findings(jaxpr, jax_policy)
    missing = sorted((spec.save_names | spec.offload_names) - tags) if spec is not None else []
    if missing:
        return [unmatched_message(where, name, missing, saves, HOW_TO_TAG)]
    if not saves:
        return [_nothing_kept(where, name, spec, dots, batched)]
    return []


def _fwd_runs(segs, n_layer: int, policy: Any) -> tuple[int, int, int]:
    """``(runs, inner_recomputes, nested_layers)`` of a ``custom_vjp`` rule's ``fwd`` per training step under
    ``"recompute"``: once per layer in the forward pass, once more per layer of a checkpointed segment whose
    policy (its own, else ``policy``) does not keep everything, and for a nested segment once more per layer
    (the outer recompute: the policy applies to the inner segments) plus the inner schedule's recomputes
    (:func:`jaxremat.spec.cost.recomputed_blocks`). Under ``"save"`` it runs ``n_layer + nested_layers``
    times. Measured with :func:`jaxremat.custom_vjp.count_named_runs` (tests/jaxremat/test_custom_vjp.py)."""
    runs, inner_total, nested = n_layer, 0, 0
    for seg in segs:
        if not seg.checkpointed:
            continue
        spec = _policy_spec(seg.policy if seg.policy is not None else policy)
        if seg.inner is None:
            runs += 0 if getattr(spec, "save_everything", False) else seg.length
            continue
        inner = recomputed_blocks(seg.length, seg.inner, spec)
        runs, inner_total, nested = runs + seg.length + inner, inner_total + inner, nested + seg.length
    return runs, inner_total, nested


def _custom_vjp_message(where: str, jaxpr_of: Callable, segs, n_layer: int, policy: Any,
                        through_checkpoint: bool) -> list[str]:
    """The message for a block holding ``jax.custom_vjp`` ops under a plan that recomputes some layer.

    ``segs``: the plan's segments for ``n_layer`` layers; the run counts are :func:`_fwd_runs`'s. ``"save"``
    is offered where it runs ``fwd`` fewer times. ``through_checkpoint``: the stack runs ``jax.checkpoint``
    (``method="checkpoint"``, or one layer); under ``jax_remat3`` JAX then runs each op's primal in the
    forward pass (and in a nested segment's outer recompute) and ``remat_scan`` refuses ``"save"``. In the
    reverse loop ``"save"`` is refused as a policy under JAX 0.10's ``jax_remat3``
    (:func:`jaxremat.render.remat_scan`), and the message says so instead.
    """
    runs, inner, nested = _fwd_runs(segs, n_layer, policy)
    if runs == n_layer:
        return []
    traced = jaxpr_of()
    if traced is None:
        return []
    n_ops = sum(eqn.primitive.name == "custom_vjp_call" for eqn in _eqns(traced[0].jaxpr))
    if not n_ops:
        return []
    head = f"{where}: the block holds {n_ops} jax.custom_vjp op(s); under this plan"
    if through_checkpoint and jax.config.jax_remat3:
        reverse_loop = (" (a stack of 2 or more layers keeps fwd's outputs with method='reverse_loop')"
                        if jax.__version_info__ >= (0, 11) else "")
        outer = " and in the outer recompute of a nested segment" if nested else ""
        return [f"{head}, with jax_remat3 on, each runs its primal in the forward pass{outer} and its forward rule "
                f"(fwd) in the recompute of each recomputed layer; custom_vjp_residuals='save' keeps nothing "
                f"through jax.checkpoint under jax_remat3{reverse_loop}"]
    twice = ", the nested schedule recomputing its inner checkpointed segments twice" if inner else ""
    text = (f"{head} the forward rule (fwd) of each runs in the forward pass and again in every recompute of its "
            f"layer: {runs} runs for {n_layer} layers, against {n_layer} without remat{twice} (a policy keeps none "
            "of the rule's outputs unless it keeps everything)")
    save_runs = n_layer + nested
    if save_runs >= runs:
        return [text]
    if jax.config.jax_remat3 and jax.__version_info__ < (0, 11):  # remat_scan refuses 'save' here (a policy)
        return [f"{text}; custom_vjp_residuals='save', which keeps fwd's outputs from the forward pass, is refused "
                f"under jax_remat3 on JAX {jax.__version__} (turn the flag off, or use JAX >= 0.11)"]
    again = " (the outer recompute of a nested segment runs it once more)" if nested else ""
    return [f"{text}; pass custom_vjp_residuals='save' to keep fwd's outputs from the forward pass: {save_runs} runs"
            f"{again}, for more memory (its residuals stay live until the backward pass)"]


def check_plan(block_fn: Callable, stacked_params: Any, carry: Any, schedule: Any, *, xs: Any = None,
               policy: Any = None, with_outputs: bool = False, where: str = "remat_scan",
               method: str = "reverse_loop", custom_vjp_residuals: str = "recompute") -> list[str]:
    """Warn (:class:`RematPolicyWarning`) where ``policy`` will keep nothing it names in the block.

    Args:
        block_fn: ``(layer_params, carry, layer_xs) -> carry`` (or ``(carry, y)``), one layer.
        stacked_params: pytree with a leading layer axis N.
        carry: the carry entering layer 0.
        schedule: a :mod:`jaxremat.spec.schedules` value.
        xs: optional per-layer inputs (leading axis N).
        policy: None, a policy name, a :class:`jaxremat.spec.policies.Policy` or a raw
            ``jax.checkpoint`` policy callable. For a segment plan, every policy its checkpointed
            segments name is checked, and ``policy`` where a segment names none.
        with_outputs: ``block_fn`` returns ``(carry, y)`` (as in ``remat_scan``).
        where: the API named in the messages.
        method: the ``remat_scan`` rendering the stack runs with (see :func:`block_jaxpr`).
        custom_vjp_residuals: as given to the stack; under ``"recompute"`` a block holding
            ``jax.custom_vjp`` ops gets the message that their ``fwd`` runs twice per checkpointed layer.

    Returns:
        The messages warned (empty when the plan is fine, the policy saves nothing by design, or
        inside :func:`plan_checked`).

    Raises:
        ValueError: an unknown policy or activation name (from :func:`jaxremat.policies.to_jax_policy`).
    """
    if getattr(_state, "checked", False):
        return []
    n_layer = jax.tree_util.tree_leaves(stacked_params)[0].shape[0]
    segs = schedule.segments_for(n_layer)
    own = []  # a segment plan's own policies, each once, then the default where a segment names none
    for seg in segs:
        if seg.checkpointed and seg.policy is not None and seg.policy not in own:
            own.append(seg.policy)
    if own and policy is not None and any(s.checkpointed and s.policy is None for s in segs):
        own.append(policy)
    jaxpr_of = _block_jaxpr_once(block_fn, stacked_params, carry, xs, with_outputs, method)
    messages = []
    for p in own or ([policy] if policy is not None else []):
        messages += _policy_messages(p, schedule, n_layer, where, jaxpr_of, no_effect=not own)
    if custom_vjp_residuals == "recompute":
        messages += _custom_vjp_message(where, jaxpr_of, segs, n_layer, policy,
                                        method == "checkpoint" or n_layer == 1)
    for m in messages:
        warnings.warn(m, RematPolicyWarning, stacklevel=3)
    return messages
