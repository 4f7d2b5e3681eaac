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
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.nn as nn

__all__ = ["ForwardState"]


class ForwardState:
    """Counts the calls of one checkpointed segment and isolates its recomputes from buffer updates.

    Args:
        modules: the segment's modules (their submodules are included); non-modules are ignored.

    Use one instance per checkpoint call: ``checkpoint(ForwardState(blocks).wrap(run), x, ...)``.
    """

    def __init__(self, modules: Iterable[object]):
        self.modules = [m for m in modules if isinstance(m, nn.Module)]
        self.calls = 0
        self.state: list[tuple[nn.Module, str, torch.Tensor]] = []  # (owner, name, value before forward)

    def _buffers(self):
        seen = set()
        for m in self.modules:
            for owner in m.modules():
                if id(owner) in seen:
                    continue
                seen.add(id(owner))
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
        with torch.no_grad():
            before = [(owner, name, buf, buf._version, buf.detach().clone()) for owner, name, buf in self._buffers()]
        out = fn(*args, **kwargs)
        self.state = [(owner, name, copy) for owner, name, buf, version, copy in before
                      if owner._buffers.get(name) is not buf or buf._version != version
                      or not torch.equal(buf, copy)]
        return out

    def _recompute(self, fn, *args, **kwargs):
        current = [(owner, name, owner._buffers.get(name)) for owner, name, _ in self.state]
        try:
            with torch.no_grad():
                for owner, name, before in self.state:
                    owner._buffers[name] = before.clone()  # fresh: the recompute may update it
            return fn(*args, **kwargs)
        finally:
            for owner, name, value in current:
                owner._buffers[name] = value
