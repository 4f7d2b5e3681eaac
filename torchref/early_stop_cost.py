"""What turning checkpoint early stop off costs: peak bytes, step time and recomputed ops, side by side.

``torchref.render`` runs every checkpoint with ``early_stop=False`` (module docstring of
:mod:`torchref.render`: ops such as ``rrelu_with_noise`` write a tensor in place *after* autograd
saved it, and an early-stopped recompute ends at that save, before the write, so the backward
reads uninitialised memory). Early stop lets the recompute end as soon as the last saved tensor
exists; off, the recompute runs each segment to its end. This module measures the difference on
the GPT model, one training step (forward + backward) per measurement:

* peak bytes of a step (:func:`torchref.memory.peak_step_bytes`: ``MemTracker`` on CPU, the CUDA
  counters on a GPU), once per setting (deterministic);
* ATen ops and FLOPs run in the backward pass (a ``TorchDispatchMode`` counting ops,
  ``torch.utils.flop_counter.FlopCounterMode`` counting matmul FLOPs): the extra recompute;
* step time, the two settings interleaved (off, on, off, on, ...) so that load on a shared machine
  falls on both alike; medians and min-max of ``--repeats`` steps each.

Run: ``python -m parity.experiments.early_stop_cost`` (``--help`` for the options); one JSON line per plan.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.plan import parse_plan

from . import render
from .memory import peak_step_bytes
from .model import GPT


class _OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _step(model, tokens, plan, early_stop: bool, count=None) -> None:
    model.zero_grad(set_to_none=True)
    render.EARLY_STOP = early_stop
    try:
        loss = render.model_loss(model, tokens, plan.schedule, policy=plan.policy)
        if count is None:
            loss.backward()
        else:
            with count:
                loss.backward()
    finally:
        render.EARLY_STOP = False


def measure(plan_text: str, cfg: TransformerConfig, batch: int, repeats: int) -> dict:
    """Peak bytes, backward ops and step times of ``plan_text`` with early stop off and on."""
    plan = parse_plan(plan_text)
    model = GPT.from_params(cfg, init_params(cfg, seed=1))
    tokens = torch.as_tensor(np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, cfg.max_seq_len + 1)))
    out = {"plan": plan.name, "n_layer": cfg.n_layer, "d_model": cfg.d_model, "batch": batch,
           "seq_len": cfg.max_seq_len, "repeats": repeats}
    times = {False: [], True: []}
    for early in (False, True):
        _step(model, tokens, plan, early)  # warm-up
        out[f"peak_bytes_early_stop_{'on' if early else 'off'}"] = peak_step_bytes(
            lambda: _step(model, tokens, plan, early), model).peak_bytes
        count, flops = _OpCount(), FlopCounterMode(display=False)
        _step(model, tokens, plan, early, count)
        _step(model, tokens, plan, early, flops)
        out[f"backward_ops_early_stop_{'on' if early else 'off'}"] = count.ops
        out[f"backward_flops_early_stop_{'on' if early else 'off'}"] = flops.get_total_flops()
    for _ in range(repeats):
        for early in (False, True):
            t0 = time.perf_counter()
            _step(model, tokens, plan, early)
            times[early].append(time.perf_counter() - t0)
    for early, ts in times.items():
        key = "on" if early else "off"
        out[f"step_time_s_early_stop_{key}"] = statistics.median(ts)
        out[f"step_time_s_range_early_stop_{key}"] = [min(ts), max(ts)]
    out["peak_off_over_on"] = out["peak_bytes_early_stop_off"] / out["peak_bytes_early_stop_on"]
    out["backward_flops_off_over_on"] = out["backward_flops_early_stop_off"] / out["backward_flops_early_stop_on"]
    out["time_off_over_on"] = out["step_time_s_early_stop_off"] / out["step_time_s_early_stop_on"]
    return out
