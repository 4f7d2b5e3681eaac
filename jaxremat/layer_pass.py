"""One layer of a stack as an XLA computation of its own, the same in every pass of every schedule.

The reverse segment loop (:mod:`jaxremat.segment_vjp`) runs each layer's forward pass in three
places: in ``none``'s forward pass (keeping its residuals), in a checkpointed segment's forward
pass (keeping nothing) and in that segment's recompute in the backward pass (keeping its
residuals). Written inline, each place is fused with what surrounds it, and XLA compiles the same
layer three ways. Measured on XLA:CPU (jax 0.10.2) at ``gpt-tiny``'s width (d_model 32): in a
recompute the block's output is unused, so XLA fused the residual add ``x + attn`` into the second
LayerNorm's variance reduction instead of writing it out as ``none``'s forward pass does; XLA:CPU
emits reductions with LLVM's ``reassoc`` flag, and the loop vectorizer summed the fused loop along
the reduced axis (8 lanes, two accumulators, then across lanes) where it summed ``none``'s loop
across rows (one row per lane, the 32 terms in order). The variance moved by an ULP, and every
gradient with it (docs/framework-differences.md, section 2).

So here a layer's forward pass is one XLA computation, a ``lax.cond`` branch (:func:`isolate`),
called with the same operands and producing the same outputs wherever it runs: XLA fuses it
among its own ops only, and the same program gives the same bits. Its outputs are all read
(:func:`alive`), or XLA would drop the unused ones and compile a smaller branch. A computation
that updates large buffers (a layer writing its residuals into their stacks, a layer's backward
pass writing its gradients) is instead the body of a ``lax.while_loop`` that runs once, with the
buffers as loop state: XLA updates a loop's state in place, where it copies every buffer a
branch updates whole.

A checkpointed segment with a ``jax.checkpoint`` policy keeps, per layer, the values the policy
saves. :class:`LayerProgram` splits the layer's forward program with JAX's own partial evaluation
(``partial_eval_jaxpr_custom``, the machinery of ``jax.checkpoint``): the forward pass runs the
whole program and also outputs the saved values; the recompute runs the same program with the
saved values read instead of computed, and still produces every output (the carry included), so
the values that are recomputed see the same fusions as in ``none``.

Three more things keep the programs alike (:mod:`jaxremat.same_program`): a branch reads its
operands through ``lax.optimization_barrier``, so that XLA cannot fold a stack input that is a
constant of the program into ``none``'s first layer; under ``jax.vmap`` the predicates are never
batched (a batched one makes ``lax.cond`` a ``select`` run inline) and every layer maps its carry
whenever anything it reads is mapped; and narrow-float matrix products and names are read rounded
in every pass, as a policy saves them.

Source: ``jax.checkpoint`` policies and ``partial_eval_jaxpr_custom`` (``jax/_src/ad_checkpoint.py``,
``jax/_src/interpreters/partial_eval.py``); ``jax.lax.cond``, ``jax.lax.while_loop``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jcore
from jax._src.interpreters import partial_eval as pe
from jax.extend.core.primitives import remat_p

from .same_program import batched_with, bind_eqn, has_effects, hoist_constants, opaque, round_saveable, run_time, unbatched

__all__ = ["ONCE_SCOPE", "LayerProgram", "Pullback", "alive", "differentiated_policy", "isolate", "predicate", "rebuild",
           "runs_once", "take", "tie"]

_tree = jax.tree_util


def take(tree, i):
    """Slice ``i`` of every leaf's leading axis (``i`` may be traced)."""
    return _tree.tree_map(lambda a: lax.dynamic_index_in_dim(a, i, 0, keepdims=False), tree)


def _entries(tree) -> list:
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

    Read into a value that is used (:func:`tie`), it keeps the outputs ``trees`` came from in the
    program though nothing else reads them, and it orders work: what reads the tied value cannot
    start before ``trees`` exist (a recompute waits for its cotangent).
    """
    vals = [jnp.real(v).astype(jnp.float32) * np.float32(0.0) for v in _entries(trees)]
    if alive is not None:
        vals.append(alive)
    out = vals[0] if vals else jnp.float32(0.0)
    for v in vals[1:]:
        out = out + v
    return out


def predicate(tree):
    """A float32 scalar read from ``tree`` for :func:`isolate`'s predicate: its first numeric entry
    that is traced (a ``jax.core.Tracer``), else its first numeric entry.

    A traced value, because XLA folds a predicate computed from constants, and then inlines the
    branch. Give values that are not batched under ``jax.vmap`` first (a stack's parameters): a
    batched predicate turns ``lax.cond`` into a select that runs both branches.
    """
    leaves = [a for a in _tree.tree_leaves(tree) if _entries([a])]
    traced = [a for a in leaves if isinstance(a, jax.core.Tracer)]
    entries = _entries((traced or leaves)[:1])
    return jnp.real(entries[0]).astype(jnp.float32) if entries else jnp.float32(0.0)


def _pred(pred_value):
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
    pred = _pred(pred_value)
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

    The loop runs while its counter is below ``int(pred)`` (:func:`_pred`: 1 at run time, which XLA
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
    pred = _pred(pred_value)
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


def differentiated_policy(fn: Callable, params, carry, xs, consts, policy: Callable) -> Callable:
    """``policy`` as ``jax.checkpoint`` hands it to its rules when JAX differentiates one layer here.

    A trace only (nothing of it enters the program): the JVP of ``jax.checkpoint(fn, policy=policy)``
    over one layer, and the policy of the ``remat2`` equation it binds. That is ``policy`` itself,
    unless a tool watching remat regions replaced JAX's rule (:mod:`jaxremat.doctor` records the
    layer as a region where it is differentiated, and may swap the policy): :class:`LayerProgram`
    splits the layer with the policy so returned, so the tool sees and steers this region as it does
    a ``jax.checkpoint``.

    Args:
        fn: ``(layer_params, carry, layer_xs, consts) -> (carry, y)``.
        params, xs: the stacked parameters and per-layer inputs (leading layer axis), or avals.
        carry, consts: as :class:`LayerProgram` takes them.
        policy: a ``jax.checkpoint`` policy.
    """
    args = (_abstract(params, True), _abstract(carry, False), _abstract(xs, True), _abstract(consts, False))
    flat, in_tree = _tree.tree_flatten(args)
    floats = [jnp.issubdtype(a.dtype, jnp.inexact) for a in flat]

    def probe(*leaves):
        def layer(*diff):
            it = iter(diff)
            full = [next(it) if f else a for a, f in zip(leaves, floats)]
            return fn(*_tree.tree_unflatten(in_tree, full))
        diff = [a for a, f in zip(leaves, floats) if f]
        return jax.jvp(jax.checkpoint(layer, policy=policy), diff, diff)

    for eqn in jax.make_jaxpr(probe)(*flat).jaxpr.eqns:
        if eqn.primitive is remat_p:
            return eqn.params["policy"]
    return policy


@dataclasses.dataclass
class Pullback:
    """How a ``jax.vjp`` closure is rebuilt: its treedef, and per leaf ``("input", j)`` or ``("kept", r)``."""

    treedef: Any = None
    sources: tuple = ()


def _vjp(fn, meta: Pullback, p, c, x, consts):
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


def rebuild(meta: Pullback, kept: list, p, x, consts):
    """The pullback of :func:`_vjp` from its kept leaves and the layer's inputs."""
    inputs = _tree.tree_leaves((p, x, consts))
    return _tree.tree_unflatten(meta.treedef, [inputs[j] if s == "input" else kept[j] for s, j in meta.sources])


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


def _abstract(tree, drop_axis: bool):
    def sds(a):
        shape = jnp.shape(a)[1:] if drop_axis else jnp.shape(a)
        return jax.ShapeDtypeStruct(shape, a.dtype if hasattr(a, "dtype") else jnp.result_type(a))
    return _tree.tree_map(sds, tree)


def _inlined_call(eqn):
    """The ClosedJaxpr of a ``jit`` / closed call equation (inlined by the interpreter), else None."""
    if eqn.primitive.name in ("jit", "pjit"):
        return eqn.params["jaxpr"]
    if eqn.primitive.name == "closed_call":
        return eqn.params["call_jaxpr"]
    return None


def _eval(jaxpr, consts, args, on_eqn=None) -> list:
    """Evaluate ``jaxpr`` like ``jax.core.eval_jaxpr``, with ``jit`` calls inlined.

    ``on_eqn(eqn, invals)`` may return the equation's outputs instead of binding it (None: bind).
    """
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        sub = _inlined_call(eqn)
        outs = None if on_eqn is None else on_eqn(eqn, ins)
        if outs is None and sub is not None:
            outs = _eval(sub.jaxpr, sub.consts, ins, on_eqn)
        elif outs is None:
            outs = bind_eqn(eqn, ins)
        env.update((v, o) for v, o in zip(eqn.outvars, outs) if not isinstance(v, jcore.DropVar))
    return [read(v) for v in jaxpr.outvars]


class LayerProgram:
    """One layer's forward pass with its residuals, as jaxprs run isolated (:func:`isolate`).

    ``forward`` is the program of ``jax.vjp`` of the layer (``jit`` calls inlined), the same in
    ``none`` and in every checkpointed segment. Residuals computed from the layer's parameters,
    per-layer inputs and constants alone (a LayerNorm weight broadcast to ``(1, 1, D)``, a weight
    cast to the compute dtype) are not returned: :meth:`residuals` computes them again in the
    backward pass, as the parameters themselves are read again there.

    With a ``jax.checkpoint`` policy, the values the policy saves (``policy(primitive, *avals,
    **params)``, asked as ``jax.checkpoint`` asks it, offloaded where it says so) that the
    recompute reads are returned by ``forward`` too, and ``recompute`` is the same program with
    them read instead of computed (:meth:`_choose_saved`).

    Args:
        fn: ``(layer_params, carry, layer_xs, consts) -> (carry, y)``.
        params, xs: the stacked parameters and per-layer inputs (leading layer axis), or avals.
        consts: list of arrays every layer reads.
        carry: the carry (or its avals).
        policy: a ``jax.checkpoint`` policy, or None (the forward pass saves nothing).
        pred: the predicate value of :func:`isolate` (:func:`predicate`).
        carry_out: with a policy, whether ``recompute`` also returns the carry and ``y`` (a
            segment of several layers recomputes the next layer from the carry) or the residuals
            only (then the forward pass saves only what they need).
    """

    def __init__(self, fn: Callable, params, xs, consts, carry, policy: Callable | None = None, pred=None,
                 carry_out: bool = True):
        self.meta, self.policy, self.pred, self.carry_out = Pullback(), policy, pred, carry_out
        args = (_abstract(params, True), _abstract(carry, False), _abstract(xs, True), _abstract(consts, False))
        flat, in_tree = _tree.tree_flatten(args)
        out_trees = []

        def flat_fn(*leaves):
            out = _vjp(fn, self.meta, *_tree.tree_unflatten(in_tree, leaves))
            leaves_out, tree = _tree.tree_flatten(out)
            out_trees.append(tree)
            return leaves_out

        traced = jax.make_jaxpr(flat_fn)(*flat)
        # jit calls inlined; narrow saveable values read rounded in every pass (round_saveable)
        closed = jax.make_jaxpr(lambda *a: _eval(traced.jaxpr, traced.consts, a, round_saveable))(*flat)
        self.consts = list(closed.consts)
        full = pe.convert_constvars_jaxpr(closed.jaxpr)  # consts become leading inputs
        full, self._cone = hoist_constants(full)  # values of constants alone: leading inputs before them
        self.n_hoisted = len(full.invars) - len(closed.jaxpr.constvars) - len(closed.jaxpr.invars)
        c_out, y, kept = _tree.tree_unflatten(out_trees[0], list(range(len(full.outvars))))
        self.cy_tree, self.n_cy = _tree.tree_structure((c_out, y)), len(_tree.tree_leaves((c_out, y)))
        n_p, n_0 = len(_tree.tree_leaves(args[0])), self.n_hoisted + len(self.consts)
        carry_vars = full.invars[n_0 + n_p:n_0 + n_p + len(_tree.tree_leaves(args[1]))]
        self._split_kept(full, set(carry_vars))
        self.saved_vars: list = []
        if policy is not None:
            self._choose_saved(policy, carry_out)

    def _split_kept(self, full, carry_vars: set) -> None:
        """Residuals that depend on the carry stay outputs; the others get a program of their own."""
        reads_carry = set(carry_vars)
        for eqn in full.eqns:
            if has_effects(eqn) or any(isinstance(v, jcore.Var) and v in reads_carry for v in eqn.invars):
                reads_carry.update(eqn.outvars)
        kept = full.outvars[self.n_cy:]
        self._stored = [k for k, v in enumerate(kept) if isinstance(v, jcore.Var) and v in reads_carry]
        self._from_params = [k for k in range(len(kept)) if k not in self._stored]
        self.n_kept_all = len(kept)
        self.jaxpr = full.replace(outvars=full.outvars[:self.n_cy] + [kept[k] for k in self._stored])
        self.n_out, self.n_kept = len(self.jaxpr.outvars), len(self._stored)
        params_only = full.replace(outvars=[kept[k] for k in self._from_params])
        self._params_jaxpr, self._params_inputs = pe.dce_jaxpr(params_only, [True] * len(self._from_params),
                                                               instantiate=False)

    def _choose_saved(self, policy: Callable, carry_out: bool) -> None:
        """What the forward pass keeps, by ``jax.checkpoint``'s own partial evaluation of the program.

        ``partial_eval_jaxpr_custom`` with every input known splits the forward program into the
        program with its saved values as extra outputs (the forward pass; nested ``scan`` /
        ``cond`` / ``jit`` programs split by their own rules) and the program that computes the
        residuals (and the carry and ``y`` with ``carry_out``) again from those values and the
        inputs (the recompute), dead code removed.
        """
        jaxpr = self.jaxpr
        n_in, n_out = len(jaxpr.invars), len(jaxpr.outvars)
        known, staged, _, _, n_res = pe.partial_eval_jaxpr_custom(
            jaxpr, [False] * n_in, [True] * n_in, [True] * n_out, [True] * n_out, policy)
        residuals = list(known.outvars[len(known.outvars) - n_res:])
        staged, used = pe.dce_jaxpr(staged, [carry_out or k >= self.n_cy for k in range(n_out)], instantiate=False)
        self.saved_vars = [v for v, u in zip(residuals, used[:n_res]) if u]
        self.recompute_jaxpr, self.recompute_inputs = staged, list(used[n_res:])
        self.forward_jaxpr = known.replace(outvars=list(jaxpr.outvars) + self.saved_vars)

    def _inputs(self, params, xs, consts, i, c, hoisted) -> list:
        return list(hoisted) + self.consts + _tree.tree_leaves((take(params, i), c, take(xs, i), consts))

    def hoisted(self) -> list:
        """The values the layer computes from constants alone (:func:`jaxremat.same_program.hoist_constants`)."""
        return [] if self._cone is None else _eval(self._cone, [], [])

    def _hoisted_operands(self, live) -> list:
        """:meth:`hoisted` as run-time values, computed outside the layer's computation (its operands)."""
        return run_time(self.hoisted(), _pred(self._pred(live))) if self.n_hoisted else []

    def _outputs(self, out):
        """``(carry, y, kept)`` from a flat output list (``kept``: the stored residuals)."""
        c_out, y = _tree.tree_unflatten(self.cy_tree, list(out[:self.n_cy]))
        return c_out, y, list(out[self.n_cy:self.n_out])

    def residuals(self, params, xs, consts, i, stored: list) -> list:
        """Every residual of layer ``i`` (the pullback's kept leaves): ``stored`` and those of its parameters."""
        if not self._from_params:
            return list(stored)
        ins = self.hoisted() + self.consts + _tree.tree_leaves(take(params, i))
        n_c = len(self.jaxpr.invars) - len(ins) - len(_tree.tree_leaves((take(xs, i), consts)))
        ins = ins + [None] * n_c + _tree.tree_leaves((take(xs, i), consts))
        computed = iter(_eval(self._params_jaxpr, [], [a for a, u in zip(ins, self._params_inputs) if u]))
        stored = iter(stored)
        return [next(stored) if k in self._stored else next(computed) for k in range(self.n_kept_all)]

    def stacks(self, n: int) -> list:
        """Zero buffers for ``n`` layers' stored residuals (leading axis ``n``)."""
        return [jnp.zeros((n,) + tuple(v.aval.shape), v.aval.dtype) for v in self.jaxpr.outvars[self.n_cy:]]

    def _stacked(self, out, stacks, j):
        """``(carry, y, kept)`` of ``out``; with ``stacks``, ``kept`` written into slot ``j`` of them."""
        c_out, y, kept = self._outputs(out)
        if stacks is None:
            return c_out, y, kept
        return c_out, y, [lax.dynamic_update_index_in_dim(s, k.astype(s.dtype), j, 0) for s, k in zip(stacks, kept)]

    def forward(self, params, xs, consts, i, c, live=None, stacks=None, j=None):
        """Layer ``i`` from carry ``c``: ``(carry, y, kept, saved)``; ``saved`` is [] without a policy.

        With ``stacks`` (:meth:`stacks`), the residuals are written into their slot ``j`` inside the
        computation, which updates the stacks in place (:func:`isolate`'s ``buffers``), and the
        updated stacks are returned in the place of ``kept`` (written outside, the computation's
        outputs would be a second copy of one layer's residuals). ``live`` (:func:`alive`) is read by
        the predicate: the computation waits for it.
        """
        jaxpr = self.jaxpr if self.policy is None else self.forward_jaxpr

        def run(op, stacks=None):
            params, xs, consts, i, c, j, hoisted = op
            out = _eval(jaxpr, [], self._inputs(params, xs, consts, i, batched_with(c, (params, xs, consts)), hoisted))
            c_out, y, kept = self._stacked(out, stacks, j)
            return (c_out, y, list(out[self.n_out:])), kept
        op = (params, xs, consts, i, c, j, self._hoisted_operands(live))
        if stacks is None:
            (c_out, y, saved), kept = isolate(run, op, self._pred(live))
        else:
            (c_out, y, saved), kept = isolate(run, op, self._pred(live), stacks)
        return c_out, y, kept, saved

    def recompute(self, params, xs, consts, i, c, saved: list, live=None, stacks=None, j=None):
        """Layer ``i`` again from carry ``c`` and what its forward pass saved: ``(carry, y, kept)``.

        ``live``, ``stacks``, ``j``: as in :meth:`forward`. Without ``carry_out`` the carry and ``y``
        are None.
        """
        if self.policy is None:
            return self.forward(params, xs, consts, i, c, live, stacks, j)[:3]

        def run(op, stacks=None):
            params, xs, consts, i, c, saved, j, hoisted = op
            c = batched_with(c, (params, xs, consts, saved))
            ins = [a for a, u in zip(self._inputs(params, xs, consts, i, c, hoisted), self.recompute_inputs) if u]
            out = _eval(self.recompute_jaxpr, [], list(saved) + ins)
            if not self.carry_out:
                out = [None] * self.n_cy + list(out)
            c_out, y, kept = self._stacked(out, stacks, j)
            return (c_out, y), kept
        op = (params, xs, consts, i, c, saved, j, self._hoisted_operands(live))
        (c_out, y), kept = (isolate(run, op, self._pred(live)) if stacks is None
                            else isolate(run, op, self._pred(live), stacks))
        return c_out, y, kept

    def _pred(self, live):
        return self.pred if live is None else self.pred + live
