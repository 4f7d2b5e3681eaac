"""Render a neutral remat schedule onto a stack of PyTorch blocks, from outside the model.

Each :class:`jaxremat.spec.Segment` that is checkpointed runs through
``torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False, preserve_rng_state=True)``: during
the forward pass only its input (the segment boundary) survives, and its interior is recomputed in
the backward pass with the RNG state of the forward, so dropout masks replay exactly. Segments that
are not checkpointed run plainly. ``segments(s)`` and ``sqrt`` go through
``torch.utils.checkpoint.checkpoint_sequential``, whose split the spec copies; the per-block call
counts in ``tests/torchref/test_render.py`` check that the two agree.

The non-reentrant variant is used everywhere: the reentrant one silently drops gradients for inputs
that do not require grad, for kwargs and for ``backward(inputs=...)`` (PyTorch docs,
``torch.utils.checkpoint``). Source: Chen et al. 2016, arXiv:1604.06174.

State updated in the forward pass (BatchNorm running statistics, counters) is updated once per
step, as without remat: every checkpointed function is wrapped by
:class:`torchref.forward_state.ForwardState`, whose recomputes run on the pre-forward buffers
and leave the module state as the forward pass left it (plain ``checkpoint`` updates it twice).

Early stop is off in every checkpoint (``early_stop=False``; ``set_checkpoint_early_stop(False)``
around ``checkpoint_sequential``). With early stop, torch ends a recompute as soon as the last
tensor the backward needs has been saved again, by raising from the saved-tensor hook *at the
save*. An op that saves a tensor and then writes it in place -- ``rrelu_with_noise`` (``nn.RReLU``,
``F.rrelu`` in training mode) saves its ``noise`` buffer, created empty, before its kernel fills
it -- is stopped between the two: the backward reads the uninitialised buffer (NaN or 1e37
gradients that change from run to run). Off, the recompute runs each segment to its end, the
kernel fills the buffer, and every plan is bitwise (``tests/torchref/test_user_block.py``). The
cost, measured by ``python -m parity.experiments.early_stop_cost``: the ops after a segment's last save run
again (for the GPT block, the MLP's down-projection and the residual add: 3 more ATen ops per
segment in the backward pass); docs/framework-differences.md, section 10.

Blocks may be modules or callables over modules, with extra arguments given to every block
(:func:`forward_blocks`); a plan may be given as a string ``"SCHEDULE+POLICY"``.

Segment plans (``plan(3*2+save_dots,1+attention_only,4:store)``,
:mod:`jaxremat.spec.segment_plan`): each checkpointed segment runs under its own
:class:`torchref.policies.SelectiveCheckpoint`, made from the one passed as ``policy=`` with
:meth:`~torchref.policies.SelectiveCheckpoint.with_policy` (so the caller's object records what
every segment cached); segments that name no policy follow ``policy=``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential, set_checkpoint_early_stop

from jaxremat.spec import Schedule, Segments, Sqrt
from jaxremat.spec.lint import resolve_plan
from jaxremat.spec.plan import check_default_policy
from jaxremat.spec.policies import Policy

from .forward_state import ForwardState
from .lint import check_no_effect, check_selective
from .model import GPT, compute_context, lm_loss, split_tokens, torch_dtype
from .policies import SelectiveCheckpoint

CheckpointInputHook = Callable[[torch.Tensor], None]
EARLY_STOP = False
"""Checkpoint early stop, off in every checkpoint (module docstring: ops that write a saved tensor in
place). Only :mod:`torchref.early_stop_cost` turns it on, to measure what off costs; nested outer
segments run with it off either way."""


def _checkpoint(fn: Callable, x: torch.Tensor, early_stop: Optional[bool] = None, **kwargs) -> torch.Tensor:
    """``torch.utils.checkpoint.checkpoint`` non-reentrant, RNG state preserved, early stop as :data:`EARLY_STOP`."""
    return checkpoint(fn, x, use_reentrant=False, preserve_rng_state=True,
                      early_stop=EARLY_STOP if early_stop is None else early_stop, **kwargs)


def _bind(block: Callable, args: tuple, kwargs: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    """``block`` with the extra arguments of every block bound: ``x -> block(x, *args, **kwargs)``."""
    if not args and not kwargs:
        return block
    return lambda x: block(x, *args, **kwargs)


def run_segment(blocks: Sequence[Callable]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function applying ``blocks`` in order (the body of one segment)."""

    def run(x: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            x = block(x)
        return x

    return run


def _forward_checkpoint_sequential(
    blocks: list, bound: list, x: torch.Tensor, n_segments: int, starts: set[int],
    on_checkpoint_input: Optional[CheckpointInputHook], checkpointed: set[int] = frozenset(),
) -> torch.Tensor:
    """``checkpoint_sequential`` over ``bound`` (the blocks with their extra arguments bound),
    reporting each checkpointed segment's input once.

    The block that opens a checkpointed segment is wrapped so that it reports its input during this
    forward call only (not again when the segment is recomputed in the backward pass). Blocks in
    ``checkpointed`` are wrapped by :class:`ForwardState` (buffers updated once per step).
    """
    active = True

    def reporting(block: Callable) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(inp: torch.Tensor) -> torch.Tensor:
            if active and on_checkpoint_input is not None:
                on_checkpoint_input(inp)
            return block(inp)

        return run

    # Blocks of checkpointed segments run once in the forward pass and again in the recompute.
    stateful = [ForwardState([b]).wrap(f) if i in checkpointed else f for i, (b, f) in enumerate(zip(blocks, bound))]
    functions = [reporting(f) if i in starts else f for i, f in enumerate(stateful)]
    try:
        with set_checkpoint_early_stop(EARLY_STOP):  # checkpoint_sequential takes no early_stop argument
            return checkpoint_sequential(functions, n_segments, x, use_reentrant=False, preserve_rng_state=True)
    finally:
        active = False


def _as_selective(policy) -> Optional[SelectiveCheckpoint]:
    if policy is None or isinstance(policy, SelectiveCheckpoint):
        return policy
    return SelectiveCheckpoint(policy)


def _checkpointed(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                  sac: Optional[SelectiveCheckpoint], blocks: Sequence[Callable] = ()) -> torch.Tensor:
    """``run(x)`` under non-reentrant checkpoint, selective when the policy keeps anything.

    ``blocks`` are the segment's blocks, whose buffers the recompute must not update again
    (:class:`torchref.forward_state.ForwardState`).
    """
    if sac is not None and not sac.checkpoints:  # save_everything: keep what autograd keeps
        return run(x)
    kwargs = {"context_fn": sac.context_fn} if sac is not None and sac.selective else {}
    return _checkpoint(ForwardState(blocks).wrap(run), x, **kwargs)


def forward_blocks(
    blocks: Sequence[Callable], x: torch.Tensor, schedule: "Schedule | str", *block_args: Any,
    policy: "Policy | str | SelectiveCheckpoint | None" = None,
    on_checkpoint_input: Optional[CheckpointInputHook] = None,
    **block_kwargs: Any,
) -> torch.Tensor:
    """Run ``x`` through ``blocks`` under ``schedule``: ``x = block(x, *block_args, **block_kwargs)``.

    Args:
        blocks: the N blocks of the stack, applied in order: ``nn.Module`` s, or callables holding
            them (a function or lambda over a module, ``functools.partial(module, ...)``, a bound
            ``module.forward``; see :func:`torchref.forward_state.modules_of`). Each maps a tensor
            to a tensor of the same shape (for :class:`torchref.model.Block`, ``(B, T, D)``).
        x: input of the first block.
        schedule: a :mod:`jaxremat.spec.schedules` value, its name (``"sqrt"``, ``"every_k(2)"``)
            or a plan ``"SCHEDULE+POLICY"`` (``"full+save_dots"``); nested schedules recompute each
            checkpointed outer segment under the inner schedule (nested non-reentrant checkpoints);
            a segment plan (``"plan(3*2+save_dots,4:store)"``) gives each segment its own policy.
        *block_args: extra positional arguments given to every block after ``x`` (e.g. a
            ``(B, T)`` attention mask); tensors among them get their gradients as without remat.
        policy: what checkpointed segments keep inside (a policy name, a
            :class:`jaxremat.spec.policies.Policy`, or a :class:`torchref.policies.SelectiveCheckpoint`
            to read its records); None keeps nothing. For nested schedules it applies to the inner
            segments only. For a segment plan it is the default of the segments that name no
            policy of their own (a segment's own policy wins); a SelectiveCheckpoint passed here
            records every segment's cached outputs.
        on_checkpoint_input: called with the input tensor of each (outer) checkpointed segment,
            once, during this forward pass (e.g.
            :meth:`torchref.memory.SavedActivationRecorder.record_boundary`).
        **block_kwargs: extra keyword arguments given to every block (e.g. ``positions=pos``).

    Returns:
        Output of the last block, same shape and dtype as ``x``.

    Raises:
        ValueError: the schedule is invalid for ``len(blocks)`` (e.g. ``segments(s)`` with s > N),
            is not a schedule (a tensor in its place), the policy is unknown, given twice (in the
            plan and as ``policy=``) or cannot be rendered in PyTorch, or keeps something while
            every checkpointed segment of a segment plan names its own
            (:func:`jaxremat.spec.plan.check_default_policy`).
        torchref.forward_state.StateWriteError: a block given as a callable writes a tensor in
            place that is no buffer of a module it holds (the recompute would write it again).
        RuntimeError: the plan checkpoints something and runs inside ``torch.func.grad`` (``vjp``,
            ``jacrev``, ``hessian``) or inside ``torch.func.vmap`` with autograd on, which cannot run
            ``torch.utils.checkpoint`` (:func:`check_no_functorch`: the message says what to use).

    Warns:
        RematPolicyWarning: the policy keeps nothing it names in these blocks (no op in a kept
            :func:`torchref.names.activation` region, or no matrix product for ``save_dots``), or
            the schedule checkpoints nothing (:mod:`torchref.lint`).
    """
    schedule, policy = resolve_plan(schedule, policy)
    blocks = list(blocks)
    segs = schedule.segments_for(len(blocks))  # ValueError when invalid for N, before any lint
    sac = _as_selective(policy)
    if any(s.checkpointed for s in segs) and (sac is None or sac.checkpoints):
        check_no_functorch(schedule, sac)
    check_default_policy(segs, None if sac is None or sac.policy.saves_nothing else sac.policy.name, "forward_blocks")
    check_no_effect(schedule, policy, len(blocks))
    return _forward(blocks, x, schedule, block_args, block_kwargs, sac, on_checkpoint_input)


_TORCH_FUNC_ALTERNATIVES = (
    "run the blocks with schedule 'none' under torch.func (no remat), or take per-sample gradients without "
    "torch.func: a loop over the samples (or microbatches) calling backward() under this plan, or JAX, where "
    "jaxremat.remat_scan composes with jax.vmap(jax.grad(...)) (docs/framework-differences.md, section 10)")


def check_no_functorch(schedule: Schedule, sac: Optional[SelectiveCheckpoint], where: str = "forward_blocks") -> None:
    """Refuse a checkpointing plan inside a ``torch.func`` transform that cannot run it.

    Non-reentrant ``torch.utils.checkpoint`` is made of saved-tensor hooks, which torch 2.13's
    ``torch.func.grad`` / ``vjp`` / ``jacrev`` / ``hessian`` refuse ("don't yet support saved tensor
    hooks"); under ``torch.func.vmap`` with autograd on, the recompute runs in the backward pass outside
    the vmap and fails there ("tensor may have escaped from inside a function being vmapped").
    ``torch.func.jvp`` and a vmap under ``torch.no_grad()`` (no checkpoint runs) are let through.

    Raises:
        RuntimeError: one line naming the transform, the cause and what to use instead.
    """
    stack = torch._C._functorch.get_interpreter_stack() or []
    kinds = {str(i.key()).rsplit(".", 1)[-1] for i in stack}
    plan = schedule.name + (f"+{sac.policy.name}" if sac is not None and sac.selective else "")
    if "Grad" in kinds:
        raise RuntimeError(
            f"{where}: plan {plan!r} checkpoints segments with torch.utils.checkpoint, whose saved-tensor hooks "
            f"torch.func.grad/vjp/jacrev/hessian cannot differentiate through (torch says \"don't yet support saved "
            f"tensor hooks\"); {_TORCH_FUNC_ALTERNATIVES}")
    if "Vmap" in kinds and torch.is_grad_enabled():
        raise RuntimeError(
            f"{where}: plan {plan!r} under torch.func.vmap with autograd on: the checkpoint's recompute runs in the "
            "backward pass, outside the vmap, where torch fails (\"tensor may have escaped from inside a function "
            "being vmapped\"); vmap the forward under torch.no_grad() for inference, or "
            f"{_TORCH_FUNC_ALTERNATIVES}")


def _segment_contexts(segs, sac: Optional[SelectiveCheckpoint]) -> list:
    """Per segment, the SelectiveCheckpoint it runs under: its own policy's (recording into ``sac``), else ``sac``."""
    made: dict = {}
    out = []
    for seg in segs:
        if seg.policy is None:
            out.append(sac)
            continue
        if seg.policy not in made:
            made[seg.policy] = sac.with_policy(seg.policy) if sac is not None else SelectiveCheckpoint(seg.policy)
        out.append(made[seg.policy])
    return out


def _forward(blocks: list, x: torch.Tensor, schedule: Schedule, block_args: tuple, block_kwargs: dict,
             sac: Optional[SelectiveCheckpoint], on_checkpoint_input: Optional[CheckpointInputHook]) -> torch.Tensor:
    """:func:`forward_blocks` after the plan is resolved (nested segments call it for their interior)."""
    bound = [_bind(b, block_args, block_kwargs) for b in blocks]
    segs = schedule.segments_for(len(blocks))
    plain_policy = sac is None or (sac.checkpoints and not sac.selective)
    if isinstance(schedule, (Segments, Sqrt)) and plain_policy:
        starts = {s.start for s in segs if s.checkpointed}
        inside = {i for s in segs if s.checkpointed for i in range(s.start, s.stop)}
        return _forward_checkpoint_sequential(blocks, bound, x, len(segs), starts, on_checkpoint_input, inside)
    contexts = _segment_contexts(segs, sac)
    linted = []  # each selective context of a checkpointed segment, once (none under no_grad: no checkpoint runs)
    for seg, ctx in zip(segs, contexts if torch.is_grad_enabled() else ()):
        if (seg.checkpointed and seg.inner is None and ctx is not None and ctx.checkpoints and ctx.selective
                and all(ctx is not c for c in linted)):
            linted.append(ctx)
    for ctx in linted:
        ctx.start_lint()
    for seg, ctx in zip(segs, contexts):
        run = run_segment(bound[seg.start:seg.stop])
        if not seg.checkpointed:
            x = run(x)
            continue
        if on_checkpoint_input is not None:
            on_checkpoint_input(x)
        if seg.inner is None:
            x = _checkpointed(run, x, ctx, blocks[seg.start:seg.stop])
        else:
            # Early stop off, whatever EARLY_STOP says: it would end the outer recompute once the last
            # inner boundary exists, so the last inner segment would be rebuilt from the outer
            # forward's graph, without the policy.
            body = _nested_segment(blocks[seg.start:seg.stop], seg.inner, sac, block_args, block_kwargs)
            x = _checkpoint(ForwardState(blocks[seg.start:seg.stop]).wrap(body), x, early_stop=False)
    for ctx in linted:
        check_selective(ctx)
    return x


def _nested_segment(blocks: Sequence[Callable], inner: Schedule, sac: Optional[SelectiveCheckpoint],
                    block_args: tuple, block_kwargs: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    """The body of a checkpointed outer segment: its blocks under the inner schedule.

    The first call is the outer forward pass, whose interior the outer checkpoint discards; a
    selective policy there would still cache its outputs for the whole forward pass (each inner
    checkpoint's cache lives as long as its autograd node), so the inner segments keep nothing
    then. Later calls are the outer recompute, where the inner segments follow the policy.
    """
    calls = 0

    def run(x: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        first = calls == 1 and sac is not None and sac.checkpoints and sac.selective
        return _forward(list(blocks), x, inner, block_args, block_kwargs, None if first else sac, None)

    return run


def model_loss(
    model: GPT, tokens: torch.Tensor, schedule: Schedule, *,
    policy: "Policy | str | SelectiveCheckpoint | None" = None,
    on_checkpoint_input: Optional[CheckpointInputHook] = None,
) -> torch.Tensor:
    """Mean next-token cross-entropy of ``model`` with its blocks run under ``schedule``.

    ``embed`` and ``head`` (with the loss) run plainly, as the blocks' surroundings. With
    ``model.cfg.compute_dtype`` set, embedding, blocks and head run under
    :func:`torchref.model.compute_context` (``torch.autocast``) and the logits are cast back to
    the parameter dtype before the loss, as :func:`jaxremat.model.head` does.

    Args:
        model: the transformer.
        tokens: ``(B, T+1)`` integer token ids; inputs ``tokens[:, :-1]``, targets ``tokens[:, 1:]``.
        schedule: remat schedule for ``model.blocks``.
        policy: see :func:`forward_blocks`.
        on_checkpoint_input: see :func:`forward_blocks`.

    Returns:
        0-d loss tensor in the model dtype, attached to the autograd graph.

    Raises:
        ValueError: bad tokens (rank, dtype, ids out of range, too long) or a schedule invalid for
            ``n_layer``.
    """
    inputs, targets = split_tokens(tokens)
    with compute_context(model.cfg):
        x = model.embed(inputs)
        x = forward_blocks(model.blocks, x, schedule, policy=policy, on_checkpoint_input=on_checkpoint_input)
        logits = model.head(x)
    return lm_loss(logits.to(torch_dtype(model.cfg)), targets)
