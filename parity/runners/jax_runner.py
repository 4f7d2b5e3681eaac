"""The JAX side of the parity harness: one plan, one batch, every measurement.

:func:`run_plan` is what :meth:`parity.runners.jax_framework.JaxFramework.run_plan` runs, in two modes:

* ``"jit"`` -- loss+gradients, the AdamW update and the reverse loop each run as one ``jax.jit``
  program (a training step is the first two in turn; see :meth:`Programs.train_step`). Jitted functions are cached per ``(cfg, plan, hparams)`` (:func:`programs`) and
  ``jax.jit`` caches their executables per input shapes, so repeated calls do not recompile.
* ``"eager"`` -- the same Python functions op by op under ``jax.disable_jit()`` (``lax.scan``
  then runs as a Python loop, every primitive dispatched on its own).

Memory is measured the same way in both modes, by the one JAX measurement path
(:func:`parity.runners.jax_memory.measure_jax`): saved residuals of ``loss_fn`` (a jaxpr-level
count) and XLA's compiled buffer sizes of the jitted loss+gradient step (the executable that
runs), plus the allocator's peak on a GPU.

For ``cfg.dtype == "float64"`` the whole run happens inside ``jax.enable_x64(True)`` and the
result dtypes are asserted, so float64 really runs in float64.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxremat.models import TransformerConfig, check_params, get_model, param_shapes
from jaxremat.spec.plan import RematPlan
from jaxremat.survival import count_dots

from parity.inputs.train import AdamWConfig
from parity.runners.framework import FRAMEWORKS, RunOptions
from parity.runners.jax_memory import measure_jax
from parity.runners.result import RunResult, TrainingStep, digest

MODES = FRAMEWORKS["jax"].modes


def objective(cfg: TransformerConfig):
    """The loss function of ``cfg``'s family, ``(params, tokens, cfg, plan, key) -> loss``.

    Its :attr:`jaxremat.models.ModelSpec.jax_loss`: GPT next-token cross-entropy
    (:func:`jaxremat.model.loss_fn`), BERT the contrastive sentence-embedding loss
    (:func:`jaxremat.encoder.loss_fn`).
    """
    return get_model(cfg.arch).load("jax_loss")


def _reverse_loop_fn(cfg: TransformerConfig):
    """The hand-rolled reverse segment loop of ``cfg``'s family (:attr:`jaxremat.models.ModelSpec.jax_reverse_loop`)."""
    return get_model(cfg.arch).load("jax_reverse_loop")


@dataclasses.dataclass(frozen=True)
class Programs:
    """The functions of one (cfg, plan, hparams): plain (for eager mode) and jitted."""

    value_and_grad: Any
    apply_adamw: Any
    reverse_loop: Any
    init_opt: Any
    value_and_grad_jit: Any
    apply_adamw_jit: Any
    reverse_loop_jit: Any

    def train_step(self, params, opt_state, tokens, key, *, value_and_grad, jit: bool):
        """One AdamW step as two programs: loss+gradients, then the optimizer update.

        Kept apart on purpose: compiled as one program, XLA fuses the end of the backward pass
        into the update differently per schedule. Measured at gpt-tiny (N=4, D=32): every_k(2)
        gave bitwise gradients but weights 16384 ULP apart after 3 fused steps, because AdamW's
        ``m / sqrt(v)`` turns a 1-ULP difference in a gradient that is zero in exact arithmetic
        (the key bias: softmax ignores a shift of all scores) into a full-size step. Split, the
        trained weights are bitwise exactly when the gradients are.
        """
        params, opt_state, _ = self.train_step_with_grads(params, opt_state, tokens, key,
                                                          value_and_grad=value_and_grad, jit=jit)
        return params, opt_state

    def train_step_with_grads(self, params, opt_state, tokens, key, *, value_and_grad, jit: bool):
        """:meth:`train_step` that also returns the step's gradients: ``(params, opt_state, grads)``."""
        apply = self.apply_adamw_jit if jit else self.apply_adamw
        _, grads = value_and_grad(params, tokens, key)
        return (*apply(grads, opt_state, params), grads)


@functools.lru_cache(maxsize=16)
def adamw(hparams: AdamWConfig):
    """``(init, apply, apply_jit)`` of one AdamW update, shared by every plan, model and case set.

    ``apply(grads, opt_state, params) -> (params, opt_state)`` is ``optax.adamw`` then
    ``optax.apply_updates`` (:class:`parity.inputs.train.AdamWConfig`'s settings). The update does
    not depend on the plan, so one ``jax.jit`` object serves them all: it compiles once per
    parameter shapes and dtype (not once per plan), and every plan's training runs the same
    executable on its gradients.
    """
    tx = optimizer(hparams)

    def apply_adamw(grads, opt_state, params):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return tx.init, apply_adamw, jax.jit(apply_adamw)


def optimizer(hparams: AdamWConfig) -> optax.GradientTransformation:
    """The harness's ``optax.adamw`` (the one JAX optimizer; the distributed and frozen runs build on it)."""
    return optax.adamw(hparams.learning_rate, b1=hparams.b1, b2=hparams.b2, eps=hparams.eps,
                       weight_decay=hparams.weight_decay)


@functools.lru_cache(maxsize=64)
def programs(cfg: TransformerConfig, plan: RematPlan, hparams: AdamWConfig) -> Programs:
    """Build (once per key) the loss+grad and reverse-loop functions; the AdamW update is :func:`adamw`'s."""
    loss = objective(cfg)
    init_opt, apply_adamw, apply_adamw_jit = adamw(hparams)

    def value_and_grad(params, tokens, key):
        return jax.value_and_grad(loss)(params, tokens, cfg, plan, key)

    def reverse_loop(params, tokens, key):
        return _reverse_loop_fn(cfg)(params, tokens, cfg, plan.schedule, key)

    return Programs(value_and_grad, apply_adamw, reverse_loop, init_opt,
                     jax.jit(value_and_grad), apply_adamw_jit, jax.jit(reverse_loop))


def compiled_value_and_grad(cfg: TransformerConfig, plan: RematPlan, hparams: AdamWConfig, tokens_shape,
                             has_key: bool):
    """The jitted loss+grad step compiled ahead of time: :func:`compiled_step` (``hparams`` play no part in it).

    The same executable runs the jit-mode gradients and training steps and gives the compiled
    memory analysis, so each plan's program is compiled once (compiling costs seconds here).
    """
    return compiled_step(cfg, plan, tuple(tokens_shape), has_key)


@functools.lru_cache(maxsize=64)
def compiled_step(cfg: TransformerConfig, plan: RematPlan, tokens_shape: tuple, has_key: bool):
    """``jit(value_and_grad(loss))`` of ``cfg``'s family compiled ahead of time for ``(params, tokens, key)``,
    once per (model, plan, token shape, dropout key or None) in a process: the cases' runs and
    :meth:`parity.runners.jax_framework.JaxFramework.time_steps` share it."""
    loss = objective(cfg)

    def value_and_grad(params, tokens, key):
        return jax.value_and_grad(loss)(params, tokens, cfg, plan, key)

    params = {k: jax.ShapeDtypeStruct(v, jnp.dtype(cfg.dtype)) for k, v in param_shapes(cfg).items()}
    tokens = jax.ShapeDtypeStruct(tokens_shape, jnp.int32)
    key = jax.random.key(0) if has_key else None
    return jax.jit(value_and_grad).lower(params, tokens, key).compile()


_MEMORY: collections.OrderedDict = collections.OrderedDict()
_MEMORY_SIZE = 64


def _measured_memory(cfg, plan, params, tokens, key, compiled_vg, progs):
    """:func:`measure_jax` of ``plan``'s compiled loss+gradient step, measured once per (model, plan, token
    shape, dropout key or None) in a process: the jit case and the op-by-op case of a plan report the same
    measurement.

    Both modes measure the same thing: the residuals of the same loss, traced outside
    ``jax.disable_jit`` on arguments of the same shapes and dtypes, and the memory analysis of the same
    executable (:func:`compiled_step`, which both modes compile once). Tracing the residuals again cost
    ~0.5 s per plan and mode at gpt-tiny. The token values and the key's value play no part in it.
    """
    cache_key = (cfg, plan, tuple(tokens.shape), key is not None)
    if cache_key not in _MEMORY:
        _MEMORY[cache_key] = measure_jax(lambda p: objective(cfg)(p, tokens, cfg, plan, key), params, compiled_vg,
                                         device_step=lambda: progs.value_and_grad_jit(params, tokens, key))
        while len(_MEMORY) > _MEMORY_SIZE:
            _MEMORY.popitem(last=False)
    return _MEMORY[cache_key]


def _to_numpy(tree) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in tree.items()}


def _check_dtypes(cfg: TransformerConfig, what: str, tree: dict) -> None:
    for k, v in tree.items():
        if np.asarray(v).dtype != np.dtype(cfg.dtype):
            raise RuntimeError(f"{what}[{k!r}] came out as {np.asarray(v).dtype}, expected {cfg.dtype}")


def run_plan(mode: str, cfg: TransformerConfig, params: dict[str, np.ndarray], tokens: np.ndarray, plan: RematPlan,
             options: RunOptions) -> RunResult:
    """Loss, gradients, training, residual and peak memory, and step time of one remat plan.

    Args:
        mode: ``"jit"`` or ``"eager"`` (op by op under ``jax.disable_jit()``).
        cfg: model configuration.
        params: canonical parameters (:func:`jaxremat.models.param_shapes`, ``cfg.dtype``).
        tokens: ``(B, T+1)`` integer token ids; inputs ``tokens[:, :-1]``, targets ``tokens[:, 1:]``.
        plan: the remat plan (schedule and policy), handed whole to the model's loss
            (:func:`jaxremat.render.remat_scan` reads it).
        options: :class:`parity.runners.framework.RunOptions`: ``hparams`` (``optax.adamw``
            settings and training steps), ``timing_repeats`` (timed steps after one warm-up,
            >= 1), ``with_reverse_loop`` (also run :func:`jaxremat.reverse_loop.reverse_loop_value_and_grad`,
            only when the plan has a checkpointed segment and no policy), ``with_training`` (the
            AdamW steps and the timed steps; the harness skips them op by op, where a step costs a
            second of Python dispatch and its time says nothing about remat), ``with_memory``
            and ``seed`` (dropout keys come from ``jax.random.key(seed)`` when ``cfg.dropout > 0``:
            the loss and gradients use it directly, training step i uses ``fold_in(key, i)``).

    Returns:
        :class:`parity.runners.result.RunResult`: ``loss``, ``grads``, ``trained`` (None without
        training), ``mode``, ``reverse_loop_grads`` (None when not run), ``memory``
        (:func:`parity.runners.jax_memory.measure_jax` of the compiled loss+grad step, in both
        modes: saved and offloaded residual bytes, XLA's peak and its breakdown, peak activation,
        the device peak on a GPU), ``step_time_s``/``step_times_s`` (median and every timed
        training step -- loss+gradients then the AdamW update -- ``time.perf_counter`` around
        ``block_until_ready``; None without training) and ``dots_compiled`` (matrix products in
        the compiled program's text: recompute present or merged away).

    Raises:
        ValueError: unknown mode, ``timing_repeats < 1``, bad parameters or tokens.
        RuntimeError: a result did not come out in ``cfg.dtype``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if options.timing_repeats < 1:
        raise ValueError(f"timing_repeats must be >= 1, got {options.timing_repeats}")
    check_params(cfg, params)
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be an integer array of shape (B, T+1), got {tokens.dtype} {tokens.shape}")
    spec = get_model(cfg.arch)
    if spec.jax_check_batch is not None:  # ids and length checked here: under jit they are traced
        spec.load("jax_check_batch")(tokens, cfg)
    with float64_context(cfg):
        return _run(mode, cfg, params, tokens, plan, options)


def float64_context(cfg: TransformerConfig):
    """``jax.enable_x64(True)`` for a float64 model (so float64 really runs in float64), else a null context."""
    return jax.enable_x64(True) if cfg.dtype == "float64" else contextlib.nullcontext()


def _run(mode, cfg, params_np, tokens_np, plan, options: RunOptions) -> RunResult:
    hparams = options.hparams
    progs = programs(cfg, plan, hparams)
    params = {k: jnp.asarray(v) for k, v in params_np.items()}
    _check_dtypes(cfg, "params", params)
    tokens = jnp.asarray(tokens_np, dtype=jnp.int32)
    key = jax.random.key(options.seed) if cfg.dropout > 0 else None
    step_key = (lambda i: jax.random.fold_in(key, i)) if key is not None else (lambda i: None)
    eager = mode == "eager"
    run_ctx = jax.disable_jit if eager else contextlib.nullcontext
    compiled_vg = compiled_value_and_grad(cfg, plan, hparams, tuple(tokens.shape), key is not None)
    vg = progs.value_and_grad if eager else compiled_vg
    step = functools.partial(progs.train_step, value_and_grad=vg, jit=not eager)
    reverse = progs.reverse_loop if eager else progs.reverse_loop_jit

    with run_ctx():
        loss, grads = jax.block_until_ready(vg(params, tokens, key))
    loss_np, grads_np = np.asarray(loss), _to_numpy(grads)
    _check_dtypes(cfg, "grads", {"loss": loss_np, **grads_np})

    reverse_grads = None
    segs = plan.segments_for(cfg.n_layer)
    if options.with_reverse_loop and plan.saves_nothing and any(s.checkpointed for s in segs):
        with run_ctx():
            _, rl_grads = jax.block_until_ready(reverse(params, tokens, key))
        reverse_grads = _to_numpy(rl_grads)

    memory = None
    if options.with_memory:
        memory = _measured_memory(cfg, plan, params, tokens, key, compiled_vg, progs)
    result = RunResult(loss=loss_np, grads=grads_np, trained=None, mode=mode, reverse_loop_grads=reverse_grads,
                       memory=memory, dots_compiled=count_dots(compiled_vg.as_text(), optimized=True))
    if not options.with_training:
        return result
    with run_ctx():
        p, opt_state, steps = params, progs.init_opt(params), []
        for i in range(hparams.steps):
            p, opt_state, g = progs.train_step_with_grads(p, opt_state, tokens, step_key(i), value_and_grad=vg,
                                                          jit=not eager)
            steps.append(TrainingStep(grads=digest(np.asarray(g[k]) for k in p),
                                      weights=digest(np.asarray(v) for v in p.values())))
        trained = _to_numpy(jax.block_until_ready(p))
        _check_dtypes(cfg, "trained", trained)

        if not eager:  # warm-up: the first call of the AdamW update compiles it
            p, opt_state = jax.block_until_ready(step(params, progs.init_opt(params), tokens, step_key(0)))
        times = []
        for r in range(options.timing_repeats):
            t0 = time.perf_counter()
            p, opt_state = jax.block_until_ready(step(p, opt_state, tokens, step_key(1 + r)))
            times.append(time.perf_counter() - t0)
    return dataclasses.replace(result, trained=trained, step_time_s=float(statistics.median(times)),
                               step_times_s=tuple(float(t) for t in times), training_steps=tuple(steps))
