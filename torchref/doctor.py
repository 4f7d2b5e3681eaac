"""The remat doctor for PyTorch: run one training step and report, per module, what remat did.

:func:`doctor` runs ``step()`` (a callable doing a forward and a backward pass, e.g. a Hugging Face
model's ``loss.backward()``) once, with:

* global module hooks (``torch.nn.modules.module.register_module_forward_pre_hook`` /
  ``register_module_forward_hook``): the module each op runs in, forward calls per module, and
  the calls made during the backward pass (recomputation; ``torch._C._current_graph_task_id()`` is
  -1 outside a backward pass);
* saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``): the bytes the forward pass
  saves for the backward pass, per module, each storage once, parameters and buffers excluded.
  Inside a non-reentrant checkpoint region checkpoint's own hook is the innermost one, so what the
  region saves for its recompute does not reach these (its input does);
* ``torch.utils.checkpoint`` observed at its two entry points, patched for the step's duration:
  ``_checkpoint_without_reentrant_generator`` (``use_reentrant=False``; also ``checkpoint_wrapper``,
  ``checkpoint_sequential`` and Hugging Face's ``gradient_checkpointing_enable``) and
  ``CheckpointFunction.forward`` (``use_reentrant=True``: observed to detect a user's reentrant call,
  never used; torchref checkpoints non-reentrant only). Each call is a checkpoint region of the
  module that made it: the function it checkpoints is wrapped to count its recomputes, and a
  selective policy (``context_fn`` from ``create_selective_checkpoint_contexts``) is wrapped to
  count the ops it saves;
* ``torch.distributed._tools.mem_tracker.MemTracker``: the step's peak bytes (on a CUDA model,
  ``torch.cuda.max_memory_allocated``), as :func:`torchref.memory.peak_step_bytes` measures it;
  without a model, or with frozen parameters (on which MemTracker's gradient hooks raise),
  :func:`torchref.live_bytes.step_peak_bytes` (activations and temporaries).

Problems (:class:`TorchProblem`): ``reentrant-checkpoint`` (``use_reentrant=True`` silently drops the
gradients of inputs that do not require grad, of keyword arguments and of ``backward(inputs=...)``;
flagged always, and said so when a region's recompute never ran and its parameters got no gradient)
and ``policy-dropped`` (a selective policy that saved none of the ops of its region: full remat).

Source: ``torch.utils.checkpoint`` (PyTorch 2.13), ``torch.autograd.graph.saved_tensors_hooks``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import io
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
import torch.utils.checkpoint as tuc
from rich import box
from rich.console import Console
from rich.table import Table

from .live_bytes import step_peak_bytes
from .memory import peak_step_bytes

__all__ = ["ModuleReport", "TORCH_PROBLEM_KINDS", "TorchDiagnosis", "TorchProblem", "doctor"]

TORCH_PROBLEM_KINDS = ("reentrant-checkpoint", "policy-dropped")
"""The kinds of :class:`TorchProblem` (docs/doctor.md)."""

_SAVES = (tuc.CheckpointPolicy.MUST_SAVE, tuc.CheckpointPolicy.PREFER_SAVE)


def _bytes(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; None -> ``"-"``."""
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


@dataclasses.dataclass(frozen=True)
class TorchProblem:
    """One problem: ``kind`` (of :data:`TORCH_PROBLEM_KINDS`), the module ``where``, ``message``, ``fix``."""

    kind: str
    where: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}: {self.message}; fix: {self.fix}"


@dataclasses.dataclass(frozen=True)
class ModuleReport:
    """What one module did in the step.

    Attributes:
        name: qualified name from the root module (``"encoder.layer.0"``); the root is its class name.
        kind: the module's class name.
        forward_calls: calls in the forward pass.
        recompute_calls: calls during the backward pass (recomputation by a checkpoint around it).
        saved_bytes: bytes saved for the backward pass by ops that ran directly in it (not in a
            submodule), each storage once, parameters and buffers excluded.
        checkpoint: ``"non-reentrant"``, ``"reentrant"`` or ``"selective"`` when it calls
            ``torch.utils.checkpoint`` (the regions start in it), else None.
        checkpoint_calls: its checkpoint regions run in the forward pass.
        recomputes: how many times those regions' functions ran again in the backward pass.
        saved_ops, policy_ops: for ``"selective"``: ops its policy saved, ops it was asked about.
    """

    name: str
    kind: str
    forward_calls: int
    recompute_calls: int
    saved_bytes: int
    checkpoint: str | None = None
    checkpoint_calls: int = 0
    recomputes: int = 0
    saved_ops: int = 0
    policy_ops: int = 0


@dataclasses.dataclass(frozen=True)
class TorchDiagnosis:
    """The doctor's report on one PyTorch step.

    Attributes:
        modules: one :class:`ModuleReport` per module that ran, in the order they first ran.
        problems: every problem found (empty: none).
        saved_bytes: all bytes saved for the backward pass outside checkpoint regions (and their inputs).
        peak_bytes: the step's peak bytes (MemTracker: parameters, gradients, optimizer state and
            activations; LiveBytesTracker: activations and temporaries only).
        peak_source: the tracker that measured it and why (``"torch MemTracker (cpu)"``, ...).
    """

    modules: tuple[ModuleReport, ...]
    problems: tuple[TorchProblem, ...]
    saved_bytes: int
    peak_bytes: int
    peak_source: str

    @property
    def ok(self) -> bool:
        return not self.problems

    def kinds(self) -> list[str]:
        """The kinds of the problems found, in order, each once."""
        return list(dict.fromkeys(p.kind for p in self.problems))

    def module(self, name: str) -> ModuleReport:
        """The report of the module named ``name``.

        Raises:
            KeyError: no module of that name ran.
        """
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(f"no module {name!r} ran; modules: {[m.name for m in self.modules]}")

    def __str__(self) -> str:
        out = io.StringIO()
        console = Console(file=out, width=200, no_color=True, color_system=None, force_terminal=False,
                          highlight=False, emoji=False, markup=False)
        console.print(f"remat doctor (torch): {len(self.modules)} modules, saved {_bytes(self.saved_bytes)}, "
                      f"peak {_bytes(self.peak_bytes)} ({self.peak_source}), {len(self.problems)} problem(s)",
                      soft_wrap=True)
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for header in ("module", "class", "calls", "recomputed", "saved", "checkpoint"):
            table.add_column(header, justify="left" if header in ("module", "class", "checkpoint") else "right")
        for m in self.modules:
            ck = "-" if m.checkpoint is None else f"{m.checkpoint} x{m.checkpoint_calls}, {m.recomputes} recompute(s)"
            if m.checkpoint == "selective":
                ck += f", saved {m.saved_ops}/{m.policy_ops} ops"
            table.add_row(m.name, m.kind, str(m.forward_calls), str(m.recompute_calls), _bytes(m.saved_bytes), ck)
        console.print(table)
        for p in self.problems:
            console.print(str(p), soft_wrap=True)
        return out.getvalue().rstrip("\n")


@dataclasses.dataclass
class _Region:
    module: nn.Module | None
    kind: str
    calls: int = 0  # calls of the checkpointed function (the first is the forward for "reentrant")
    saved_ops: int = 0
    policy_ops: int = 0


class _Watch:
    """The hooks and patches of one step (see the module docstring)."""

    def __init__(self):
        self.stack: list[nn.Module] = []
        self.order: dict[nn.Module, None] = {}
        self.calls: dict[nn.Module, int] = {}
        self.recomputes: dict[nn.Module, int] = {}
        self.saved: dict[nn.Module | None, int] = {}
        self.storages: set[int] = set()
        self.excluded: set[int] = set()
        self.regions: list[_Region] = []

    @staticmethod
    def in_backward() -> bool:
        return torch._C._current_graph_task_id() != -1

    def pre(self, module, args):
        self.stack.append(module)
        self.order.setdefault(module, None)
        for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            self.excluded.add(t.untyped_storage().data_ptr())
        counts = self.recomputes if self.in_backward() else self.calls
        counts[module] = counts.get(module, 0) + 1

    def post(self, module, args, output):
        if self.stack and self.stack[-1] is module:
            self.stack.pop()

    def pack(self, t):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and not self.in_backward():
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key not in self.excluded and key not in self.storages and storage.nbytes():
                self.storages.add(key)
                owner = self.stack[-1] if self.stack else None
                self.saved[owner] = self.saved.get(owner, 0) + int(storage.nbytes())
        return t

    def region(self, kind: str) -> _Region:
        r = _Region(self.stack[-1] if self.stack else None, kind)
        self.regions.append(r)
        return r

    def counted(self, fn: Callable, region: _Region) -> Callable:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            region.calls += 1
            return fn(*args, **kwargs)

        return run

    def selective(self, context_fn: Callable, region: _Region) -> Callable:
        def contexts():
            forward, recompute = context_fn()
            policy_fn = getattr(forward, "policy_fn", None)
            if policy_fn is not None:  # a selective checkpoint (create_selective_checkpoint_contexts)
                region.kind = "selective"

                def policy(ctx, op, *args, **kwargs):
                    answer = policy_fn(ctx, op, *args, **kwargs)
                    region.policy_ops += 1
                    region.saved_ops += answer is True or answer in _SAVES
                    return answer

                forward.policy_fn = policy
            return forward, recompute

        return contexts

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        generator, reentrant = tuc._checkpoint_without_reentrant_generator, tuc.CheckpointFunction.forward
        signature = inspect.signature(generator)

        def non_reentrant(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            region = self.region("non-reentrant")
            region.calls = 1  # checkpoint() runs the forward itself; the generator's fn is the recompute
            bound.arguments["fn"] = self.counted(bound.arguments["fn"], region)
            if "context_fn" in bound.arguments and bound.arguments["context_fn"] is not tuc.noop_context_fn:
                bound.arguments["context_fn"] = self.selective(bound.arguments["context_fn"], region)
            return (yield from generator(*bound.args, **bound.kwargs))

        def reentrant_forward(ctx, run_function, preserve_rng_state, *args):
            return reentrant(ctx, self.counted(run_function, self.region("reentrant")), preserve_rng_state, *args)

        tuc._checkpoint_without_reentrant_generator = non_reentrant
        tuc.CheckpointFunction.forward = staticmethod(reentrant_forward)
        try:
            yield
        finally:
            tuc._checkpoint_without_reentrant_generator = generator
            tuc.CheckpointFunction.forward = staticmethod(reentrant)

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        handles = [nn.modules.module.register_module_forward_pre_hook(self.pre),
                   nn.modules.module.register_module_forward_hook(self.post, always_call=True)]
        try:
            with self.patched(), torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
                yield
        finally:
            for h in handles:
                h.remove()


def _names(modules: list[nn.Module], model: nn.Module | None) -> dict[nn.Module, str]:
    """Qualified names from ``model`` (or from each module that ran with no parent among those that ran)."""
    names: dict[nn.Module, str] = {}
    roots = [model] if model is not None else []
    children = {c for m in modules for c in m.children()}
    roots += [m for m in modules if m not in children and m is not model]
    for root in roots:
        for name, sub in root.named_modules():
            names.setdefault(sub, name or type(root).__name__)
    return names


def _reports(watch: _Watch, model: nn.Module | None) -> list[ModuleReport]:
    modules = list(watch.order)
    names = _names(modules, model)
    by_module: dict[Any, list[_Region]] = {}
    for r in watch.regions:
        by_module.setdefault(r.module, []).append(r)
    out = []
    for m in modules:
        regions = by_module.get(m, [])
        kinds = list(dict.fromkeys(r.kind for r in regions))
        out.append(ModuleReport(names.get(m, type(m).__name__), type(m).__name__, watch.calls.get(m, 0),
                                watch.recomputes.get(m, 0), watch.saved.get(m, 0),
                                "+".join(kinds) if kinds else None, len(regions),
                                sum(r.calls - 1 for r in regions), sum(r.saved_ops for r in regions),
                                sum(r.policy_ops for r in regions)))
    return out


def _problems(reports: list[ModuleReport]) -> list[TorchProblem]:
    problems = []
    for m in reports:
        if m.checkpoint and "reentrant" in m.checkpoint.split("+"):
            never = (f"; its recompute never ran ({m.checkpoint_calls} region(s), 0 recomputes), so the backward pass "
                     "did not reach it and its parameters got no gradient" if m.recomputes == 0 else "")
            # detection, not use: torchref itself checkpoints non-reentrant only; this flags a user's reentrant call
            problems.append(TorchProblem(
                "reentrant-checkpoint", m.name,
                "checkpoint with use_reentrant=True: gradients of inputs that do not require grad, of keyword "
                f"arguments and of backward(inputs=...) are silently dropped{never}",
                "pass use_reentrant=False (Hugging Face: gradient_checkpointing_enable(gradient_checkpointing_kwargs="
                "{'use_reentrant': False}))"))
        if m.checkpoint and "selective" in m.checkpoint.split("+") and m.policy_ops and not m.saved_ops:
            problems.append(TorchProblem(
                "policy-dropped", m.name,
                f"the selective checkpoint policy saved none of the {m.policy_ops} ops it was asked about, so the "
                f"region is recomputed in full ({m.recomputes} recompute(s)), as without a policy",
                "return CheckpointPolicy.MUST_SAVE for the ops to keep (e.g. torch.ops.aten.mm.default), or "
                "drop context_fn"))
    return problems


def doctor(step: Callable[[], Any], model: nn.Module | None = None, *tracked: Any) -> TorchDiagnosis:
    """Run one training step and report, per module, what it saved and what its checkpoints recomputed.

    Args:
        step: a callable doing one forward and backward pass (and, if you like, the optimizer
            step), e.g. ``lambda: model(**batch).loss.backward()``. It runs once.
        model: the root module, for the modules' names and for the memory tracker; None names
            each module from the outermost module that ran.
        *tracked: more modules or optimizers whose memory the tracker counts (as
            :func:`torchref.memory.peak_step_bytes`).

    Returns:
        :class:`TorchDiagnosis` (``str()`` is the per-module table and one line per problem).

    Raises:
        Whatever ``step`` raises.
    """
    watch = _Watch()

    def watched():
        with watch.hooks():
            step()

    peak_bytes, source = _measure_peak(watched, model, tracked)
    reports = _reports(watch, model)
    return TorchDiagnosis(tuple(reports), tuple(_problems(reports)), sum(watch.saved.values()), peak_bytes, source)


def _measure_peak(watched: Callable[[], None], model: nn.Module | None, tracked: tuple) -> tuple[int, str]:
    """Run the watched step under MemTracker, or under :class:`torchref.live_bytes.LiveBytesTracker`
    when MemTracker cannot hook the model (no model given, or frozen parameters: MemTracker registers
    a gradient hook on every parameter and raises on one that does not require grad)."""
    if model is not None and all(p.requires_grad for p in model.parameters()):
        measured = peak_step_bytes(watched, model, *tracked)
        return measured.peak_bytes, measured.source
    exclude = [t for m in (model, *tracked) if isinstance(m, nn.Module) for t in [*m.parameters(), *m.buffers()]]
    why = "no model given" if model is None else "the model has frozen parameters"
    return step_peak_bytes(watched, exclude), f"LiveBytesTracker, activations and temporaries ({why})"
