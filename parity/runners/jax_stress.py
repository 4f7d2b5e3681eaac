"""The JAX halves of the stress variants: the frozen GPT and the user-style block stack.

What each variant is, and how it is checked, is framework-neutral and lives with the case set
(:mod:`parity.cases.stress_frozen`, :mod:`parity.cases.stress_user`); this module runs them in JAX.

* frozen: JAX has no flag on an array, so the frozen parts pass through ``lax.stop_gradient``
  (their gradient is exactly zero) and the optimizer update is masked (the harness's
  ``optax.adamw``, :func:`parity.runners.jax_runner.optimizer`, followed by a per-row mask, so
  frozen rows of a stacked ``h.*`` tensor do not move, weight decay included).
* user stack: the stack's block in plain JAX and Flax ``linen.BatchNorm``, run by
  :func:`jaxremat.render.remat_scan` with the running statistics carried out ``with_outputs=True``
  and per-layer dropout keys as scanned ``xs``; plain SGD.
"""

from __future__ import annotations

import contextlib
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxremat.model import loss_fn
from jaxremat.render import remat_scan
from jaxremat.spec.plan import RematPlan

from parity.cases.stress_frozen import trainable_mask
from parity.cases.stress_user import UserStack
from parity.inputs.train import AdamWConfig
from parity.runners.jax_runner import optimizer
from parity.runners.result import RunResult


def run_frozen(mode: str, cfg, params, tokens, plan: RematPlan, hparams: AdamWConfig) -> RunResult:
    """Loss, full gradients (zero where frozen) and trained weights of the frozen GPT in JAX.

    Returns:
        :class:`parity.runners.result.RunResult` with ``loss``, ``grads``, ``trained`` and ``mode``
        (``memory`` None: not measured; ``frozen_grads_none`` None: JAX has no None gradient,
        frozen entries are checked for zero).
    """
    np_mask = trainable_mask(cfg)
    mask = {k: jnp.asarray(v) for k, v in np_mask.items()}

    def frozen_loss(p, toks):
        p = {k: v if bool(np.all(np_mask[k])) else jnp.where(mask[k], v, jax.lax.stop_gradient(v))
             for k, v in p.items()}
        return loss_fn(p, toks, cfg, plan)

    tx = optimizer(hparams)

    def update(grads, state, p):
        updates, state = tx.update(grads, state, p)
        updates = {k: u * mask[k].astype(u.dtype) for k, u in updates.items()}  # frozen rows: + 0
        return optax.apply_updates(p, updates), state

    vg = jax.value_and_grad(frozen_loss)
    if mode == "jit":
        vg, update = jax.jit(vg), jax.jit(update)
    with jax.disable_jit() if mode == "eager" else contextlib.nullcontext():
        p = {k: jnp.asarray(v) for k, v in params.items()}
        toks = jnp.asarray(tokens, jnp.int32)
        loss, grads = vg(p, toks)
        loss, grads = np.asarray(loss), {k: np.asarray(v) for k, v in grads.items()}
        state = tx.init(p)
        for _ in range(hparams.steps):
            _, g = vg(p, toks)
            p, state = update(g, state, p)
        trained = {k: np.asarray(v) for k, v in p.items()}
    return RunResult(loss=loss, grads=grads, trained=trained, mode=mode)


def run_user_stack(mode: str, stack: UserStack, plan: RematPlan) -> RunResult:
    """Train the stack in JAX under ``plan`` (``jit`` or op by op); see :mod:`parity.cases.stress_user`.

    Returns:
        :class:`parity.runners.result.RunResult`: the first step's ``loss`` and ``grads``, the
        ``trained`` weights, ``mode`` and ``state`` (``running_mean``, ``running_var``, ``count``:
        (N, D), (N, D), (N,) float32; ``{}`` without running statistics); ``memory`` None.
    """
    jit = mode == "jit"
    grad_fn, sgd = _user_programs(stack, plan, jit)
    N, D = stack.n_layer, stack.d_model
    params = {k: jnp.asarray(v) for k, v in stack.params().items()}
    stats = {"batch_stats": {"mean": jnp.zeros((N, D)), "var": jnp.ones((N, D))}, "count": jnp.zeros((N,))} \
        if stack.running_stats else None
    base_key = jax.random.key(stack.seed) if stack.random else None
    out = {}
    with jax.disable_jit() if not jit else contextlib.nullcontext():
        for i, x in enumerate(stack.batches()):
            key = jax.random.fold_in(base_key, i) if base_key is not None else None
            (loss_val, stats), grads = grad_fn(params, stats, jnp.asarray(x), key)
            if i == 0:
                out["loss"], out["grads"] = np.asarray(loss_val), {k: np.asarray(v) for k, v in grads.items()}
            params = sgd(params, grads)
    state = {} if stats is None else {
        "running_mean": np.asarray(stats["batch_stats"]["mean"]), "running_var": np.asarray(stats["batch_stats"]["var"]),
        "count": np.asarray(stats["count"])}
    return RunResult(loss=out["loss"], grads=out["grads"], trained={k: np.asarray(v) for k, v in params.items()},
                     mode=mode, state=state)


@functools.lru_cache(maxsize=32)
def _user_programs(stack: UserStack, plan: RematPlan, jit: bool):
    """``(value_and_grad, sgd)`` of the stack, built (and jitted) once per key."""
    bn = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)
    N, D = stack.n_layer, stack.d_model

    def block_fn(p, x, xs):
        stats, key = xs
        B, T, _ = x.shape
        h, new_stats = x, stats
        if stack.running_stats:
            h, upd = bn.apply({"params": {"scale": p["bn.scale"], "bias": p["bn.bias"]},
                               "batch_stats": stats["batch_stats"]}, x.reshape(B * T, D), mutable=["batch_stats"])
            h = h.reshape(B, T, D)
            new_stats = {"batch_stats": upd["batch_stats"], "count": stats["count"] + 1}
        m = jax.nn.gelu(h @ p["w1"] + p["b1"]) @ p["w2"]
        if key is not None:
            k_noise, k_drop = jax.random.split(key)
            if stack.noise:
                m = m * (1.0 + stack.noise * jax.random.normal(k_noise, m.shape, m.dtype))
        m = m + p["b2"]
        if key is not None and stack.dropout:
            keep = jax.random.bernoulli(k_drop, 1.0 - stack.dropout, m.shape)
            m = jnp.where(keep, m / (1.0 - stack.dropout), jnp.zeros_like(m))
        return x + m, new_stats

    def loss(params, stats, x, key):
        keys = jax.random.split(key, N) if key is not None else None
        y, new_stats = remat_scan(block_fn, params, x, plan, xs=(stats, keys), with_outputs=True)
        return jnp.mean(jnp.square(y)), new_stats

    grad_fn = jax.value_and_grad(loss, has_aux=True)
    sgd = lambda p, g: jax.tree_util.tree_map(lambda a, b: a - stack.lr * b, p, g)  # noqa: E731
    return (jax.jit(grad_fn), jax.jit(sgd)) if jit else (grad_fn, sgd)
