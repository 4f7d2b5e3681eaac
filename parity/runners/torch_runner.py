"""The PyTorch side of the parity harness: one schedule, one batch, every measurement.

:func:`run_schedule` is the uniform entry point the harness calls for the torch reference (eager
mode). Every measurement starts from a fresh model built from the same canonical parameters, so
that no measurement disturbs another (the timed steps and the peak step train their own copies).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from jaxremat.models import TransformerConfig, get_model
from jaxremat.spec import Schedule
from jaxremat.spec.policies import Policy, parse_policy

from parity.inputs.train import AdamWConfig
from parity.runners.result import RunResult
from parity.runners.torch_memory import measure_torch


def model_and_loss(cfg: TransformerConfig):
    """Model class, loss and reverse loop of ``cfg``'s family (GPT: next-token; BERT: contrastive).

    Its :class:`jaxremat.models.ModelSpec`'s ``torch_model``, ``torch_loss`` and ``torch_reverse_loop``.
    """
    spec = get_model(cfg.arch)
    return spec.load("torch_model"), spec.load("torch_loss"), spec.load("torch_reverse_loop")


def _adamw(model: torch.nn.Module, hparams: AdamWConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        model.parameters(), lr=hparams.learning_rate, betas=(hparams.b1, hparams.b2),
        eps=hparams.eps, weight_decay=hparams.weight_decay,
    )


def _grad_step(model: torch.nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, schedule: Schedule, seed: int,
               policy: Policy | None = None) -> None:
    opt.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    model_and_loss(model.cfg)[1](model, tokens, schedule, policy=policy).backward()


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, schedule: Schedule, seed: int,
                policy: Policy | None = None) -> None:
    _grad_step(model, opt, tokens, schedule, seed, policy)
    opt.step()


def run_schedule(
    cfg: TransformerConfig, params: dict[str, np.ndarray], tokens: np.ndarray, schedule: Schedule, *,
    hparams: AdamWConfig, mode: str = "eager", timing_repeats: int = 5, with_reverse_loop: bool = True,
    seed: int = 0, policy: Policy | str | None = None,
) -> RunResult:
    """Loss, gradients, training, residual and peak memory, and step time of one remat schedule.

    Args:
        cfg: model configuration.
        params: canonical parameters (:func:`jaxremat.models.param_shapes`, ``cfg.dtype``).
        tokens: ``(B, T+1)`` integer token ids; inputs ``tokens[:, :-1]``, targets ``tokens[:, 1:]``.
        schedule: remat schedule for the blocks.
        hparams: AdamW hyper-parameters and number of training steps.
        mode: ``"eager"``, the only mode of the PyTorch reference (named for the runner protocol,
            :class:`parity.runners.result.Runner`).
        timing_repeats: timed training steps (after one warm-up step); >= 1.
        with_reverse_loop: also run :func:`torchref.reverse_loop.reverse_segment_loop` (only for
            schedules with at least one checkpointed segment).
        seed: ``torch.manual_seed`` set before every forward pass (dropout masks repeat exactly).
        policy: what checkpointed segments keep inside (:mod:`torchref.policies`); None keeps nothing.

    Returns:
        :class:`parity.runners.result.RunResult`: ``loss`` (0-d numpy, ``cfg.dtype``), ``grads``
        (canonical dict), ``trained`` (canonical params after ``hparams.steps`` AdamW steps on
        ``tokens``), ``mode`` (``"eager"``), ``reverse_loop_grads`` (canonical dict or None),
        ``memory`` (:func:`parity.runners.torch_memory.measure_torch`: saved bytes of one forward
        -- saved tensors, checkpoint inputs and the policy's cached outputs, parameters and
        buffers excluded -- offloaded bytes, the cached names, MemTracker's peak of one
        steady-state training step and its breakdown, peak activation) and ``step_time_s`` /
        ``step_times_s`` (median and every timed training step, ``time.perf_counter``).

    Raises:
        ValueError: bad parameters, tokens (not integer, wrong rank, ids out of range, too long),
            a schedule invalid for ``cfg.n_layer``, a mode other than ``"eager"``, or ``timing_repeats < 1``.
    """
    if mode != "eager":
        raise ValueError(f"the PyTorch reference runs eagerly: mode must be 'eager', got {mode!r}")
    if timing_repeats < 1:
        raise ValueError(f"timing_repeats must be >= 1, got {timing_repeats}")
    tokens = np.asarray(tokens)
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be an integer array of shape (B, T+1), got dtype {tokens.dtype}")
    tokens_t = torch.from_numpy(np.array(tokens, dtype=np.int64, order="C", copy=True))
    Model, model_loss, reverse_segment_loop = model_and_loss(cfg)

    policy = parse_policy(policy)

    # loss and gradients of one step
    model = Model.from_params(cfg, params)
    torch.manual_seed(seed)
    loss = model_loss(model, tokens_t, schedule, policy=policy)
    loss.backward()
    loss_np = np.asarray(loss.detach().numpy(), dtype=cfg.dtype).copy()
    grads = model.to_params(grads=True)

    reverse_grads = None
    if with_reverse_loop and any(s.checkpointed for s in schedule.segments_for(cfg.n_layer)):
        model = Model.from_params(cfg, params)
        torch.manual_seed(seed)
        _, reverse_grads = reverse_segment_loop(model, tokens_t, schedule)

    # training run
    model = Model.from_params(cfg, params)
    opt = _adamw(model, hparams)
    for _ in range(hparams.steps):
        _train_step(model, opt, tokens_t, schedule, seed, policy)
    trained = model.to_params()

    # saved bytes of one forward pass (a fresh model), peak of one steady-state step (optimizer
    # state already allocated), then timing
    saved_model = Model.from_params(cfg, params)

    def forward(sac, on_checkpoint_input):
        torch.manual_seed(seed)
        return model_loss(saved_model, tokens_t, schedule, policy=sac, on_checkpoint_input=on_checkpoint_input)

    model = Model.from_params(cfg, params)
    opt = _adamw(model, hparams)
    _train_step(model, opt, tokens_t, schedule, seed, policy)  # warm-up: allocates AdamW state
    # the peak is of the forward and backward pass with the AdamW state held, as JAX measures
    # value_and_grad: AdamW's own step allocates foreach temporaries of the parameters' size, which
    # at a large vocabulary (MiniLM: 90 MB of parameters, 30 MB of activations) would be the peak
    # and leave no activation in it; the step is finished right after, outside the measurement
    memory = measure_torch(forward, lambda: _grad_step(model, opt, tokens_t, schedule, seed, policy),
                           exclude=[*saved_model.parameters(), *saved_model.buffers()], tracked=(model, opt),
                           policy=policy)
    opt.step()
    times = []
    for _ in range(timing_repeats):
        t0 = time.perf_counter()
        _train_step(model, opt, tokens_t, schedule, seed, policy)
        times.append(time.perf_counter() - t0)

    return RunResult(loss=loss_np, grads=grads, trained=trained, mode="eager", reverse_loop_grads=reverse_grads,
                     memory=memory, step_time_s=float(statistics.median(times)),
                     step_times_s=tuple(float(t) for t in times))
