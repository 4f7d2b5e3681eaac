"""Render a neutral :class:`jaxremat.spec.policies.Policy` as PyTorch selective checkpointing.

:class:`SelectiveCheckpoint` is a ``context_fn`` for ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False, context_fn=...)`` built on ``create_selective_checkpoint_contexts``. Its
policy function sees every ATen op of the checkpointed forward and answers ``MUST_SAVE`` for:

* ops inside an activation region (:func:`torchref.names.activation`) whose name the policy keeps
  or offloads -- keyed on where the op sits in the block, never on tensor shapes;
* matrix products when the policy keeps dots: ``mm``/``addmm`` (no batch dimensions) and, for
  ``save_dots``, ``bmm``/``baddbmm`` (per-head products, batched over B*H).

Views (``view``, ``transpose``, ``t``, ...) are never saved: they cost nothing to redo. Everything
else is ``PREFER_RECOMPUTE``.

How PyTorch's recompute differs from JAX's (docs/framework-differences.md): torch replays the
whole checkpointed function in the backward pass and returns the cached output for each saved op
instead of running it; every op that is not saved runs again, even when nothing needs its output
(e.g. ``ln_1`` under ``save_qkv_proj``). JAX recomputes only what the backward pass needs.

Offload: outputs of offloaded ops are copied to host memory (pinned when the source is a CUDA
tensor) as they are cached, and copied back to their device when the recompute asks for them.
The cache is PyTorch's own selective-checkpoint storage (``torch.utils.checkpoint``, torch
2.13): the forward mode (a subclass of torch's ``_CachingTorchDispatchMode``) and the recompute
mode returned by ``create_selective_checkpoint_contexts`` share one offloading ``storage``;
``tests/torchref/test_policies.py`` fails if that internal changes.

Several recomputes of one segment. torch marks a cache entry ``_CONSUMED`` when the recompute
reads it, so a second recompute (``torch.autograd.grad`` inside the block, a double backward, a
second ``backward(retain_graph=True)``) raised "Trying to backward an extra time". The entries are
kept instead (freed with the checkpoint's saved tensors), and a recompute that starts while the
segment's forward is still running -- a gradient taken inside the block -- runs every op as a plain
checkpoint's recompute, with caching paused (:class:`_Recompute`), since the cache is not complete
yet. ``tests/torchref/test_user_block.py`` checks all three cases bitwise against no remat.

``save_everything`` is rendered as no checkpoint at all (autograd keeps what it keeps without
remat). A policy that keeps ``block_input`` cannot be rendered: torch replays a checkpointed
segment from its start, so a kept block input would not spare any recompute (ValueError).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import torch
import torch.utils.checkpoint as _checkpoint
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from jaxremat.spec.policies import Policy, parse_policy

from .names import current_name

aten = torch.ops.aten
DOTS_NO_BATCH = frozenset({aten.mm.default, aten.addmm.default})
DOTS_BATCHED = frozenset({aten.bmm.default, aten.baddbmm.default})
DOTS_OUT = frozenset({aten.mm.out, aten.addmm.out, aten.bmm.out, aten.baddbmm.out})
"""Matrix products writing into a given buffer (``out=``), the form torch.compile's inductor kernels call:
never kept (torch refuses a cached tensor an out= op wrote), counted for the lint's message."""
_NOT_COMPUTE = frozenset({aten._unsafe_view.default, aten.alias.default, aten.detach.default})


def is_view_op(op) -> bool:
    """True for ATen ops that only re-describe memory (never worth saving)."""
    return bool(getattr(op, "is_view", False)) or op in _NOT_COMPUTE


@dataclasses.dataclass
class SavedRecord:
    """One op output a selective checkpoint kept during a forward pass.

    Attributes:
        name: activation region of the op (None outside any region, e.g. a dot kept by class).
        op: ATen overload name, e.g. ``"aten.addmm.default"``.
        shapes: shape of each tensor output.
        dtype: dtype of the first output (``"float32"``).
        bytes: total bytes of the tensor outputs.
        offloaded: True when the output went to host memory.
    """

    name: str | None
    op: str
    shapes: list
    dtype: str
    bytes: int
    offloaded: bool


class _HostCopy:
    """A cached op output held in host memory; ``get_val`` brings it back to its device."""

    def __init__(self, wrapper: Any):
        t = wrapper.val
        self.device = t.device
        if t.is_cuda:
            self.val = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
        else:
            self.val = t.to("cpu", copy=True)

    def get_val(self, allow_cache_entry_mutation: bool) -> torch.Tensor:
        return self.val.to(self.device, non_blocking=True)


_CONSUMED = getattr(_checkpoint, "_CONSUMED", None)  # torch's mark for a cache entry the recompute took


class _OffloadingEntries(dict):
    """Per-op cache of one checkpoint: entries flagged by the policy go to host memory.

    An entry is kept when the recompute reads it (torch marks it consumed), so that a second
    recompute of the same segment -- ``torch.autograd.grad`` inside the block, a double backward
    (``create_graph=True``), ``retain_graph=True`` -- reads the forward's values again, as a plain
    checkpoint recomputes them again. The cache lives as long as the checkpoint's saved tensors
    (it is freed with them once the segment's backward has run), and reading an entry returns the
    same tensor, so no memory is added.
    """

    def __init__(self, owner: "SelectiveCheckpoint"):
        super().__init__()
        self._owner = owner

    def __setitem__(self, idx, entry):
        if entry is _CONSUMED and idx in self:
            return
        if self._owner._offload_next:
            self._owner._offload_next = False
            entry = tree_map(lambda w: _HostCopy(w) if hasattr(w, "val") else w, entry)
        super().__setitem__(idx, entry)


class _ForwardCache(_checkpoint._CachingTorchDispatchMode):
    """Torch's caching mode of the forward pass, which knows when it is active and can be paused.

    Paused, it runs ops without caching them: a recompute that happens *during* the forward pass
    (``torch.autograd.grad`` inside the block) must not add entries to the cache being filled.
    """

    def __init__(self, policy_fn, storage):
        super().__init__(policy_fn, storage)
        self.active = 0
        self.paused = 0

    def __enter__(self):
        self.active += 1
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self.active -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.paused:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


class _Recompute:
    """The recompute context: torch's cached mode, or a plain recompute while the forward is running.

    A gradient taken inside the block's forward pass recomputes the segment before the forward
    has cached all its ops; that recompute runs as a plain checkpoint's does (every op again, the
    caching paused), and the backward pass's recompute later reads the full cache.
    """

    def __init__(self, cached, forward: _ForwardCache):
        self.cached, self.forward = cached, forward
        self.storage = cached.storage
        self._entered: list[bool] = []

    def __enter__(self):
        plain = self.forward.active > 0
        self._entered.append(plain)
        if plain:
            self.forward.paused += 1
            return self
        return self.cached.__enter__()

    def __exit__(self, *exc):
        if self._entered.pop():
            self.forward.paused -= 1
            return False
        return self.cached.__exit__(*exc)


class SelectiveCheckpoint:
    """A policy rendered as ``context_fn`` for non-reentrant ``torch.utils.checkpoint``.

    Args:
        policy: a :class:`jaxremat.spec.policies.Policy` or a name accepted by
            :func:`jaxremat.spec.policies.parse_policy`.
        record: keep a :class:`SavedRecord` for each output cached in a forward pass.

    Attributes:
        policy: the parsed policy.
        records: what the forward passes kept, in order (cleared by :meth:`clear`).

    Raises:
        ValueError: unknown policy, or a policy that keeps ``block_input`` (see module docstring).

    Source: ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` (PyTorch >= 2.4).
    """

    def __init__(self, policy: "Policy | str | None", record: bool = True):
        self.policy = parse_policy(policy)
        if "block_input" in self.policy.kept_names | self.policy.offloaded_names and not self.policy.save_everything:
            raise ValueError(
                f"policy {self.policy.name!r} keeps 'block_input', which PyTorch cannot use: a checkpointed "
                "segment is replayed from its start; use a schedule with shorter segments instead"
            )
        self.record = record
        self.records: list[SavedRecord] = []
        self._decisions: dict = {}  # (op, region) -> (save, offload, out= product name or None)
        self._offload_next = False
        self.start_lint()

    def with_policy(self, policy: "Policy | str") -> "SelectiveCheckpoint":
        """A SelectiveCheckpoint for ``policy`` that records into this one's :attr:`records`.

        A segment plan's segments each follow their own policy; the renderer gives each its own
        context from the one the caller passed, so :meth:`kept_bytes`, :meth:`offloaded_bytes` and
        :attr:`records` of the caller's object cover every segment.

        Raises:
            ValueError: as the constructor.
        """
        child = SelectiveCheckpoint(policy, record=self.record)
        child.records = self.records
        return child

    def start_lint(self) -> None:
        """Reset what :func:`torchref.lint.check_selective` reads: regions seen, ops saved."""
        self.lint_seen: set[str] = set()
        self.lint_saved = 0
        self.lint_out_dots: dict[str, int] = {}  # out= products seen (DOTS_OUT), by op name

    @property
    def checkpoints(self) -> bool:
        """False for ``save_everything`` (rendered as no checkpoint at all)."""
        return not self.policy.save_everything

    @property
    def selective(self) -> bool:
        """False when the policy saves nothing (a plain checkpoint needs no context)."""
        return not self.policy.saves_nothing

    def clear(self) -> None:
        """Forget the records (call before a new forward pass)."""
        self.records.clear()

    def _decide(self, op, name: str | None) -> tuple[bool, bool]:
        """(save, offload) for one op in region ``name``."""
        if is_view_op(op):
            return False, False
        p = self.policy
        if name in p.offload_names or (p.offload_dots == "no_batch" and op in DOTS_NO_BATCH):
            return True, True
        if name in p.save_names:
            return True, False
        if p.save_dots == "all" and op in DOTS_NO_BATCH | DOTS_BATCHED:
            return True, False
        if p.save_dots == "no_batch" and op in DOTS_NO_BATCH:
            return True, False
        return False, False

    def policy_fn(self, ctx, op, *args, **kwargs) -> CheckpointPolicy:
        """The selective-checkpoint policy function (called once per op in the forward pass and the recompute).

        The decision depends on the op and its region only, so it is computed once per (op, region) and kept:
        this function runs for every op of every checkpointed block.
        """
        name = current_name()
        hit = self._decisions.get((op, name))
        if hit is None:
            hit = self._decisions[(op, name)] = (*self._decide(op, name), str(op) if op in DOTS_OUT else None)
        save, offload, out_dot = hit
        if name is not None:
            self.lint_seen.add(name)
        self.lint_saved += save
        if out_dot is not None:
            self.lint_out_dots[out_dot] = self.lint_out_dots.get(out_dot, 0) + 1
        if not save:
            return CheckpointPolicy.PREFER_RECOMPUTE
        self._offload_next = offload
        if self.record:
            outs = [t for t in torch.utils._pytree.tree_leaves(ctx.op_output) if isinstance(t, torch.Tensor)]
            self.records.append(SavedRecord(
                name=name, op=str(op), shapes=[tuple(t.shape) for t in outs],
                dtype=str(outs[0].dtype).removeprefix("torch.") if outs else "",
                bytes=int(sum(t.nbytes for t in outs)), offloaded=offload,
            ))
        return CheckpointPolicy.MUST_SAVE

    def context_fn(self):
        """``(forward_context, recompute_context)`` for one ``checkpoint`` call."""
        _, rec = create_selective_checkpoint_contexts(self.policy_fn)
        if not hasattr(rec, "storage") or _CONSUMED is None:
            raise RuntimeError("this torch version's selective-checkpoint modes have no 'storage' or '_CONSUMED' "
                               "mark; torchref.policies needs torch 2.13's layout")
        storage = defaultdict(lambda: _OffloadingEntries(self))
        rec.storage = storage
        fwd = _ForwardCache(self.policy_fn, storage)
        return fwd, _Recompute(rec, fwd)

    def kept_bytes(self) -> int:
        """Bytes cached on the device by the recorded forward passes."""
        return sum(r.bytes for r in self.records if not r.offloaded)

    def offloaded_bytes(self) -> int:
        """Bytes moved to host memory by the recorded forward passes."""
        return sum(r.bytes for r in self.records if r.offloaded)
