"""JAX training over a sequence of batches: the fine-tuning run's steps (:meth:`parity.runners.jax_framework.JaxFramework.train`).

Each step is the suite's training step (:meth:`parity.runners.jax_runner.Programs.train_step`'s two
programs: the compiled loss+gradient step, then the one AdamW update), on the step's batch, with
the dropout key ``fold_in(key(seed), step)``. Under ``jit`` the loss+gradient program is the one the
suite compiles for this (cfg, plan, batch shape) (:func:`parity.runners.jax_runner.compiled_value_and_grad`),
so its memory is measured by the one JAX measurement path on that executable.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxremat.models import TransformerConfig, check_params, get_model
from jaxremat.spec.plan import RematPlan

from parity.runners import jax_runner
from parity.runners.framework import RunOptions
from parity.runners.jax_memory import measure_jax
from parity.runners.result import TrainRun


def train_plan(mode: str, cfg: TransformerConfig, params: dict[str, np.ndarray], batches: Sequence[np.ndarray],
               plan: RematPlan, options: RunOptions, on_step: Callable[[int, float, float], None] | None = None
               ) -> TrainRun:
    """Train ``plan`` for ``len(batches)`` AdamW steps, one batch per step.

    Args:
        mode: ``"jit"`` or ``"eager"``.
        cfg, params: the model and its canonical starting weights (``cfg.dtype``).
        batches: token batches of one shape (each ``(B, T+1)`` GPT ids, ``(B, T)`` BERT padded pairs).
        plan: the remat plan.
        options: ``hparams`` (AdamW), ``seed`` (dropout), ``with_memory`` (measure one step's memory
            after the last step).
        on_step: called after each step with ``(step, loss, step_time_s)``.

    Returns:
        :class:`parity.runners.result.TrainRun`.

    Raises:
        ValueError: an unknown mode, no batches, batches of different shapes, bad parameters or tokens.
    """
    if mode not in jax_runner.MODES:
        raise ValueError(f"mode must be one of {jax_runner.MODES}, got {mode!r}")
    batches = [np.asarray(b) for b in batches]
    if not batches or len({b.shape for b in batches}) != 1:
        raise ValueError(f"need at least one batch, all of one shape; got shapes {sorted({b.shape for b in batches})}")
    check_params(cfg, params)
    spec = get_model(cfg.arch)
    for b in batches:
        if spec.jax_check_batch is not None:
            spec.load("jax_check_batch")(b, cfg)
    with jax_runner.float64_context(cfg):
        return _train(mode, cfg, params, batches, plan, options, on_step)


def _train(mode, cfg, params_np, batches, plan, options: RunOptions, on_step) -> TrainRun:
    hparams = options.hparams
    progs = jax_runner.programs(cfg, plan, hparams)
    base_key = jax.random.key(options.seed) if cfg.dropout > 0 else None
    eager = mode == "eager"
    compiled = jax_runner.compiled_value_and_grad(cfg, plan, hparams, batches[0].shape, base_key is not None)
    vg = progs.value_and_grad if eager else compiled
    apply = progs.apply_adamw if eager else progs.apply_adamw_jit
    params = {k: jnp.asarray(v) for k, v in params_np.items()}
    losses, times = [], []
    with jax.disable_jit() if eager else contextlib.nullcontext():
        opt_state = progs.init_opt(params)
        for i, batch in enumerate(batches):
            key = None if base_key is None else jax.random.fold_in(base_key, i)
            tokens = jnp.asarray(batch, dtype=jnp.int32)
            t0 = time.perf_counter()
            loss, grads = vg(params, tokens, key)
            params, opt_state = jax.block_until_ready(apply(grads, opt_state, params))
            times.append(time.perf_counter() - t0)
            losses.append(np.asarray(loss))
            if on_step is not None:
                on_step(i, float(losses[-1]), times[-1])
    memory = None
    if options.with_memory:
        tokens = jnp.asarray(batches[-1], dtype=jnp.int32)
        key = None if base_key is None else jax.random.fold_in(base_key, len(batches) - 1)
        memory = measure_jax(lambda p: jax_runner.objective(cfg)(p, tokens, cfg, plan, key), params, compiled)
    return TrainRun(losses=np.stack(losses), trained={k: np.asarray(v) for k, v in params.items()},
                    step_times_s=tuple(float(t) for t in times), memory=memory, mode=mode)
