"""Menus of block options for the remat planner, measured in JAX, and the planner on a GPT.

The planner (:mod:`jaxremat.spec.planner`, a dynamic program over the chain of blocks) needs, for
every block and every option of its menu (store it; checkpoint it with no policy; checkpoint it
under a named policy), three costs: the bytes the block keeps until its backward pass, the bytes
live while its segment is recomputed and run backward, and the FLOPs its recompute costs. This
module measures them on the block itself, on the traced and lowered program (no compile, no run):

* **kept bytes**: the non-argument residuals (:func:`jaxremat.memory.saved_residuals`) of a
  segment of 2 and of 3 blocks rendered by :func:`jaxremat.remat_scan`, stored or checkpointed
  under the policy: what each block adds, and what a segment keeps once (``segment_bytes``); for
  the GPT block ``store`` equals the exact per-tensor account,
  :func:`jaxremat.models.gpt.activation.layer_bytes`;
* **working bytes**: what the block holds while its segment runs backward: its ``store`` bytes
  (a recomputed block rebuilds its residuals) plus what the option keeps, which the compiled
  program holds in buffers of their own (the temp bytes of a compiled segment of L blocks under
  ``save_dots`` grow by ``store + kept`` per block: 2.23 MB at gpt-small, B=4, T=64);
* **recompute FLOPs**: XLA's cost analysis (``jax.stages.Lowered.cost_analysis()["flops"]``) of
  ``value_and_grad`` of the checkpointed block less that of the plain block: the FLOPs the
  backward pass spends recomputing. Counted on one block whose output is the checkpoint's output;
  inside a longer segment, each block but the last also recomputes its last op (the MLP
  down-projection, whose output only the next block reads); the count leaves that out;
* **transient bytes** (a block's backward temporaries) are not measured in JAX (0): the compiled
  program's buffers are XLA's to assign; the harness calibrates the budget on ``none``'s measured
  peak instead (:mod:`parity.cases.budget_plan`).

:func:`block_options` does this for any block function ``block(params, x) -> y`` (a user's own
block, e.g. the per-layer function of a Flax stack); :func:`gpt_block_options` for the project's
GPT block; :func:`plan_gpt` plans a GPT for a budget of peak activation bytes, as
:func:`jaxremat.models.gpt.activation.predict_peak_activation_bytes` counts them (the stack's
chain peak plus the tensors outside the stack and the logits' gradient).

JAX is imported at module top: this module is the JAX side of the planner (the neutral DP lives
in :mod:`jaxremat.spec.planner`; the PyTorch menus in :mod:`torchref.planner`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from .memory import saved_residuals
from .encoder import encoder_block_forward
from .model import block_forward
from .models.block import BLOCK_PARAM_NAMES
from .models.config import TransformerConfig
from .models.gpt import activation as account
from .models.bert.layout import encoder_chain_base
from .models.params import param_shapes
from .models.registry import get_model
from .policies import to_jax_policy
from .spec.planner import BlockOption, PlannerResult, plan_chain
from .render import remat_scan
from .spec.policies import parse_policy
from .spec.segment_plan import PlanSegment, SegmentPlan

__all__ = ["DEFAULT_MENU", "block_options", "encoder_chain", "gpt_block_options", "gpt_chain", "model_chain", "plan_gpt",
           "plan_model"]

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


def _segment_kept(block: Callable, params: Any, x: Any, checkpointed: bool, policy, length: int) -> int:
    """Non-argument residual bytes of one segment of ``length`` blocks rendered by :func:`jaxremat.remat_scan`."""
    stacked = jax.tree.map(lambda a: jax.ShapeDtypeStruct((length, *jnp.shape(a)), jnp.result_type(a)), params)
    plan = SegmentPlan((PlanSegment(length, checkpointed, policy),))
    fn = lambda s, h: jnp.sum(remat_scan(lambda lp, c, _: block(lp, c), s, h, plan))  # noqa: E731
    return sum(r.bytes for r in saved_residuals(fn, stacked, x) if not r.is_argument)


def _slope_intercept(block, params, x, checkpointed, policy) -> tuple[int, int]:
    """``(per block, per segment)`` bytes of a segment's residuals, from segments of 2 and 3 blocks.

    Lengths 2 and 3: a segment is linear in its length (checked by the tests up to 4), one block
    long included (:mod:`jaxremat.layer_pass` runs every layer alike)."""
    k2, k3 = (_segment_kept(block, params, x, checkpointed, policy, n) for n in (2, 3))
    return k3 - k2, k2 - 2 * (k3 - k2)


def block_options(block: Callable, params: Any, x: Any, policies: Sequence = DEFAULT_MENU) -> list[BlockOption]:
    """The menu of one block, measured on the block: ``store`` then one checkpoint option per policy.

    Kept bytes are measured on segments of the block as :func:`jaxremat.remat_scan` renders them
    (``plan(L:store)``, ``plan(L+POLICY)`` for L = 2, 3): ``kept_bytes`` is what each block adds
    and ``segment_bytes`` what a segment keeps once (a block that keeps its own input adds it for
    every block but the first, whose input is the boundary: ``segment_bytes = -boundary``; under
    ``save_dots`` a segment keeps every block's input, the first one's too, measured).

    Args:
        block: ``block(params, x) -> y`` with ``y`` of x's shape and dtype (one layer of a stack,
            e.g. the per-layer function a :func:`jaxremat.remat_scan` call scans).
        params: one layer's parameters (a pytree of arrays or ``jax.ShapeDtypeStruct`` s).
        x: the block input, an array or ``jax.ShapeDtypeStruct`` (e.g. (B, T, D) float32).
        policies: the checkpoint options, policy names or
            :class:`jaxremat.spec.policies.Policy` values (``"save_nothing"``: plain
            ``jax.checkpoint``); offloading policies and ``save_everything`` are refused.

    Returns:
        ``[BlockOption("store", ...), BlockOption(policy name, checkpointed=True, ...), ...]``:
        kept, segment and working bytes (int), recompute FLOPs (module docstring).

    Raises:
        ValueError: a bad or duplicate policy, an offloading policy or ``save_everything``.
    """
    menu = _check_menu(policies)
    plain = _flops(block, params, x)
    store, store_seg = _slope_intercept(block, params, x, False, None)
    # a stored run is one segment however it is cut: a negative intercept is counted as 0 (an upper bound)
    out = [BlockOption("store", False, kept_bytes=store, working_bytes=store, segment_bytes=max(0, store_seg))]
    for p in menu:
        fn = jax.checkpoint(block, policy=to_jax_policy(p), prevent_cse=True)
        kept, seg = _slope_intercept(block, params, x, True, None if p.saves_nothing else p)
        # what the policy keeps is held beside what the recompute rebuilds: separate buffers in the
        # compiled program (its temp bytes grow by store + kept per block of a segment, measured)
        out.append(BlockOption(p.name, True, p, kept_bytes=kept, working_bytes=store + kept,
                               recompute_flops=max(0.0, _flops(fn, params, x) - plain), segment_bytes=seg))
    return out


def _gpt_block(cfg: TransformerConfig, batch: int, seq: int):
    if batch < 1 or not 1 <= seq <= cfg.max_seq_len:
        raise ValueError(f"need batch >= 1 and 1 <= seq <= {cfg.max_seq_len}, got batch={batch}, seq={seq}")
    if cfg.arch != "gpt":
        raise ValueError(f"gpt_block_options plans the GPT block; cfg.arch is {cfg.arch!r} (use block_options "
                         "with that family's block function)")
    dtype = jnp.dtype(cfg.dtype)
    shapes = param_shapes(cfg)
    params = {k: jax.ShapeDtypeStruct(shapes[k][1:], dtype) for k in BLOCK_PARAM_NAMES}
    # the residual stream is in the compute dtype (the embedding casts it), as the scan carries it
    x = jax.ShapeDtypeStruct((batch, seq, cfg.d_model), jnp.dtype(cfg.compute_dtype or cfg.dtype))
    return (lambda p, h: block_forward(p, h, cfg)), params, x


def gpt_block_options(cfg: TransformerConfig, batch: int, seq: int,
                      policies: Sequence = DEFAULT_MENU) -> list[BlockOption]:
    """The menu of one GPT block (:func:`jaxremat.model.block_forward`) at batch B and sequence T.

    Measured by :func:`block_options` (once per configuration and menu in a process: cached);
    ``store`` keeps what the exact account says, :func:`jaxremat.models.gpt.activation.layer_bytes`
    per block (checked by the tests). Every block of a GPT has the same menu.

    Raises:
        ValueError: bad sizes, dropout (the account covers dropout 0), a family other than GPT,
            or a bad menu.
    """
    account.check_sizes("jax", cfg, batch, seq)  # sizes and dropout
    return list(_cached_gpt_menu(cfg, batch, seq, _check_menu(policies)))


@functools.lru_cache(maxsize=32)
def _cached_gpt_menu(cfg: TransformerConfig, batch: int, seq: int, policies: tuple) -> tuple:
    block, params, x = _gpt_block(cfg, batch, seq)
    return tuple(block_options(block, params, x, policies))


def gpt_chain(cfg: TransformerConfig, batch: int, seq: int, policies: Sequence = DEFAULT_MENU) -> dict:
    """Everything :func:`jaxremat.spec.planner.plan_for_budget` needs for a GPT stack, in JAX.

    Returns:
        ``{"options_per_block": N menus, "boundary_bytes": B*T*D*itemsize (of the compute dtype: the residual
        stream's), "invariant_bytes":
        the stack's loop invariants, "fixed_bytes": the bytes outside the stack at the peak (the
        tensors kept outside it and the logits' gradient)}``; a plan's predicted peak activation
        is ``fixed_bytes`` plus the planner's peak.
    """
    menu = gpt_block_options(cfg, batch, seq, policies)
    return {"options_per_block": [menu] * cfg.n_layer,
            "boundary_bytes": batch * seq * cfg.d_model * jnp.dtype(cfg.compute_dtype or cfg.dtype).itemsize,
            # fused attention: its own mask, measured in the menus' segment bytes, not the account's
            "invariant_bytes": (account.stack_invariant_bytes("jax", cfg, batch, seq)
                                if cfg.attention == "materialized" else 0),
            "fixed_bytes": account.non_stack_peak_bytes("jax", cfg, batch, seq)}


@functools.lru_cache(maxsize=32)
def _cached_encoder_menu(cfg: TransformerConfig, batch: int, seq: int, policies: tuple) -> tuple:
    dtype = jnp.dtype(cfg.dtype)
    shapes = param_shapes(cfg)
    params = {k: jax.ShapeDtypeStruct(shapes[k][1:], dtype) for k in BLOCK_PARAM_NAMES}
    x = jax.ShapeDtypeStruct((batch, seq, cfg.d_model), dtype)
    key_mask = jnp.ones((batch, seq), bool)  # what a block keeps does not depend on which keys are padding
    return tuple(block_options(lambda p, h: encoder_block_forward(p, h, key_mask, cfg), params, x, policies))


def encoder_chain(cfg: TransformerConfig, batch: int, seq: int, policies: Sequence = DEFAULT_MENU) -> dict:
    """The chain of a BERT encoder stack (:func:`jaxremat.encoder.encoder_block_forward`), in JAX.

    The menus are measured on the block (:func:`block_options`), as for a user's own block; the
    family has no per-tensor account of what lies outside the stack, so ``invariant_bytes`` and
    ``fixed_bytes`` are 0: a caller calibrates them on ``none``'s measured peak
    (:func:`parity.cases.budget_plan.resolve` does). Dropout is not measured (rate 0).

    Raises:
        ValueError: a family other than BERT, bad sizes, or a bad menu.
    """
    base = encoder_chain_base(cfg, batch, seq, jnp.dtype(cfg.dtype).itemsize)
    menu = list(_cached_encoder_menu(cfg.replace(dropout=0.0), batch, seq, _check_menu(policies)))
    return {"options_per_block": [menu] * cfg.n_layer, **base}


def model_chain(cfg: TransformerConfig, batch: int, seq: int, policies: Sequence = DEFAULT_MENU) -> dict:
    """The planner's chain of any registered family, in JAX (its ``jax_planner_chain``,
    :mod:`jaxremat.models.registry`): :func:`gpt_chain` or :func:`encoder_chain` built in.

    Raises:
        ValueError: a family without a planner chain, or as that family's chain builder.
    """
    return get_model(cfg.arch).load("jax_planner_chain")(cfg, batch, seq, policies)


def plan_model(cfg: TransformerConfig, batch: int, seq: int, budget_bytes: int,
               policies: Sequence = DEFAULT_MENU, **kw) -> PlannerResult:
    """The plan of least recompute whose predicted peak activation bytes fit ``budget_bytes``.

    The budget covers the whole step's activations as the family's chain counts them (for a GPT,
    :func:`jaxremat.models.gpt.activation.predict_peak_activation_bytes`; for a BERT encoder the
    stack only: its ``fixed_bytes`` are 0); the result's ``peak_bytes`` is on the same scale.

    Example::

        r = plan_model(cfg, 8, 64, budget_bytes=6 * 2**20)
        loss = loss_fn(params, tokens, cfg, r.plan)  # remat_scan takes the plan as its schedule

    Args:
        cfg, batch, seq: the model and the batch's shape (B, T).
        budget_bytes: peak activation bytes allowed (int).
        policies: the menu's checkpoint options (:data:`DEFAULT_MENU`).
        **kw: passed to :func:`jaxremat.spec.planner.plan_for_budget` (``resolution``,
            ``min_checkpoint_length``).

    Raises:
        jaxremat.spec.planner.NoPlanFits: no plan fits (its message gives the least achievable
            peak, and a plan reaching it).
        ValueError: as :func:`model_chain`, or a negative budget.
    """
    return plan_chain(model_chain(cfg, batch, seq, policies), budget_bytes, **kw)


def plan_gpt(cfg: TransformerConfig, batch: int, seq: int, budget_bytes: int,
             policies: Sequence = DEFAULT_MENU, **kw) -> PlannerResult:
    """:func:`plan_model` for a GPT (raises ValueError for another family)."""
    _gpt_block(cfg, batch, seq)
    return plan_model(cfg, batch, seq, budget_bytes, policies, **kw)
