"""The PyTorch side of the parity harness: one plan, one batch, every measurement.

:func:`run_plan` is what :meth:`parity.runners.torch_framework.TorchFramework.run_plan` runs (eager
mode, the only one). Every measurement starts from a fresh model built from the same canonical parameters, so
that no measurement disturbs another (the timed steps and the peak step train their own copies).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np
import torch

from jaxremat.models import TransformerConfig, get_model
from jaxremat.spec.plan import RematPlan

from parity.inputs.train import AdamWConfig
from parity.runners.framework import FRAMEWORKS, RunOptions
from parity.runners.result import RunResult, TrainingStep, digest
from parity.runners.torch_memory import measure_torch

MODES = FRAMEWORKS["torch"].modes


def model_and_loss(cfg: TransformerConfig):
    """Model class, loss and reverse loop of ``cfg``'s family (GPT: next-token; BERT: contrastive).

    Its :class:`jaxremat.models.ModelSpec`'s ``torch_model``, ``torch_loss`` and ``torch_reverse_loop``.
    """
    spec = get_model(cfg.arch)
    return spec.load("torch_model"), spec.load("torch_loss"), spec.load("torch_reverse_loop")


def adamw(params, hparams: AdamWConfig) -> torch.optim.AdamW:
    """The harness's ``torch.optim.AdamW`` over ``params`` (the one PyTorch optimizer; the frozen and
    distributed runs build theirs here too)."""
    return torch.optim.AdamW(params, lr=hparams.learning_rate, betas=(hparams.b1, hparams.b2), eps=hparams.eps,
                             weight_decay=hparams.weight_decay)


def _grad_step(model: torch.nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, plan: RematPlan,
               seed: int) -> None:
    opt.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    model_and_loss(model.cfg)[1](model, tokens, plan).backward()


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, plan: RematPlan,
                seed: int) -> None:
    _grad_step(model, opt, tokens, plan, seed)
    opt.step()


def _recorded_step(model: torch.nn.Module) -> TrainingStep:
    """The step just taken: digests of its gradients and of the updated weights, and the intra-op threads."""
    params = list(model.parameters())
    return TrainingStep(grads=digest(p.grad.detach().numpy() for p in params if p.grad is not None),
                        weights=digest(p.detach().numpy() for p in params), threads=torch.get_num_threads())


def step_memory(cfg: TransformerConfig, params: dict[str, np.ndarray], model: torch.nn.Module,
                opt: torch.optim.Optimizer, tokens: torch.Tensor, plan: RematPlan, seed: int):
    """The memory of one step of ``model`` (:func:`parity.runners.torch_memory.measure_torch`), then the step.

    Saved bytes are those of one forward pass of a fresh model built from ``params``; the peak is that of
    one forward and backward pass of ``model`` with ``opt``'s AdamW state already allocated, as JAX measures
    ``value_and_grad``: AdamW's own step allocates foreach temporaries of the parameters' size, which at a
    large vocabulary (MiniLM: 90 MB of parameters) could be the peak and leave no activation in it, so the
    optimizer step runs right after, outside the measurement.
    """
    Model, model_loss, _ = model_and_loss(cfg)
    saved_model = Model.from_params(cfg, params)

    def forward(sac, on_checkpoint_input):
        torch.manual_seed(seed)
        return model_loss(saved_model, tokens, plan.schedule, policy=sac, on_checkpoint_input=on_checkpoint_input)

    memory = measure_torch(forward, lambda: _grad_step(model, opt, tokens, plan, seed),
                           exclude=[*saved_model.parameters(), *saved_model.buffers()], tracked=(model, opt),
                           policy=plan.policy)
    opt.step()
    return memory


def token_tensor(tokens: np.ndarray) -> torch.Tensor:
    """``(B, T+1)`` integer ids as a fresh, writable int64 tensor.

    Raises:
        ValueError: the ids are not integers.
    """
    tokens = np.asarray(tokens)
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be an integer array of shape (B, T+1), got dtype {tokens.dtype}")
    return torch.from_numpy(np.array(tokens, dtype=np.int64, order="C", copy=True))


def run_plan(mode: str, cfg: TransformerConfig, params: dict[str, np.ndarray], tokens: np.ndarray, plan: RematPlan,
             options: RunOptions) -> RunResult:
    """Loss, gradients, training, residual and peak memory, and step time of one remat plan.

    Args:
        mode: ``"eager"``, the only mode of the PyTorch reference.
        cfg: model configuration.
        params: canonical parameters (:func:`jaxremat.models.param_shapes`, ``cfg.dtype``).
        tokens: ``(B, T+1)`` integer token ids; inputs ``tokens[:, :-1]``, targets ``tokens[:, 1:]``.
        plan: the remat plan, handed whole to the model's loss (:func:`torchref.render.forward_blocks`
            reads it).
        options: :class:`parity.runners.framework.RunOptions`: ``hparams`` (AdamW settings and
            training steps), ``timing_repeats`` (timed training steps after one warm-up, >= 1),
            ``with_reverse_loop`` (also run :func:`torchref.reverse_loop.reverse_segment_loop`,
            only for plans with a checkpointed segment), ``with_training`` (the training run,
            the peak step and the timed steps), ``with_memory`` and ``seed``
            (``torch.manual_seed`` set before every forward pass: dropout masks repeat exactly).

    Returns:
        :class:`parity.runners.result.RunResult`: ``loss`` (0-d numpy, ``cfg.dtype``), ``grads``
        (canonical dict), ``trained`` (canonical params after ``hparams.steps`` AdamW steps on
        ``tokens``; None without training), ``mode`` (``"eager"``), ``reverse_loop_grads``
        (canonical dict or None), ``memory`` (:func:`parity.runners.torch_memory.measure_torch`:
        saved bytes of one forward -- saved tensors, checkpoint inputs and the policy's cached
        outputs, parameters and buffers excluded -- offloaded bytes, the cached names,
        MemTracker's peak of one steady-state training step and its breakdown, peak activation;
        None without training or memory) and ``step_time_s`` / ``step_times_s`` (median and every
        timed training step, ``time.perf_counter``).

    Raises:
        ValueError: bad parameters, tokens (not integer, wrong rank, ids out of range, too long),
            a plan invalid for ``cfg.n_layer``, a mode other than ``"eager"``, or ``timing_repeats < 1``.
    """
    if mode not in MODES:
        raise ValueError(f"the PyTorch reference runs eagerly: mode must be 'eager', got {mode!r}")
    if options.timing_repeats < 1:
        raise ValueError(f"timing_repeats must be >= 1, got {options.timing_repeats}")
    tokens_t = token_tensor(tokens)
    Model, model_loss, reverse_segment_loop = model_and_loss(cfg)
    seed, hparams = options.seed, options.hparams

    # loss and gradients of one step
    model = Model.from_params(cfg, params)
    torch.manual_seed(seed)
    loss = model_loss(model, tokens_t, plan)
    loss.backward()
    loss_np = np.asarray(loss.detach().numpy(), dtype=cfg.dtype).copy()
    grads = model.to_params(grads=True)

    reverse_grads = None
    if options.with_reverse_loop and any(s.checkpointed for s in plan.segments_for(cfg.n_layer)):
        model = Model.from_params(cfg, params)
        torch.manual_seed(seed)
        _, reverse_grads = reverse_segment_loop(model, tokens_t, plan.schedule)
    result = RunResult(loss=loss_np, grads=grads, trained=None, mode="eager", reverse_loop_grads=reverse_grads)
    if not options.with_training:
        return result

    # training run
    model = Model.from_params(cfg, params)
    opt = adamw(model.parameters(), hparams)
    steps = []
    for _ in range(hparams.steps):
        _train_step(model, opt, tokens_t, plan, seed)
        steps.append(_recorded_step(model))
    trained = model.to_params()

    # saved bytes of one forward pass (a fresh model), peak of one steady-state step (optimizer
    # state already allocated), then timing
    model = Model.from_params(cfg, params)
    opt = adamw(model.parameters(), hparams)
    _train_step(model, opt, tokens_t, plan, seed)  # warm-up: allocates AdamW state
    memory = step_memory(cfg, params, model, opt, tokens_t, plan, seed) if options.with_memory else None
    times = []
    for _ in range(options.timing_repeats):
        t0 = time.perf_counter()
        _train_step(model, opt, tokens_t, plan, seed)
        times.append(time.perf_counter() - t0)

    return dataclasses.replace(result, trained=trained, memory=memory, step_time_s=float(statistics.median(times)),
                               step_times_s=tuple(float(t) for t in times), training_steps=tuple(steps))
