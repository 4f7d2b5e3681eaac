"""The JAX estimate of a model's training step at any size, nothing allocated (imports JAX, not PyTorch).

:func:`estimate_plans` compiles ``jit(value_and_grad(loss))`` of the family's loss
(:attr:`jaxremat.models.ModelSpec.jax_loss`) for the present backend from ``jax.ShapeDtypeStruct``
parameters and tokens, one program per plan (:func:`jaxremat.estimate.estimate`), and reads XLA's
buffer assignment. Per plan (:data:`parity.runners.estimate_budget.ROW_KEYS`):

* parameters: the parameter arguments; gradients: the gradient outputs (both ``cfg.dtype``, float32);
* AdamW state: two float32 moments per parameter and optax's int32 step count, resident beside the
  step (optax's ``adamw`` state; not part of the ``value_and_grad`` program);
* activation peak: the compiled peak (``argument + output + temp - alias``) less parameters and
  gradients, as :func:`parity.runners.jax_memory.measure_jax` defines it for measured runs;
* total peak: the compiled peak plus the AdamW state;
* recompute FLOPs: from the planner's per-block menus (:func:`jaxremat.planner.model_chain`: XLA's
  cost analysis of one block, checkpointed less plain) times the blocks the plan recomputes. XLA's
  cost analysis of the whole program cannot give it: a loop's body is counted once, whatever its
  trip count (measured: the same FLOPs at 4 and 8 layers).

:func:`check_plans` compiles the same programs from concrete arrays at a shape that runs here and
compares the buffer sizes with the abstract compile's, field by field (equal to the byte).
:func:`host_bytes_needed` is what compiling needs of this machine's memory (measured, see its
docstring); :func:`estimate_plans` refuses a shape that would need more than is available.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxremat.estimate import PlanEstimate, compile_plan, estimate
from jaxremat.memory import compiled_stats
from jaxremat.models import TransformerConfig, get_model, init_params, param_shapes
from jaxremat.planner import DEFAULT_MENU, model_chain
from jaxremat.spec.plan import RematPlan, parse_plan

from parity.report.environment import available_memory_bytes
from parity.runners.estimate_budget import (add_ratios, as_budget, budget_row, chain_policies, check_reachable,
                                            plan_within_budget, recompute_flops)

__all__ = ["HOST_BASE_BYTES", "check_plans", "estimate_plans", "host_bytes_needed"]

HOST_BASE_BYTES = 1 << 30
"""Host memory one compile needs whatever the shape: measured peak resident memory of the process 0.45 GB at
gpt-1.3b and 0.32 GB at gpt-small (JAX, XLA:CPU, the scanned stack's program does not grow with depth);
1 GiB leaves room for the largest plans' programs."""


def _abstract_inputs(cfg: TransformerConfig, batch: int, seq: int) -> tuple[dict, jax.ShapeDtypeStruct]:
    params = {k: jax.ShapeDtypeStruct(s, jnp.dtype(cfg.dtype)) for k, s in param_shapes(cfg).items()}
    width = seq + 1 if get_model(cfg.arch).batch == "windows" else seq
    return params, jax.ShapeDtypeStruct((batch, width), jnp.int32)


def _loss(cfg: TransformerConfig):
    family_loss = get_model(cfg.arch).load("jax_loss")
    return lambda plan, params, tokens: family_loss(params, tokens, cfg, plan.schedule, policy=plan.policy)


def host_bytes_needed(cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Host memory (bytes) the compiles of :func:`estimate_plans` need: :data:`HOST_BASE_BYTES`, plus the
    causal mask's (T, T) booleans in case XLA folds it into a constant (it builds it from an iota)."""
    return HOST_BASE_BYTES + seq * seq


def _check_host(cfg: TransformerConfig, batch: int, seq: int) -> None:
    need, have = host_bytes_needed(cfg, batch, seq), available_memory_bytes()
    if have is not None and need > 0.9 * have:
        raise ValueError(f"compiling this JAX estimate needs about {need / 2**30:.1f} GiB of host memory but "
                         f"{have / 2**30:.1f} GiB is available; shrink the sequence or free memory")


def _row(est: PlanEstimate, param_bytes: int, adamw_bytes: int, flops) -> dict:
    return {"framework": "jax", "plan": est.plan, "parameters_bytes": param_bytes, "gradients_bytes": param_bytes,
            "adamw_state_bytes": adamw_bytes, "activation_peak_bytes": est.peak_bytes - 2 * param_bytes,
            "total_peak_bytes": est.peak_bytes + adamw_bytes, "ratio_to_none": None, "recompute_flops": flops,
            "backend": f"{est.backend} of jit(value_and_grad(loss)), abstract arguments",
            "compile_time_s": est.compile_time_s}


def estimate_plans(cfg: TransformerConfig, batch_size: int, seq_len: int, plans, *, budget=None,
                   menu=DEFAULT_MENU) -> list[dict]:
    """One row per plan of the JAX training step at ``cfg`` and (B, T), nothing allocated (module docstring).

    Args:
        cfg: the model (``dtype`` float32; ``compute_dtype="bfloat16"`` for mixed precision).
        batch_size, seq_len: B and T.
        plans: plan names or :class:`jaxremat.spec.plan.RematPlan` values; ``none`` is estimated
            first whether listed or not (the ratios' reference) and its row comes first.
        budget: None, or bytes / ``"24GiB"`` / ``"50%"`` (of ``none``'s total peak): the planner's
            plan for it is added last, checked on its own compiled estimate
            (:func:`parity.runners.estimate_budget.plan_within_budget`).
        menu: the planner's checkpoint options for a budget (:data:`jaxremat.planner.DEFAULT_MENU`); without
            a budget the chain holds the plans' own policies only (for their recompute FLOPs).

    Returns:
        One dict per plan, keys :data:`parity.runners.estimate_budget.ROW_KEYS` (the budget plan's
        adds ``budget``).

    Raises:
        ValueError: a bad plan or one invalid at ``cfg.n_layer``, a bad budget or one below anything
            a plan reaches (a bytes budget before any compile), or a compile that needs more host
            memory than is available.
    """
    parsed = [parse_plan("none")] + [p for p in (parse_plan(x) for x in plans) if p.name != "none"]
    for p in parsed:
        p.segments_for(cfg.n_layer)  # a plan invalid at this depth fails before any compile
    b = as_budget(budget) if budget is not None else None
    _check_host(cfg, batch_size, seq_len)
    chain = model_chain(cfg, batch_size, seq_len, chain_policies(parsed, menu if b is not None else ()))
    param_bytes = sum(int(np.prod(s)) for s in param_shapes(cfg).values()) * jnp.dtype(cfg.dtype).itemsize
    adamw_bytes = 2 * param_bytes + 4
    if b is not None and b.bytes is not None:
        check_reachable(b.bytes, 2 * param_bytes + adamw_bytes, chain, "jax", what=b.text)
    params, tokens = _abstract_inputs(cfg, batch_size, seq_len)
    loss = _loss(cfg)

    def measure(plan: RematPlan) -> dict:
        est = estimate(loss, params, tokens, plans=[plan])[0]
        return _row(est, param_bytes, adamw_bytes, recompute_flops(chain, plan, cfg.n_layer))

    rows = [measure(p) for p in parsed]
    if b is not None:
        rows.append(budget_row(rows, lambda: plan_within_budget(b, rows[0], chain, cfg.n_layer, measure, "jax")))
    return add_ratios(rows)


def check_plans(cfg: TransformerConfig, batch_size: int, seq_len: int, plans) -> list[dict]:
    """The abstract compile against a concrete one, per plan, at a shape that runs here.

    Returns:
        One dict per plan: ``plan``, ``abstract`` and ``concrete`` (the compiled buffer sizes,
        :func:`jaxremat.memory.compiled_stats` less its source) and ``equal`` (every field equal).

    Raises:
        ValueError: a bad plan.
    """
    parsed = [parse_plan(p) for p in plans]
    params_abs, tokens_abs = _abstract_inputs(cfg, batch_size, seq_len)
    params = {k: jnp.asarray(v) for k, v in init_params(cfg, seed=0).items()}
    width = tokens_abs.shape[1]
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, cfg.vocab_size, (batch_size, width)), jnp.int32)
    loss, out = _loss(cfg), []
    for plan in parsed:
        stats = [{k: v for k, v in compiled_stats(compile_plan(loss, plan, args)[0]).items() if k != "source"}
                 for args in ((params_abs, tokens_abs), (params, tokens))]
        out.append({"plan": plan.name, "abstract": stats[0], "concrete": stats[1], "equal": stats[0] == stats[1]})
    return out
