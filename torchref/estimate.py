"""Memory of a training step under each remat plan, at any size, without allocating the model (PyTorch).

:func:`estimate` builds the model and its inputs under ``torch._subclasses.fake_tensor.FakeTensorMode``
(tensors with a shape, a dtype and a device, and no data) and runs one training step there: the
optimizer state allocated, then ``zero_grad``, the loss under the plan
(:func:`torchref.render.forward_blocks`) and its backward pass, under
``torch.distributed._tools.mem_tracker.MemTracker`` (every storage created and freed, filed by
category: parameters, buffers, gradients, activations, temporaries, optimizer state). Every op runs its fake implementation, which computes
output shapes only, so a 1.3B-parameter GPT at B=8, T=2048 is stepped in seconds in a few hundred MB.

The step is the one the harness measures on real tensors (:func:`parity.runners.torch_runner.run_schedule`):
AdamW's state held, gradients freed, the forward and backward pass; the optimizer's own update is left
out, as there (at a large vocabulary its foreach temporaries of the parameters' size would be the peak).
Run with ``fake=False`` it measures the same step on real tensors, the check of the estimate:
``tests/torchref/test_estimate.py`` compares the two, and docs/real-sizes.md gives the margin.

What fake tensors need from the code they run: no value may decide anything. The project's models
skip their token-id range check for fake tensors (:func:`torchref.model.holds_values`), and the
checkpoint wrapper's comparison of buffers before and after a forward pass (``torch.equal``,
:class:`torchref.forward_state.ForwardState`) trusts the version counter there; with those, every
plan runs (no ``determinism_check`` needs changing: the checkpoint compares shapes, dtypes and devices).

Sources: PyTorch ``torch._subclasses.fake_tensor``, ``torch.distributed._tools.mem_tracker``
(the "estimate memory of a model without running it" use its docstring names).

Not counted here: FLOPs. ``torch.utils.flop_counter.FlopCounterMode`` around the step changes the
step's memory (its module tracker keeps every module's output alive until the backward reaches it:
measured at gpt-small, ``every_k(2)``'s peak 16.7 MB with the counter, 9.4 MB without, as much as
``none``'s), so it never wraps a measured step; :func:`torchref.planner.block_options` counts the
recompute FLOPs of one block apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import types
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from jaxremat.spec.plan import RematPlan, parse_plan

from .render import forward_blocks

__all__ = ["DEFAULT_PLANS", "NOT_ACTIVATION", "PlanEstimate", "estimate", "estimate_step"]

DEFAULT_PLANS = ("none", "every_k(2)", "sqrt", "full", "full+attention_only")
"""The plans estimated when none are given (as :data:`jaxremat.estimate.DEFAULT_PLANS`)."""

NOT_ACTIVATION = ("PARAM", "BUFFER", "GRAD", "OPT")
"""MemTracker categories that are not activations (as the harness's measured runs count them)."""


@dataclasses.dataclass(frozen=True)
class PlanEstimate:
    """One training step's peak under one plan, by MemTracker's categories (bytes).

    Attributes:
        plan: the plan's canonical name.
        peak_bytes: the step's peak: every category at the moment of the peak.
        parameter_bytes, buffer_bytes, gradient_bytes, optimizer_bytes: MemTracker's ``PARAM``,
            ``BUFFER``, ``GRAD`` and ``OPT`` at the peak (gradients: those allocated by then).
        activation_bytes: ``peak_bytes`` less those four (activations, temporaries and the rest).
        time_s: seconds the estimate took (building the model, the step).
        backend: what measured it, e.g. ``"torch FakeTensorMode + MemTracker (cpu)"``.
        breakdown: every MemTracker category at the peak, by name.
    """

    plan: str
    peak_bytes: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    time_s: float
    backend: str
    breakdown: dict


def _allocate_optimizer_state(module: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Allocate AdamW's state as a first step would (zero gradients, one update), then free the gradients."""
    for p in module.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)


def estimate_step(build: Callable[[], tuple[nn.Module, tuple]], plan: "str | RematPlan",
                  loss: Callable[..., torch.Tensor], *, optimizer: bool = True, fake: bool = True) -> PlanEstimate:
    """The peak of one training step of ``build()``'s model under ``plan`` (module docstring).

    Args:
        build: ``() -> (module, inputs)``, called inside the fake mode (so every tensor it creates
            is fake) or, with ``fake=False``, as it is.
        plan: a plan name or :class:`jaxremat.spec.plan.RematPlan`.
        loss: ``loss(module, plan, *inputs) -> 0-d tensor``, the plan a RematPlan.
        optimizer: hold AdamW's state (``torch.optim.AdamW`` defaults) during the step.
        fake: False runs the same step on real tensors (the check of the estimate).

    Raises:
        RuntimeError: MemTracker saw no memory.
    """
    plan = parse_plan(plan)
    t0 = time.perf_counter()
    with FakeTensorMode() if fake else contextlib.nullcontext():
        module, inputs = build()
        opt = torch.optim.AdamW(module.parameters()) if optimizer else None
        if opt is not None:
            _allocate_optimizer_state(module, opt)
        tracker = MemTracker()
        tracker.track_external(module, *([opt] if opt is not None else []))
        with tracker:
            module.zero_grad(set_to_none=True)
            loss(module, plan, *inputs).backward()
        device = next(module.parameters()).device
        snapshot = tracker.get_tracker_snapshot("peak").get(device, {})
    by_name = {getattr(k, "name", str(k)): int(v) for k, v in snapshot.items() if k != "Total"}
    peak = int(snapshot.get("Total", 0))
    if peak <= 0:
        raise RuntimeError("MemTracker saw no memory during the step; refusing to report 0")
    kinds = [by_name.get(k, 0) for k in NOT_ACTIVATION]
    source = f"torch {'FakeTensorMode' if fake else 'real tensors'} + MemTracker ({device.type})"
    return PlanEstimate(plan.name, peak, *kinds, peak - sum(kinds), time.perf_counter() - t0, source, by_name)


def _input(spec) -> torch.Tensor:
    shape, dtype = (spec, torch.float32) if not isinstance(spec[-1], torch.dtype) else (spec[0], spec[1])
    if dtype.is_floating_point:
        return torch.randn(tuple(shape), dtype=dtype)
    return torch.zeros(tuple(shape), dtype=dtype)


def _stack_loss(module: nn.Module, plan: RematPlan, x: torch.Tensor, *rest) -> torch.Tensor:
    return forward_blocks(list(module), x, plan.schedule, *rest, policy=plan.policy).float().square().mean()


def estimate(module_factory: Callable[[], nn.Module], input_shapes: Sequence, plans: Sequence = DEFAULT_PLANS, *,
             loss: Callable[..., torch.Tensor] | None = None, optimizer: bool = True,
             fake: bool = True) -> list[PlanEstimate]:
    """Peak memory of one AdamW training step of your model under each plan, nothing allocated.

    Example (a 24-layer stack of 2048-wide blocks at B=8, T=2048)::

        rows = torchref.estimate(lambda: nn.Sequential(*(MyBlock(2048) for _ in range(24))),
                                 [(8, 2048, 2048)], plans=["none", "every_k(2)", "sqrt"])
        for row in rows:
            print(row.plan, row.peak_bytes / 2**30, "GiB")

    Args:
        module_factory: ``() -> nn.Module``, called under ``FakeTensorMode`` (build the model there:
            its parameters are fake). With the default loss it is a sequence of blocks
            (``nn.Sequential``, ``nn.ModuleList``) run by :func:`torchref.render.forward_blocks`.
        input_shapes: one entry per input: a shape (float32) or ``(shape, dtype)``; float inputs are
            ``randn``, integer ones zeros.
        plans: plan names or :class:`jaxremat.spec.plan.RematPlan` values, all parsed first.
        loss: ``loss(module, plan, *inputs) -> 0-d tensor`` (``plan`` a RematPlan: give
            ``plan.schedule`` and ``plan.policy`` to ``forward_blocks``); default: the mean square of
            the stack's output, the first input run through the blocks, the other inputs given to
            every block.
        optimizer: hold AdamW's state during the step (its two moments and step count).
        fake: False measures the same step on real tensors (allocates everything).

    Returns:
        One :class:`PlanEstimate` per plan, in the order given.

    Raises:
        ValueError: an empty list or an unknown plan (before any step), or a plan invalid for the
            stack (from ``forward_blocks``).
    """
    if isinstance(plans, (str, RematPlan)) or not len(plans):
        raise ValueError(f"plans must be a non-empty list of plan names, e.g. {list(DEFAULT_PLANS)}, got {plans!r}")
    parsed = [parse_plan(p) for p in plans]

    def build():
        return module_factory(), tuple(_input(s) for s in input_shapes)

    return [estimate_step(build, p, loss or _stack_loss, optimizer=optimizer, fake=fake) for p in parsed]


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`estimate` (``torchref.estimate(factory, shapes, plans=...)``), with
    its names as attributes (``torchref.estimate.PlanEstimate``)."""

    def __call__(self, *args: Any, **kwargs: Any):
        return estimate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
