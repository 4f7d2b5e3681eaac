"""Memory of a training step under each remat plan, at any size, without allocating the model (PyTorch).

:func:`estimate` builds the model and its inputs under ``torch._subclasses.fake_tensor.FakeTensorMode``
(tensors with a shape, a dtype and a device, and no data) and runs one training step there: the
optimizer state allocated, then ``zero_grad``, the loss under the plan
(:func:`torchref.render.forward_blocks`) and its backward pass, counting every storage created and
freed (:class:`LivePeak`; or ``torch.distributed._tools.mem_tracker.MemTracker``, which files each by
category and is what the harness measures real steps with: the two agree to the byte, and the live
count costs O(1) per op where MemTracker's grows with the live storages). Every op runs its fake
implementation, which computes output shapes only, so a 1.3B-parameter GPT at B=8, T=2048 is stepped
in seconds in a few hundred MB.

The step is the one the harness measures on real tensors (:func:`parity.runners.torch_runner.run_plan`):
AdamW's state held, gradients freed, the forward and backward pass; the optimizer's own update is left
out, as there (at a large vocabulary its foreach temporaries of the parameters' size would be the peak).
Run with ``fake=False, tracker="memtracker"`` it measures the same step on real tensors as the harness
does, the check of the estimate: ``tests/torchref/test_estimate.py`` compares the two, and
docs/real-sizes.md gives the margin.

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

# Deferred imports: torch.distributed's memory tracker (which loads torch._dynamo and torch._inductor, 0.86 s of
# `import torchref`) loads only when tracker="memtracker" measures a step.

import contextlib
import dataclasses
import functools
import sys
import time
import types
import weakref
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from jaxremat.spec.plan import RematPlan, parse_plan

from .render import forward_blocks

__all__ = ["DEFAULT_PLANS", "LivePeak", "NOT_ACTIVATION", "PlanEstimate", "estimate", "estimate_step"]

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
        backend: what measured it, e.g. ``"torch FakeTensorMode + live storage bytes (cpu)"``.
        breakdown: the categories at the peak, by name: ``PARAM``, ``BUFFER``, ``GRAD``, ``OPT`` and
            ``ACT+TEMP`` (the live count) or MemTracker's own (``ACT``, ``TEMP``, ``OTH`` for the rest).
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


class LivePeak(TorchDispatchMode):
    """The peak of the bytes of storages created while the mode is active, and the op count at the peak:
    :class:`torchref.live_bytes.LiveBytesTracker`'s count (a weak reference per new storage, O(1) per op),
    plus the op count, against which a step tells which gradients were already gradients at the peak.

    Args:
        exclude: tensors whose storages existed before and are counted apart (parameters, buffers,
            optimizer state); an input's storage is counted when an op first returns a view of it.

    Attributes:
        live_bytes, peak_bytes: bytes of created storages alive now, and at most.
        op_count: ops run so far; peak_op: the op count at the peak.
    """

    def __init__(self, exclude: Sequence[torch.Tensor] = ()):
        super().__init__()
        self._seen = WeakIdKeyDictionary()
        for t in exclude:
            self._seen[t.untyped_storage()] = None
        self.live_bytes = self.peak_bytes = self.peak_op = self.op_count = 0

    def _freed(self, nbytes: int, _ref) -> None:
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.op_count += 1
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            st = t.untyped_storage()
            if st in self._seen:
                continue
            nbytes = int(st.nbytes())
            self._seen[st] = weakref.ref(st, functools.partial(self._freed, nbytes))
            self.live_bytes += nbytes
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes, self.peak_op = self.live_bytes, self.op_count
        return out


def _mark_ready(ready: dict, key: int, live: LivePeak, grad):
    ready.setdefault(key, live.op_count)


def _storage_bytes(tensors) -> int:
    return sum({id(t.untyped_storage()): int(t.untyped_storage().nbytes()) for t in tensors}.values())


def _optimizer_tensors(opt) -> list:
    return [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def estimate_step(build: Callable[[], tuple[nn.Module, tuple]], plan: "str | RematPlan",
                  loss: Callable[..., torch.Tensor], *, optimizer: bool = True, fake: bool = True,
                  tracker: str = "live") -> PlanEstimate:
    """The peak of one training step of ``build()``'s model under ``plan`` (module docstring).

    Args:
        build: ``() -> (module, inputs)``, called inside the fake mode (so every tensor it creates
            is fake) or, with ``fake=False``, as it is.
        plan: a plan name or :class:`jaxremat.spec.plan.RematPlan`.
        loss: ``loss(module, plan, *inputs) -> 0-d tensor``, the plan a RematPlan.
        optimizer: hold AdamW's state (``torch.optim.AdamW`` defaults) during the step.
        fake: False runs the same step on real tensors (the check of the estimate).
        tracker: ``"live"`` (:class:`LivePeak`: O(1) per op; the peak is what existed before --
            parameters, buffers, optimizer state -- plus the created storages' peak, gradients among
            them) or ``"memtracker"`` (``torch.distributed._tools.mem_tracker.MemTracker``, as the
            harness measures real steps; its bookkeeping costs O(live storages) per op, minutes at
            a few dozen layers). The two agree to the byte (``tests/torchref/test_estimate.py``).

    Raises:
        ValueError: an unknown tracker.
        RuntimeError: the tracker saw no memory.
    """
    if tracker not in ("live", "memtracker"):
        raise ValueError(f"tracker must be 'live' or 'memtracker', got {tracker!r}")
    plan = parse_plan(plan)
    t0 = time.perf_counter()
    with FakeTensorMode() if fake else contextlib.nullcontext():
        module, inputs = build()
        opt = torch.optim.AdamW(module.parameters()) if optimizer else None
        if opt is not None:
            _allocate_optimizer_state(module, opt)
        device = next(module.parameters()).device
        if tracker == "memtracker":
            by_name, peak = _memtracker_step(module, opt, plan, inputs, loss, device)
        else:
            by_name, peak = _live_step(module, opt, plan, inputs, loss)
    if peak <= 0:
        raise RuntimeError(f"{tracker} saw no memory during the step; refusing to report 0")
    kinds = [by_name.get(k, 0) for k in NOT_ACTIVATION]
    counter = "MemTracker" if tracker == "memtracker" else "live storage bytes"
    source = f"torch {'FakeTensorMode' if fake else 'real tensors'} + {counter} ({device.type})"
    return PlanEstimate(plan.name, peak, *kinds, peak - sum(kinds), time.perf_counter() - t0, source, by_name)


def _memtracker_step(module, opt, plan, inputs, loss, device) -> tuple[dict, int]:
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    mt.track_external(module, *([opt] if opt is not None else []))
    with mt:
        module.zero_grad(set_to_none=True)
        loss(module, plan, *inputs).backward()
    snapshot = mt.get_tracker_snapshot("peak").get(device, {})
    by_name = {getattr(k, "name", str(k)): int(v) for k, v in snapshot.items() if k != "Total"}
    return by_name, int(snapshot.get("Total", 0))


def _live_step(module, opt, plan, inputs, loss) -> tuple[dict, int]:
    params, buffers = list(module.parameters()), list(module.buffers())
    state = _optimizer_tensors(opt) if opt is not None else []
    module.zero_grad(set_to_none=True)
    live = LivePeak([*params, *buffers, *state])  # the inputs count once an op reads them, as in MemTracker
    # a gradient counts as one from the moment its parameter's gradient hook runs, as MemTracker files it
    # (before that, e.g. the embedding's gradient just computed, it is a temporary of the backward pass)
    ready: dict[int, int] = {}
    handles = [p.register_hook(functools.partial(_mark_ready, ready, id(p), live))
               for p in params if p.requires_grad]
    try:
        with live:
            loss(module, plan, *inputs).backward()
    finally:
        for h in handles:
            h.remove()
    held = [p.grad for p in params if p.grad is not None and ready.get(id(p), live.peak_op) < live.peak_op]
    grads = _storage_bytes(held)
    by_name = {"PARAM": _storage_bytes(params), "BUFFER": _storage_bytes(buffers), "GRAD": grads,
               "OPT": _storage_bytes(state), "ACT+TEMP": live.peak_bytes - grads}
    return by_name, sum(by_name.values())


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
