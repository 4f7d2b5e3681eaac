"""Menus of block options for the remat planner, measured in JAX, and the planner on a GPT.

The planner (:mod:`jaxremat.spec.planner`, a dynamic program over the chain of blocks) needs, for
every block and every option of its menu (store it; checkpoint it with no policy; checkpoint it
under a named policy), three costs: the bytes the block keeps until its backward pass, the bytes
live while its segment is recomputed and run backward, and the FLOPs its recompute costs. This
module measures them on the block itself, on the traced and lowered program (no compile, no run):

* **kept bytes**: the non-argument residuals of ``jax.vjp`` of the block, plain (``store``) or
  under ``jax.checkpoint(policy)`` (:func:`jaxremat.memory.saved_residuals`); for the GPT block
  the ``store`` bytes come from the exact per-tensor account
  (:func:`jaxremat.models.gpt.activation.layer_bytes`, checked tensor by tensor against the same
  residuals) and the stack's loop invariants (the causal mask's broadcasts) are counted once;
* **working bytes**: what the block holds while it runs backward: its ``store`` bytes (a
  recomputed block rebuilds its residuals), or what the option keeps if that is more;
* **recompute FLOPs**: XLA's cost analysis (``jax.stages.Lowered.cost_analysis()["flops"]``) of
  ``value_and_grad`` of the checkpointed block less that of the plain block: the FLOPs the
  backward pass spends recomputing. Counted on one block whose output is the checkpoint's output;
  inside a longer segment, each block but the last also recomputes its last op (the MLP
  down-projection, whose output only the next block reads); the count leaves that out.

:func:`block_options` does this for any block function ``block(params, x) -> y`` (a user's own
block, e.g. the per-layer function of a Flax stack); :func:`gpt_block_options` for the project's
GPT block; :func:`plan_gpt` plans a GPT for a budget of peak activation bytes, as
:func:`jaxremat.models.gpt.activation.predict_peak_activation_bytes` counts them (the stack's
chain peak plus the tensors outside the stack and the logits' gradient).

JAX is imported at module top: this module is the JAX side of the planner (the neutral DP lives
in :mod:`jaxremat.spec.planner`; the PyTorch menus in :mod:`torchref.planner`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from .memory import saved_residuals
from .model import block_forward
from .models.block import BLOCK_PARAM_NAMES
from .models.config import TransformerConfig
from .models.gpt import activation as account
from .models.params import param_shapes
from .policies import to_jax_policy
from .spec.planner import BlockOption, NoPlanFits, PlannerResult, plan_for_budget
from .spec.policies import parse_policy

__all__ = ["DEFAULT_MENU", "block_options", "gpt_block_options", "gpt_chain", "plan_gpt"]

DEFAULT_MENU = ("save_nothing", "save_dots", "attention_only", "save_qkv_proj", "mlp_only")
"""The checkpoint options of the default menu (``store`` is always added first): no policy, the
dots, recompute attention only, keep the qkv projection, recompute the MLP only. Offloading
policies are left out: the chain model counts an offloaded tensor as off the device, but on a CPU
host it stays in the same memory."""


def _loss(fn: Callable) -> Callable:
    return lambda p, x: jnp.sum(fn(p, x))


def _flops(fn: Callable, params: Any, x: Any) -> float:
    """FLOPs of ``value_and_grad(sum(fn))``, XLA's cost analysis of the lowered (not compiled) program."""
    cost = jax.jit(jax.value_and_grad(_loss(fn), argnums=(0, 1))).lower(params, x).cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
        cost = cost[0]
    return float(cost["flops"])


def _kept(fn: Callable, params: Any, x: Any) -> int:
    return sum(r.bytes for r in saved_residuals(_loss(fn), params, x) if not r.is_argument)


def _check_menu(policies: Sequence) -> tuple:
    if isinstance(policies, str) or not isinstance(policies, (list, tuple)):
        raise ValueError(f"policies must be a list of policy names, e.g. {list(DEFAULT_MENU)}, got {policies!r}")
    parsed = [parse_policy(p) for p in policies]
    for p in parsed:
        if p.offloaded_names:
            raise ValueError(f"policy {p.name!r} offloads {sorted(p.offloaded_names)}; the planner's menus take "
                             "device-only policies (an offloaded tensor's transfer time and host memory are "
                             "not modelled)")
        if p.save_everything:
            raise ValueError("'save_everything' keeps what 'store' keeps and recomputes nothing, at the cost of "
                             "one more boundary: it is never better than 'store'; leave it out of the menu")
    names = [p.name for p in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"policies must be distinct, got {names}")
    return tuple(parsed)


def block_options(block: Callable, params: Any, x: Any, policies: Sequence = DEFAULT_MENU, *,
                  store_bytes: int | None = None) -> list[BlockOption]:
    """The menu of one block, measured on the block: ``store`` then one checkpoint option per policy.

    Args:
        block: ``block(params, x) -> y`` with ``y`` of x's shape and dtype (one layer of a stack,
            e.g. the per-layer function a :func:`jaxremat.remat_scan` call scans).
        params: one layer's parameters (a pytree of arrays or ``jax.ShapeDtypeStruct`` s).
        x: the block input, an array or ``jax.ShapeDtypeStruct`` (e.g. (B, T, D) float32).
        policies: the checkpoint options, policy names or
            :class:`jaxremat.spec.policies.Policy` values (``"save_nothing"``: plain
            ``jax.checkpoint``); offloading policies and ``save_everything`` are refused.
        store_bytes: the bytes the stored block keeps, when known exactly (the GPT account);
            None: the block's non-argument residuals (for a block whose input is kept, that input
            is an argument here and is not counted).

    Returns:
        ``[BlockOption("store", ...), BlockOption(policy name, checkpointed=True, ...), ...]``:
        kept and working bytes (int), recompute FLOPs (module docstring). A checkpoint option
        whose policy keeps anything has ``keeps_block_input=True`` (a segment of such blocks in
        :func:`jaxremat.remat_scan` keeps each inner block's input, measured there).

    Raises:
        ValueError: a bad or duplicate policy, an offloading policy or ``save_everything``.
    """
    menu = _check_menu(policies)
    plain = _flops(block, params, x)
    store = _kept(block, params, x) if store_bytes is None else int(store_bytes)
    out = [BlockOption("store", False, kept_bytes=store, working_bytes=store)]
    for p in menu:
        fn = jax.checkpoint(block, policy=to_jax_policy(p), prevent_cse=True)
        kept = _kept(fn, params, x)
        out.append(BlockOption(p.name, True, p, kept_bytes=kept, working_bytes=max(store, kept),
                               recompute_flops=max(0.0, _flops(fn, params, x) - plain),
                               keeps_block_input=not p.saves_nothing))
    return out


def _gpt_block(cfg: TransformerConfig, batch: int, seq: int):
    if batch < 1 or not 1 <= seq <= cfg.max_seq_len:
        raise ValueError(f"need batch >= 1 and 1 <= seq <= {cfg.max_seq_len}, got batch={batch}, seq={seq}")
    if getattr(cfg, "arch", "gpt") != "gpt":
        raise ValueError(f"gpt_block_options plans the GPT block; cfg.arch is {cfg.arch!r} (use block_options "
                         "with that family's block function)")
    dtype = jnp.dtype(cfg.dtype)
    shapes = param_shapes(cfg)
    params = {k: jax.ShapeDtypeStruct(shapes[k][1:], dtype) for k in BLOCK_PARAM_NAMES}
    x = jax.ShapeDtypeStruct((batch, seq, cfg.d_model), dtype)
    return (lambda p, h: block_forward(p, h, cfg)), params, x


def gpt_block_options(cfg: TransformerConfig, batch: int, seq: int,
                      policies: Sequence = DEFAULT_MENU) -> list[BlockOption]:
    """The menu of one GPT block (:func:`jaxremat.model.block_forward`) at batch B and sequence T.

    ``store`` keeps :func:`jaxremat.models.gpt.activation.layer_bytes` (the per-layer tensors of
    the exact account; the causal mask's broadcasts are the stack's invariant bytes, see
    :func:`gpt_chain`); each policy's kept bytes and recompute FLOPs are measured
    (:func:`block_options`). Every block of a GPT has the same menu.

    Raises:
        ValueError: bad sizes, dropout (the account covers dropout 0), a family other than GPT,
            or a bad menu.
    """
    account.layer_bytes("jax", cfg, batch, seq)  # checks sizes and dropout
    block, params, x = _gpt_block(cfg, batch, seq)
    return block_options(block, params, x, policies, store_bytes=account.layer_bytes("jax", cfg, batch, seq))


def gpt_chain(cfg: TransformerConfig, batch: int, seq: int, policies: Sequence = DEFAULT_MENU) -> dict:
    """Everything :func:`jaxremat.spec.planner.plan_for_budget` needs for a GPT stack, in JAX.

    Returns:
        ``{"options_per_block": N menus, "boundary_bytes": B*T*D*itemsize, "invariant_bytes":
        the stack's loop invariants, "fixed_bytes": the bytes outside the stack at the peak (the
        tensors kept outside it and the logits' gradient)}``; a plan's predicted peak activation
        is ``fixed_bytes`` plus the planner's peak.
    """
    menu = gpt_block_options(cfg, batch, seq, policies)
    return {"options_per_block": [menu] * cfg.n_layer,
            "boundary_bytes": account.boundary_bytes(cfg, batch, seq),
            "invariant_bytes": account.stack_invariant_bytes("jax", cfg, batch, seq),
            "fixed_bytes": account.non_stack_peak_bytes("jax", cfg, batch, seq)}


def plan_gpt(cfg: TransformerConfig, batch: int, seq: int, budget_bytes: int,
             policies: Sequence = DEFAULT_MENU, **kw) -> PlannerResult:
    """The plan of least recompute whose predicted peak activation bytes fit ``budget_bytes``.

    The budget covers the whole step's activations as
    :func:`jaxremat.models.gpt.activation.predict_peak_activation_bytes` predicts them (parameters,
    gradients and optimizer state excluded); the result's ``peak_bytes`` is on the same scale.

    Example::

        r = plan_gpt(cfg, 8, 64, budget_bytes=6 * 2**20)
        loss = loss_fn(params, tokens, cfg, r.plan)  # remat_scan takes the plan as its schedule

    Args:
        cfg, batch, seq: the model and the batch's shape (B, T).
        budget_bytes: peak activation bytes allowed (int).
        policies: the menu's checkpoint options (:data:`DEFAULT_MENU`).
        **kw: passed to :func:`jaxremat.spec.planner.plan_for_budget` (``resolution``).

    Raises:
        jaxremat.spec.planner.NoPlanFits: no plan fits (its message gives the least achievable
            peak of the stack, and a plan reaching it).
        ValueError: as :func:`gpt_block_options`, or a negative budget.
    """
    chain = gpt_chain(cfg, batch, seq, policies)
    fixed = chain.pop("fixed_bytes")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be an integer >= 0, got {budget_bytes!r}")
    try:
        res = plan_for_budget(chain["options_per_block"], max(0, budget_bytes - fixed), chain["boundary_bytes"],
                              chain["invariant_bytes"], **kw)
    except NoPlanFits as exc:  # restate it on the budget's scale: the whole step's activations
        raise NoPlanFits(budget_bytes, exc.min_peak_bytes + fixed, exc.min_peak_plan) from None
    return dataclasses.replace(res, peak_bytes=res.peak_bytes + fixed, budget_bytes=budget_bytes,
                               min_peak_bytes=res.min_peak_bytes + fixed)
