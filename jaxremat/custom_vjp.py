"""What a checkpointed segment does with the ``jax.custom_vjp`` ops of a block: recompute or save.

A ``jax.custom_vjp`` op has two forward functions: the primal ``f`` (run when nothing is
differentiated) and the rule's ``fwd``, which returns the output and the *residuals* its ``bwd``
reads. Measured on XLA:CPU, jax 0.10.2, N=4, block ``h + op(h, w)`` with ``fwd`` keeping
``(x, w, x @ w)`` (tests/jaxremat/test_custom_vjp.py; ``python scripts/custom_vjp_remat.py``):

* ``custom_vjp_residuals="recompute"`` (default; remat's own behaviour): nothing of the op is
  kept; a checkpointed layer's recompute runs ``fwd`` again. The forward pass runs the primal in
  the reverse loop without a policy (``full``: 4 primal + 4 ``fwd``), but ``fwd`` itself, its
  residuals dropped, under ``jax.checkpoint`` (``method="checkpoint"``, or any policy in the
  reverse loop): ``fwd`` twice per checkpointed layer (``full``: 8 for 4 layers).
  ``optimize_remat=True`` in the rule's ``defvjp`` makes ``jax.checkpoint`` run the primal there
  (4 + 4, same bytes, bitwise), and changes nothing in the reverse loop without a policy -- unless
  ``fwd`` has an effect (a ``jax.debug.callback``): then JAX keeps ``fwd`` in the forward pass
  with its outputs, the op is never recomputed (4 ``fwd``) and ``every_k(2)`` keeps more than
  ``none`` (11 against 9 (B, D) activations).
* ``custom_vjp_residuals="save"``: every output of every ``fwd`` rule in the block (its residuals
  and its primal outputs) carries the ``checkpoint_name`` tag :data:`CUSTOM_VJP_RESIDUAL`, and the
  segment's policy also saves that name (``jax.checkpoint_policies.save_only_these_names``, joined
  to the user's policy by ``save_from_both_policies``); a segment then runs JAX's own remat
  (``jax.checkpoint``) with that policy. ``fwd`` runs once per layer, never in the backward pass;
  its outputs stay live from the forward pass to the backward pass: saved bytes rise above
  ``none``'s when the op is most of the layer (``full``: 13 against 9 activations in the reverse
  loop). Bits: op by op, bitwise with ``none``; under ``jit``, a layer input recomputed from a
  saved output (``h + gelu(...)``, the second layer of a segment) is rounded twice where XLA:CPU's
  forward pass computed it as one fused multiply-add, and that layer's gradient moves (below 1e-7
  of its largest entry: 4 ULP at B=2, D=8; 576 ULP at B=D=128). Under ``nested`` schedules the policy applies to the inner
  segments, as every policy does, so the outer recompute runs ``fwd`` once more.
* Under JAX's ``jax_remat3`` flag, ``jax.checkpoint`` runs an op's primal in a checkpointed forward
  pass and its ``fwd`` in the recompute (as ``optimize_remat=True`` does without it), so nothing of
  the rule is kept there: ``"save"`` through ``jax.checkpoint`` is refused by
  :func:`jaxremat.render.remat_scan`; the reverse loop keeps the rule's outputs as above on JAX >= 0.11
  (JAX 0.10's flag refuses a policy in the reverse loop; docs/usage.md, "JAX versions").

The tags are put in by rewriting the block's jaxpr: each ``custom_vjp_call`` equation (also inside
``jit``, ``scan``, ``cond`` and ``checkpoint`` sub-programs of the block; not inside a
``custom_jvp`` function) gets a ``fwd`` that names its outputs. This reads the equation's
``fwd_jaxpr_thunk`` parameter, an internal of ``jax._src.custom_derivatives`` (jax 0.10.2).

Source: ``jax.custom_vjp`` / ``defvjp(..., optimize_remat=...)`` (``jax/_src/custom_derivatives.py``),
``jax.checkpoint_policies`` (``jax/_src/ad_checkpoint.py``).
"""

from __future__ import annotations

import collections
import warnings
from typing import Any, Callable

import jax
import jax.extend.core
from jax._src import api_util, core
from jax._src import linear_util as lu
from jax._src.custom_derivatives import custom_vjp_call_p
from jax._src.interpreters import partial_eval as pe
from jax.ad_checkpoint import checkpoint_name

from .layer_pass import runs_once
from .spec.lint import RematPolicyWarning
from .tags import sub_jaxprs, tag_name

__all__ = ["CUSTOM_VJP_RESIDUAL", "CUSTOM_VJP_RESIDUALS", "check_custom_vjp_residuals", "count_named_runs",
           "custom_vjp_policy", "save_custom_vjp_residuals", "tag_custom_vjp_residuals"]

CUSTOM_VJP_RESIDUAL = "custom_vjp_residual"
"""The ``checkpoint_name`` tag of the outputs of a ``custom_vjp`` rule's ``fwd`` under ``"save"``."""

CUSTOM_VJP_RESIDUALS = ("recompute", "save")
"""The values of ``custom_vjp_residuals`` (see the module docstring)."""


def check_custom_vjp_residuals(value: Any) -> str:
    """``value`` if it is one of :data:`CUSTOM_VJP_RESIDUALS`.

    Raises:
        ValueError: any other value (the message lists the valid ones and what each does).
    """
    if not isinstance(value, str) or value not in CUSTOM_VJP_RESIDUALS:
        raise ValueError(f"custom_vjp_residuals must be 'recompute' (run a custom_vjp rule's forward again in "
                         f"the backward pass; the memory saving) or 'save' (keep its residuals from the forward "
                         f"pass; its forward runs once), got {value!r}")
    return value


def custom_vjp_policy(policy: Callable | None) -> Callable:
    """``policy`` (a ``jax.checkpoint`` policy or None) that also saves :data:`CUSTOM_VJP_RESIDUAL` tags."""
    cp = jax.checkpoint_policies
    saved = cp.save_only_these_names(CUSTOM_VJP_RESIDUAL)
    return saved if policy is None else cp.save_from_both_policies(policy, saved)


def _tagged_fwd_thunk(thunk: lu.WrappedFun) -> lu.WrappedFun:
    """A ``fwd_jaxpr_thunk`` whose jaxpr names every output (residuals, then primal outputs)."""
    memo: dict = {}

    def tagged(*nonzeros):
        if nonzeros not in memo:
            jaxpr, consts = thunk.call_wrapped(*nonzeros)

            def named(*args):
                outs = core.eval_jaxpr(jaxpr, consts, *args)
                return [checkpoint_name(o, CUSTOM_VJP_RESIDUAL) for o in outs]

            avals = [v.aval for v in jaxpr.invars]
            info = api_util.debug_info("custom_vjp fwd (outputs named)", named, tuple(avals), {})
            new, _, new_consts = pe.trace_to_jaxpr_dynamic(lu.wrap_init(named, debug_info=info), avals)
            memo[nonzeros] = (new, new_consts)
        return memo[nonzeros]

    return lu.wrap_init(tagged, debug_info=thunk.debug_info)


def tag_custom_vjp_residuals(jaxpr: jax.extend.core.Jaxpr) -> tuple[jax.extend.core.Jaxpr, int]:
    """``jaxpr`` with every ``custom_vjp`` rule's ``fwd`` outputs named; and how many rules were found.

    Args:
        jaxpr: an open jaxpr (``jax.make_jaxpr(f)(...).jaxpr``), e.g. one layer of a stack.

    Returns:
        ``(new_jaxpr, n_rules)``: the same program, each ``custom_vjp_call`` equation (at any depth
        of ``jit`` / ``scan`` / ``cond`` / ``checkpoint`` sub-programs) with a ``fwd`` whose outputs
        carry the tag :data:`CUSTOM_VJP_RESIDUAL`; ``jaxpr`` itself when ``n_rules == 0``.
    """
    eqns, found = [], 0
    for eqn in jaxpr.eqns:
        new = eqn
        if eqn.primitive is custom_vjp_call_p:
            new = eqn.replace(params=dict(eqn.params, fwd_jaxpr_thunk=_tagged_fwd_thunk(eqn.params["fwd_jaxpr_thunk"])))
            found += 1
        elif eqn.primitive.name != "custom_jvp_call":  # its jvp rule, not its jaxpr, is differentiated
            params = {}
            for key, value in eqn.params.items():
                params[key], n = _tag_param(value)
                found += n
            if any(params[k] is not eqn.params[k] for k in params):
                new = eqn.replace(params=params)
        eqns.append(new)
    return (jaxpr.replace(eqns=eqns) if found else jaxpr), found


def _tag_param(value: Any) -> tuple[Any, int]:
    # jax.extend.core names: JAX 0.12 merged ClosedJaxpr into Jaxpr (one class, consts attached; its
    # ``.jaxpr`` is itself) and dropped ``jax._src.core.ClosedJaxpr``; JAX 0.10 has both classes.
    jaxpr_types = (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)
    if isinstance(value, jax.extend.core.ClosedJaxpr):
        new, n = tag_custom_vjp_residuals(value.jaxpr)
        return (jax.extend.core.ClosedJaxpr(new, value.consts) if n else value), n
    if isinstance(value, jax.extend.core.Jaxpr):
        return tag_custom_vjp_residuals(value)
    if isinstance(value, tuple) and any(isinstance(v, jaxpr_types) for v in value):
        pairs = [_tag_param(v) for v in value]
        n = sum(k for _, k in pairs)
        return (tuple(v for v, _ in pairs) if n else value), n
    return value, 0


def save_custom_vjp_residuals(block_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``block_fn`` traced, its ``custom_vjp`` rules' ``fwd`` outputs named, and run (same values).

    Warns:
        RematPolicyWarning: the block holds no ``jax.custom_vjp`` op (``"save"`` changes nothing).
    """
    def tagged(*args):
        closed, out_shape = jax.make_jaxpr(block_fn, return_shape=True)(*args)
        jaxpr, found = tag_custom_vjp_residuals(closed.jaxpr)
        if not found:
            warnings.warn("custom_vjp_residuals='save' but the block holds no jax.custom_vjp op: nothing is "
                          "saved for it; drop the argument", RematPolicyWarning, stacklevel=2)
        outs = core.eval_jaxpr(jaxpr, closed.consts, *jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    return tagged


def count_named_runs(fn: Callable[..., Any], *args) -> dict[str, int]:
    """How many times each ``checkpoint_name`` tag runs in one call of ``fn(*args)``, per tag name.

    Tag the first operation of a ``custom_vjp`` rule's primal and of its ``fwd`` with names of your
    own, and count them in ``jax.grad(loss)`` to see where the rule runs. Counted in the program's
    jaxpr after dead-code elimination (``jax._src.interpreters.partial_eval.dce_jaxpr``): a
    ``scan`` body counts once per iteration (its ``length``), a ``cond`` its largest branch (one
    branch runs), any other sub-program (``jit``, ``checkpoint``, ``custom_vjp``, the one-trip loop
    of a layer run isolated, :func:`jaxremat.layer_pass.runs_once`) once per call.

    Args:
        fn: a function of arrays, e.g. ``jax.grad(loss)``.
        *args: its arguments (arrays or ``jax.ShapeDtypeStruct`` s; nothing is computed).

    Returns:
        ``{name: runs}`` for every tag that runs at least once.

    Raises:
        ValueError: a ``while`` loop of the user's holds a tag (its trip count is not known from the
            program).
    """
    closed = jax.make_jaxpr(fn)(*args)
    jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    return dict(_named_runs(jaxpr))


def _named_runs(jaxpr: jax.extend.core.Jaxpr) -> collections.Counter:
    runs: collections.Counter = collections.Counter()
    for eqn in jaxpr.eqns:
        if tag_name(eqn) is not None:
            runs[tag_name(eqn)] += 1
        subs = [_named_runs(getattr(j, "jaxpr", j)) for j in sub_jaxprs(eqn)]
        if eqn.primitive.name == "cond":
            subs = [collections.Counter({k: max(s[k] for s in subs) for s in subs for k in s})]
        elif eqn.primitive.name == "while" and any(subs) and not runs_once(eqn):
            raise ValueError("a while loop holds a checkpoint_name tag; its trip count is not known from the program")
        times = eqn.params["length"] if eqn.primitive.name == "scan" else 1
        for sub in subs:
            runs.update({k: v * times for k, v in sub.items()})
    return runs
