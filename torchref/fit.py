"""One call to fit a PyTorch stack of blocks to a memory budget, checked on the allocator's peak.

:func:`plan_blocks` is the PyTorch twin of :func:`jaxremat.flax.plan_stack` (the same loop,
:func:`jaxremat.fit.fit_plan`): the menu of the first block (:func:`torchref.planner.block_options`),
the planner's least-recompute plan within the budget, the plan's measured peak activation bytes
(one forward and backward pass under :func:`torchref.render.forward_blocks`, counted by
:class:`torchref.live_bytes.LiveBytesTracker` with the parameters and their gradients, allocated
before the step and accumulated in place, left out: the peak of activations and temporaries, on
any device), and its gradients against ``none``'s byte for byte.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from jaxremat.spec.fit import FittedPlan, fit_plan
from jaxremat.spec.planner import Budget

from .live_bytes import step_peak_bytes
from .planner import DEFAULT_MENU, block_options
from .render import forward_blocks

__all__ = ["plan_blocks"]

def plan_blocks(blocks: Sequence[nn.Module], x: torch.Tensor, budget: "int | str | Budget", *,
                policies: Sequence = DEFAULT_MENU,
                loss: Callable[[torch.Tensor], torch.Tensor] | None = None) -> FittedPlan:
    """The least-recompute plan for ``forward_blocks(blocks, x, plan)`` within ``budget``, checked.

    Args:
        blocks: the N blocks, applied in order, each ``block(x) -> y`` of x's shape (alike: the first one's
            menu is used for all; their gradients are cleared).
        x: the stack's input, e.g. a (B, T, D) float32 tensor.
        budget: bytes (int), ``"2GiB"``, or ``"50%"`` of ``none``'s measured peak activation bytes.
        policies: the checkpoint options (:data:`torchref.planner.DEFAULT_MENU`).
        loss: ``y -> scalar`` the gradients are taken of (default: ``y.sum()``).

    Returns:
        :class:`jaxremat.fit.FittedPlan` (``plan``, measured ``peak_bytes`` and ``none_peak_bytes``,
        ``grads_bitwise_equal``).

    Raises:
        ValueError: no blocks, a bad budget or policy, or no plan measured within the budget (the message
            names the least reached and its plan).
    """
    blocks = list(blocks)
    if not blocks:
        raise ValueError("blocks is empty; give the N blocks of the stack, in order")
    loss = loss or (lambda y: y.sum())
    x = x.detach()
    menu = block_options(blocks[0], x, policies)

    def step(plan) -> None:
        for b in blocks:
            b.zero_grad(set_to_none=False)  # the gradients stay allocated: accumulated in place, never counted
        loss(forward_blocks(blocks, x, plan)).backward()

    def measure(plan) -> int:
        step(plan)  # allocates the gradients (first call) and warms the kernels
        state = [t for b in blocks for p in b.parameters() for t in (p, p.grad) if t is not None]
        return step_peak_bytes(lambda: step(plan), [*state, *(buf for b in blocks for buf in b.buffers()), x])

    def grads(plan) -> list[bytes]:
        step(plan)
        return [p.grad.detach().cpu().numpy().tobytes() for b in blocks for p in b.parameters() if p.grad is not None]

    def bitwise(plan) -> bool:
        return grads("none") == grads(plan)

    return fit_plan(menu, len(blocks), x.numel() * x.element_size(), budget, measure, bitwise)
