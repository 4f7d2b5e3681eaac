"""State updated in the forward pass (BatchNorm running statistics, step counters) under remat.

``torch.utils.checkpoint`` recomputes a segment by calling its function again, so a module that
updates a buffer in its forward pass (``nn.BatchNorm*``: ``running_mean``, ``running_var``,
``num_batches_tracked``) updates it twice per training step: once in the forward pass and once
in the recompute. After N steps the running statistics have seen every batch twice and the
counter reads 2N (``tests/torchref/test_running_stats.py`` shows it with plain ``checkpoint``).

:class:`ForwardState` wraps a segment's function so that its first call (the forward pass) runs
as is and every later call (a recompute) runs on the buffer values the forward pass started
from, in fresh tensors swapped in for the call, and then puts the forward pass's buffers back.
The recompute therefore computes the same outputs as the forward pass (a module whose output
reads the buffer sees the same value) and leaves no trace in the module state. Buffers are
swapped, never written in place, because a recomputed op may save the buffer for its backward
(``native_batch_norm`` saves the running statistics) and an in-place write would invalidate it.

Which buffers are state is measured, not declared: before the forward pass every buffer is
copied, and only those the forward pass changed are kept -- replaced, written in place (version
counter), or holding other values (``native_batch_norm`` writes the running statistics without
moving their version counter); constants such as the attention's causal mask are dropped.

Blocks given as callables (a lambda or function over a module, ``functools.partial(module, ...)``,
a bound ``module.forward``): the modules they hold are found by :func:`modules_of` (closure cells,
default arguments, partial arguments, bound ``self``, module-level names the code reads, and the
lists, tuples and dicts among them). A state write the search cannot see -- an in-place write to a
tensor that existed before the call and is no buffer of a found module -- would be repeated by the
recompute, silently; the forward pass of a callable therefore runs under :class:`_WriteGuard`, which
raises :class:`StateWriteError` saying how to pass the block instead.

Forward hooks are forward-pass state too: the forward pass records the hooks of the segment's
modules, and every recompute runs exactly those (:class:`torchref.hooks.ForwardHooks`), with
:func:`torchref.hooks.is_recomputing` True, so a hook removed before ``backward()`` still shapes the
recomputed activations and a hook that must act once per step can skip the recompute.
"""

from __future__ import annotations

import functools
import types
from typing import Callable, Iterable

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import is_fake
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .hooks import ForwardHooks, owners_of, recomputing

__all__ = ["ForwardState", "StateWriteError", "modules_of"]

_MAX_DEPTH = 4  # how far modules_of follows functions into functions


class StateWriteError(RuntimeError):
    """A block passed as a callable wrote a tensor the recompute cannot restore (see module docstring)."""


def modules_of(block: object) -> list[nn.Module]:
    """The ``nn.Module`` s a block holds: itself if it is one, else what its callable closes over.

    Args:
        block: an ``nn.Module``, or a callable (function, lambda, ``functools.partial``, bound
            method, object with ``__call__``).

    Returns:
        The modules found, each once, in the order found (submodules are not listed: they belong
        to their parents).
    """
    found: dict[int, nn.Module] = {}
    _collect(block, found, set(), 0)
    return list(found.values())


def _collect(obj: object, found: dict, seen: set, depth: int) -> None:
    if id(obj) in seen or depth > _MAX_DEPTH:
        return
    seen.add(id(obj))
    if isinstance(obj, nn.Module):
        found.setdefault(id(obj), obj)
        return
    for child in _children(obj):
        _collect(child, found, seen, depth + (1 if isinstance(obj, types.FunctionType) else 0))


def _children(obj: object) -> list:
    """The objects ``obj`` refers to that may hold modules (see :func:`modules_of`)."""
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, types.MethodType):
        return [obj.__self__, obj.__func__]
    if isinstance(obj, types.FunctionType):
        cells = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        names = [obj.__globals__[n] for n in _code_names(obj.__code__) if n in obj.__globals__]
        return cells + list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values()) + names
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, dict):
        return list(obj.values())
    if callable(obj) and hasattr(obj, "__dict__") and not isinstance(obj, type):
        return [getattr(type(obj), "__call__", None), *vars(obj).values()]
    return []


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a name assigned after the closure was made)
        return False
    return True


def _code_names(code: types.CodeType) -> list[str]:
    """Global names read by ``code`` and by the code objects nested in it (inner lambdas)."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _code_names(const)
    return names


class _WriteGuard(TorchDispatchMode):
    """Records in-place writes to tensors that existed before the call (not created inside it)."""

    def __init__(self, allowed: Iterable[torch.Tensor]):
        super().__init__()
        self.allowed = {_storage(t) for t in allowed}
        self.created: set[int] = set()
        self.unseen: list[tuple[str, tuple]] = []  # (op, shape) of writes nobody can restore

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema.arguments
        written = [args[i] if i < len(args) else kwargs.get(arg.name) for i, arg in enumerate(schema)
                   if arg.alias_info is not None and arg.alias_info.is_write]
        for t in tree_leaves(written):
            if isinstance(t, torch.Tensor) and t.numel() and _storage(t) not in self.created | self.allowed:
                self.unseen.append((str(func), tuple(t.shape)))
        out = func(*args, **kwargs)
        if not any(r.alias_info is not None for r in func._schema.returns):
            self.created.update(_storage(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def _storage(t: torch.Tensor) -> int:
    try:
        if is_fake(t) or t.is_meta:  # no memory, address 0: the storage object (one per storage) stands for it
            return id(t.untyped_storage())
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (subclasses)
        return id(t)


def _same_values(buf: torch.Tensor, copy: torch.Tensor) -> bool:
    """``torch.equal(buf, copy)``; True for fake or meta tensors, which hold no values.

    Under ``torch._subclasses.fake_tensor.FakeTensorMode`` (a memory estimate, :mod:`torchref.estimate`)
    the comparison would be data-dependent and raise; there only the identity and the version counter
    tell a state buffer from a constant. A buffer written without moving its counter (BatchNorm's
    running statistics) is then dropped like a constant: its copy is freed one call earlier, a few
    bytes of the estimate, and no values exist to be wrong.
    """
    if is_fake(buf) or buf.is_meta:
        return True
    return torch.equal(buf, copy)


class ForwardState:
    """Counts the calls of one checkpointed segment and isolates its recomputes from buffer updates.

    Args:
        blocks: the segment's blocks: modules (their submodules are included) or callables holding
            modules (found by :func:`modules_of`).

    Use one instance per checkpoint call: ``checkpoint(ForwardState(blocks).wrap(run), x, ...)``.

    Raises (from the wrapped function's first call):
        StateWriteError: a block given as a callable wrote a tensor in place that is no buffer of a
            module :func:`modules_of` found, so its recompute could not be isolated.
    """

    def __init__(self, blocks: Iterable[object]):
        blocks = list(blocks)
        self.guarded = any(not isinstance(b, nn.Module) for b in blocks)
        self.modules = [m for b in blocks for m in modules_of(b)]
        self.calls = 0
        self.state: list[tuple[nn.Module, str, torch.Tensor]] = []  # (owner, name, value before forward)
        self.hooks: ForwardHooks | None = None  # the forward pass's hooks, run again by every recompute

    def _buffers(self, owners: list[nn.Module]):
        for owner in owners:
            for name, buf in owner._buffers.items():
                if buf is not None:
                    yield owner, name, buf

    def wrap(self, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """``fn`` with its first call recorded and its later calls run on the pre-forward buffers."""

        def run(*args, **kwargs):
            self.calls += 1
            if self.calls == 1:
                return self._forward(fn, *args, **kwargs)
            return self._recompute(fn, *args, **kwargs)

        return run

    def _forward(self, fn, *args, **kwargs):
        owners = owners_of(self.modules)
        self.hooks = ForwardHooks(owners)
        with torch.no_grad():
            before = [(owner, name, buf, buf._version, buf.detach().clone()) for owner, name, buf in self._buffers(owners)]
        # Until the forward ends, a recompute (a gradient taken inside it) runs on every buffer's copy.
        self.state = [(owner, name, copy) for owner, name, _, _, copy in before]
        if self.guarded:
            out = self._guarded_call(fn, [b for _, _, b, _, _ in before], *args, **kwargs)
        else:
            out = fn(*args, **kwargs)
        self.state = [(owner, name, copy) for owner, name, buf, version, copy in before
                      if owner._buffers.get(name) is not buf or buf._version != version
                      or not _same_values(buf, copy)]
        return out

    def _guarded_call(self, fn, buffers, *args, **kwargs):
        params = [p for m in self.modules for p in m.parameters()]
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        guard = _WriteGuard(buffers + params + inputs)
        with guard:
            out = fn(*args, **kwargs)
        if guard.unseen:
            op, shape = guard.unseen[0]
            raise StateWriteError(
                f"a block passed as a callable wrote a tensor of shape {shape} in place ({op}) that is no buffer "
                f"of a module it holds ({len(self.modules)} found), so a recompute would write it again; pass the "
                "nn.Module itself, functools.partial(module, ...), or a function whose closure or defaults hold the "
                "module (lambda x, m=m: m(x, mask)), and keep such state in a registered buffer")
        return out

    def _recompute(self, fn, *args, **kwargs):
        current = [(owner, name, owner._buffers.get(name)) for owner, name, _ in self.state]
        try:
            with torch.no_grad():
                for owner, name, before in self.state:
                    owner._buffers[name] = before.clone()  # fresh: the recompute may update it
            with self.hooks.replayed(), recomputing():
                return fn(*args, **kwargs)
        finally:
            for owner, name, value in current:
                owner._buffers[name] = value
