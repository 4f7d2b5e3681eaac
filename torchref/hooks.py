"""Forward hooks under remat: the recompute runs the hooks the forward pass ran, and can be told apart.

``torch.utils.checkpoint`` recomputes a segment by calling its modules again, so ``nn.Module``
forward hooks and pre-hooks run in the recompute as they are registered *then*, not as they were
in the forward pass:

* a hook registered for the forward pass and removed before ``backward()`` (an intervention or
  steering hook that adds to an output) is absent from the recompute, which then computes other
  activations than the forward did; torch compares only their shapes and dtypes, so the gradients
  were silently wrong;
* a hook that stays registered runs again in each recompute (a logging hook counts every step twice
  under ``full``).

:class:`ForwardHooks` records the forward hooks of a segment's modules (and the global ones,
``torch.nn.modules.module.register_module_forward_hook``) when the forward pass runs, and
:meth:`ForwardHooks.replayed` puts exactly those back for the recompute (and the current ones back
after it): the recompute runs the forward's hooks, whatever was registered or removed in between.
:class:`torchref.forward_state.ForwardState` does both for every checkpointed segment that
:func:`torchref.render.forward_blocks` runs, and marks the recompute, so that a hook that must run
once per step (logging, counting, capturing tensors for their ``.grad``) can ask
:func:`is_recomputing` and return early. torch offers no such flag for non-reentrant checkpoint
(``torch.utils.checkpoint``, torch 2.13: only a selective-checkpoint policy function is told
``ctx.is_recompute``).

A hook's own Python state is not replayed: a hook that reads an attribute changed between forward
and backward computes with the new value in the recompute (docs/framework-differences.md, section 10).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from typing import Iterable, Iterator

import torch.nn as nn
import torch.nn.modules.module as _module_globals

__all__ = ["ForwardHooks", "is_recomputing", "recomputing"]

MODULE_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                     "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
"""The per-module dicts ``nn.Module.__call__`` reads for forward hooks (torch 2.13)."""
GLOBAL_HOOK_DICTS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_always_called",
                     "_global_forward_hooks_with_kwargs")
"""The module-level dicts of ``torch.nn.modules.module`` that hold the global forward hooks."""

_state = threading.local()


def is_recomputing() -> bool:
    """True while torchref recomputes a checkpointed segment in the backward pass.

    A forward hook (or a block's own code) that must act once per step -- log, count, capture a
    tensor for its ``.grad`` -- returns early when this is True; a hook that changes an output must
    not (the recompute has to compute what the forward pass computed). Set on the thread that runs
    the recompute, for every checkpointed segment of :func:`torchref.render.forward_blocks` and
    :func:`torchref.render.model_loss` (plain, selective, ``checkpoint_sequential`` and nested
    segments, and a recompute run by a gradient taken inside a block); False in the forward pass and
    outside torchref's checkpoints (a plain ``torch.utils.checkpoint`` call does not set it).
    """
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def recomputing() -> Iterator[None]:
    """Mark the code inside as a recompute (:func:`is_recomputing` is True there); nests."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def owners_of(modules: Iterable[nn.Module]) -> list[nn.Module]:
    """Every module and submodule of ``modules``, each once, in order."""
    seen: dict[int, nn.Module] = {}
    for m in modules:
        for owner in m.modules():
            seen.setdefault(id(owner), owner)
    return list(seen.values())


_NO_HOOKS = tuple(OrderedDict() for _ in MODULE_HOOK_DICTS)


def _has_hooks(m: nn.Module) -> bool:
    d = m.__dict__
    return bool(d["_forward_pre_hooks"] or d["_forward_hooks"])


class ForwardHooks:
    """The forward hooks of ``owners`` (and the global ones) as they are now; put back by :meth:`replayed`.

    Args:
        owners: the modules whose hooks are recorded, submodules included (:func:`owners_of`).

    Only modules with hooks are copied (the ``..._with_kwargs`` and ``..._always_called`` dicts hold
    entries only for hooks in ``_forward_pre_hooks`` / ``_forward_hooks``); a module without
    hooks costs two dict lookups.
    """

    def __init__(self, owners: list[nn.Module]):
        self.owners = owners
        self.local = {id(m): tuple(m.__dict__[name].copy() for name in MODULE_HOOK_DICTS)
                      for m in owners if _has_hooks(m)}
        self.global_ = {name: d.copy() for name in GLOBAL_HOOK_DICTS if (d := getattr(_module_globals, name))}

    @contextlib.contextmanager
    def replayed(self) -> Iterator[None]:
        """Inside, every recorded module (and the global registry) has the recorded hooks exactly."""
        swapped: list[tuple[object, str, dict]] = []  # (module or module globals, name, current dict)
        try:
            for m in self.owners:
                recorded = self.local.get(id(m))
                if recorded is None and not _has_hooks(m):
                    continue
                for name, want in zip(MODULE_HOOK_DICTS, recorded or _NO_HOOKS):
                    current = m.__dict__[name]
                    if current != want:
                        swapped.append((m, name, current))
                        m.__dict__[name] = want.copy()
            for name in GLOBAL_HOOK_DICTS:
                current, want = getattr(_module_globals, name), self.global_.get(name)
                if (current or want) and current != want:
                    swapped.append((_module_globals, name, current))
                    setattr(_module_globals, name, want.copy() if want else OrderedDict())
            yield
        finally:
            for owner, name, current in reversed(swapped):
                if owner is _module_globals:
                    setattr(_module_globals, name, current)
                else:
                    owner.__dict__[name] = current
