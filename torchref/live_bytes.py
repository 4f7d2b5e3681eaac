"""Peak bytes allocated during a PyTorch step on any device, counted per storage (lean, O(1) per op).

``torch.distributed._tools.mem_tracker.MemTracker`` measures the same thing on CPU and also files
every allocation under the module that made it; that bookkeeping grows with the number of
modules, and at 64 blocks one step takes minutes on 2 cores. :class:`LiveBytesTracker` keeps only
the total: a ``TorchDispatchMode`` that adds the size of each new storage an op returns and
subtracts it when the storage is freed (a weak reference's callback, MemTracker's own mechanism).
Storages that existed before (parameters, gradients, buffers, passed as ``exclude``) are never
counted, so in-place updates of gradients do not count either. The result is the peak of
activations and temporaries of the step: MemTracker's peak less its PARAM, BUFFER, GRAD and OPT
categories (``tests/torchref/test_block_memory.py`` checks the two agree).
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


class LiveBytesTracker(TorchDispatchMode):
    """Live and peak bytes of the storages created while the mode is active.

    Args:
        exclude: tensors whose storages existed before and must not be counted.

    Attributes:
        live_bytes: bytes of tracked storages still alive.
        peak_bytes: the largest ``live_bytes`` seen.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        super().__init__()
        self._seen = WeakIdKeyDictionary()
        for t in exclude:
            if isinstance(t, torch.Tensor):
                self._seen[t.untyped_storage()] = None
        self.live_bytes = 0
        self.peak_bytes = 0

    def _freed(self, nbytes: int, _ref) -> None:
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            st = t.untyped_storage()
            if st in self._seen:
                continue
            nbytes = int(st.nbytes())
            self._seen[st] = weakref.ref(st, partial(self._freed, nbytes))
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out


def step_peak_bytes(step_fn: Callable[[], Any], exclude: Iterable[torch.Tensor]) -> int:
    """Run ``step_fn()`` under a :class:`LiveBytesTracker`; return its peak bytes (> 0).

    Raises:
        RuntimeError: nothing was allocated (a silent 0 is never returned).
    """
    tracker = LiveBytesTracker(exclude)
    with tracker:
        step_fn()
    if tracker.peak_bytes <= 0:
        raise RuntimeError("LiveBytesTracker saw no allocation during the step")
    return tracker.peak_bytes
