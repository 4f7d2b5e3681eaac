"""PyTorch training over a sequence of batches: the fine-tuning run's steps (:meth:`parity.runners.torch_framework.TorchFramework.train`).

Each step is the suite's training step (``zero_grad``, the family's loss under the plan, ``backward``,
the harness's ``torch.optim.AdamW`` step; :mod:`parity.runners.torch_runner`) on the step's batch,
with ``torch.manual_seed(seed + step)`` before the forward pass (dropout masks fixed by the step).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
import torch

from jaxremat.models import TransformerConfig
from jaxremat.spec.plan import RematPlan

from parity.runners.framework import FRAMEWORKS, RunOptions
from parity.runners.result import TrainRun
from parity.runners.torch_runner import adamw, model_and_loss, step_memory, token_tensor


def train_plan(mode: str, cfg: TransformerConfig, params: dict[str, np.ndarray], batches: Sequence[np.ndarray],
               plan: RematPlan, options: RunOptions, on_step: Callable[[int, float, float], None] | None = None
               ) -> TrainRun:
    """Train ``plan`` for ``len(batches)`` AdamW steps, one batch per step (see the module docstring).

    Args:
        mode: ``"eager"``, the only mode of the PyTorch reference.
        cfg, params: the model and its canonical starting weights.
        batches: token batches of one shape.
        plan: the remat plan.
        options: ``hparams``, ``seed``, ``with_memory`` (one steady-state step measured after the last step,
            on the last batch; the weights returned are those before it).
        on_step: called after each step with ``(step, loss, step_time_s)``.

    Returns:
        :class:`parity.runners.result.TrainRun`.

    Raises:
        ValueError: a mode other than ``"eager"``, no batches, batches of different shapes, bad tokens.
    """
    if mode not in FRAMEWORKS["torch"].modes:
        raise ValueError(f"the PyTorch reference runs eagerly: mode must be 'eager', got {mode!r}")
    batches = [token_tensor(b) for b in batches]
    if not batches or len({tuple(b.shape) for b in batches}) != 1:
        raise ValueError("need at least one batch, all of one shape")
    Model, model_loss, _ = model_and_loss(cfg)
    model = Model.from_params(cfg, params)
    opt = adamw(model.parameters(), options.hparams)
    losses, times = [], []
    for i, tokens in enumerate(batches):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(options.seed + i)
        loss = model_loss(model, tokens, plan)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(np.asarray(loss.detach().numpy(), dtype=cfg.dtype).copy())
        if on_step is not None:
            on_step(i, float(losses[-1]), times[-1])
    trained = model.to_params()
    memory = None
    if options.with_memory:
        memory = step_memory(cfg, trained, model, opt, batches[-1], plan, options.seed + len(batches) - 1)
    return TrainRun(losses=np.stack(losses), trained=trained, step_times_s=tuple(float(t) for t in times),
                    memory=memory, mode="eager")
