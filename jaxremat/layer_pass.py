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

So here a layer's forward pass is one XLA computation, a ``lax.cond`` branch or the body of a
one-trip ``while`` loop (:func:`jaxremat.isolation.isolate`, re-exported here with the other names
of :mod:`jaxremat.isolation`), called with the same operands and producing the same outputs
wherever it runs: XLA fuses it among its own ops only, and the same program gives the same bits.

A checkpointed segment with a ``jax.checkpoint`` policy keeps, per layer, the values the policy
saves. :class:`LayerProgram` splits the layer's forward program with JAX's own partial evaluation
(``partial_eval_jaxpr_custom``, the machinery of ``jax.checkpoint``): the forward pass runs the
whole program and also outputs the saved values; the recompute runs the same program with the
saved values read instead of computed, and still produces every output (the carry included), so
the values that are recomputed see the same fusions as in ``none``.

Four more things keep the programs alike (:mod:`jaxremat.same_program`): a branch reads its
operands through ``lax.optimization_barrier``, so that XLA cannot fold a stack input that is a
constant of the program into ``none``'s first layer; under ``jax.vmap`` the predicates are never
batched (a batched one makes ``lax.cond`` a ``select`` run inline) and every layer maps its carry
whenever anything it reads is mapped; narrow-float matrix products and names are read rounded
in every pass, as a policy saves them; and what a layer computes from constants alone (a causal
mask) is computed outside it and read as an operand, where XLA would hoist it out of a one-trip
loop's body but not out of a branch (:func:`jaxremat.same_program.hoist_constants`).

Source: ``jax.checkpoint`` policies and ``partial_eval_jaxpr_custom`` (``jax/_src/ad_checkpoint.py``,
``jax/_src/interpreters/partial_eval.py``); ``jax.lax.cond``, ``jax.lax.while_loop``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.extend
import jax.numpy as jnp
from jax import lax
from jax._src import core as jcore
from jax._src.interpreters import partial_eval as pe
from jax.extend.core.primitives import remat_p

from .isolation import ONCE_SCOPE, isolate, predicate, run_time_true, runs_once, tie
from .same_program import batched_with, bind_eqn, has_effects, hoist_constants, round_saveable, run_time
from .slice_order import alive, eval_slicing_late, take
from .tags import tag_aware

# isolation and slice_order names re-exported: docs and callers name them as jaxremat.layer_pass.*
__all__ = ["ONCE_SCOPE", "LayerProgram", "Pullback", "alive", "differentiated_policy", "isolate", "predicate", "rebuild",
           "runs_once", "take", "tie"]

_tree = jax.tree_util


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
            jaxpr, [False] * n_in, [True] * n_in, [True] * n_out, [True] * n_out, tag_aware(policy))
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
        return run_time(self.hoisted(), run_time_true(self._pred(live))) if self.n_hoisted else []

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
            c = batched_with(c, (params, xs, consts))
            if self.policy is None:  # parameter slices taken as late as they are read (jaxremat.slice_order)
                p_stacks = _tree.tree_leaves(params)
                ins = (list(hoisted) + self.consts + [None] * len(p_stacks)
                       + _tree.tree_leaves((c, take(xs, i), consts)))
                n_0 = len(hoisted) + len(self.consts)
                out = eval_slicing_late(jaxpr, ins, {n_0 + k: (a, i) for k, a in enumerate(p_stacks)})
            else:
                out = _eval(jaxpr, [], self._inputs(params, xs, consts, i, c, hoisted))
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
