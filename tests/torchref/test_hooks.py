"""Forward hooks on a user's blocks under remat, written as users write them.

A steering hook registered for the forward pass and removed before ``backward()`` shaped the forward
activations but not the recompute's, so gradients were silently wrong; a hook left registered ran
again in every recompute. Now every recompute runs the hooks the forward pass ran
(:class:`torchref.hooks.ForwardHooks`), and :func:`torchref.is_recomputing` lets a hook act once per step.
"""

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import torchref

N, B, D = 4, 3, 8
PLANS = ["full", "every_k(2)", "sqrt", "segments(2)", "nested(sqrt,sqrt)", "full+save_dots",
         "every_k(2)+save_dots_no_batch", "plan(2+save_dots,2)"]
# calls of a forward hook on each of the N blocks per step: forward + recompute (checkpointed blocks)
# (sqrt and segments(2) leave the last of 2 segments plain; nested(sqrt,sqrt) runs the inner checkpointed
# block 3 times: forward, outer recompute, inner recompute)
HOOK_CALLS = {"none": 4, "full": 8, "every_k(2)": 8, "sqrt": 6, "segments(2)": 6, "nested(sqrt,sqrt)": 7,
              "full+save_dots": 8, "every_k(2)+save_dots_no_batch": 8, "plan(2+save_dots,2)": 8}


def _blocks() -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D)) for _ in range(N))


def _x() -> torch.Tensor:
    return torch.randn(B, D, generator=torch.Generator().manual_seed(1))


def _grads(blocks) -> list[np.ndarray]:
    return [p.grad.numpy().copy() for p in blocks.parameters()]


def _bitwise(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.isfinite(x).all() and np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b))


def _steered(plan: str, register) -> list[np.ndarray]:
    """Gradients of a step whose forward ran with a steering hook that is removed before backward."""
    blocks = _blocks()
    steer = torch.full((D,), 0.5)
    handles = register(blocks, lambda module, inputs, output: output + steer)
    y = torchref.forward_blocks(blocks, _x(), plan)
    for h in handles:
        h.remove()
    y.square().sum().backward()
    return _grads(blocks)


def _on_first_linear(blocks, hook):
    return [b[0].register_forward_hook(hook) for b in blocks]


def _global(blocks, hook):
    return [nn.modules.module.register_module_forward_hook(
        lambda m, i, o: hook(m, i, o) if isinstance(m, nn.Linear) and m is blocks[0][0] else None)]


@pytest.mark.parametrize("plan", PLANS)
def test_hook_removed_before_backward_is_bitwise_under_every_plan(plan):
    want = _steered("none", _on_first_linear)
    assert _bitwise(_steered(plan, _on_first_linear), want)
    assert not _bitwise(_grads_without_steering(), want)  # the hook does change the gradients


def _grads_without_steering() -> list[np.ndarray]:
    blocks = _blocks()
    torchref.forward_blocks(blocks, _x(), "none").square().sum().backward()
    return _grads(blocks)


def test_global_hook_removed_before_backward_is_bitwise():
    assert _bitwise(_steered("sqrt", _global), _steered("none", _global))


def test_plain_checkpoint_recomputes_without_the_removed_hook():
    # what torch itself does (why the renderer records the hooks): the recompute computes other
    # activations and the gradients differ, with no error (torch checks only shapes and dtypes)
    got = []
    for ckpt in (False, True):
        blocks = _blocks()
        handle = blocks[0][0].register_forward_hook(lambda m, i, o: o + 0.5)
        run = lambda x: blocks[1](blocks[0](x))  # noqa: E731
        y = checkpoint(run, _x(), use_reentrant=False) if ckpt else run(_x())
        handle.remove()
        y.square().sum().backward()
        got.append(_grads(blocks[:2]))
    assert not _bitwise(got[1], got[0])


def test_hook_added_after_the_forward_pass_does_not_run_in_its_recompute():
    blocks = _blocks()
    y = torchref.forward_blocks(blocks, _x(), "full")
    blocks[0][0].register_forward_hook(lambda m, i, o: o * 2)  # meant for the next step
    y.square().sum().backward()
    assert _bitwise(_grads(blocks), _grads_without_steering())


@pytest.mark.parametrize("plan", ["none", *PLANS])
def test_hook_left_registered_can_count_once_per_step(plan):
    blocks = _blocks()
    calls, steps = [], []
    for b in blocks:
        b.register_forward_hook(lambda m, i, o: calls.append(torchref.is_recomputing()))
        b.register_forward_hook(lambda m, i, o: None if torchref.is_recomputing() else steps.append(1))
    torchref.forward_blocks(blocks, _x(), plan).sum().backward()
    assert len(calls) == HOOK_CALLS[plan]
    assert calls.count(False) == len(steps) == N  # the forward pass: once per block
    assert not torchref.is_recomputing()


def test_tensors_captured_in_the_forward_pass_only_get_their_grad():
    captured = {}

    def capture(name):
        def hook(module, inputs, output):
            if not torchref.is_recomputing():
                output.retain_grad()
                captured[name] = output
        return hook

    got = {}
    for plan in ("none", "sqrt+save_dots"):
        blocks = _blocks()
        for i, b in enumerate(blocks):
            b.register_forward_hook(capture(i))
        torchref.forward_blocks(blocks, _x(), plan).square().sum().backward()
        got[plan] = [captured[i].grad.numpy().copy() for i in range(N)]
    assert _bitwise(got["sqrt+save_dots"], got["none"])


def test_is_recomputing_inside_a_gradient_taken_in_the_block():
    seen = []

    class Energy(nn.Module):  # forces from an energy: a gradient inside the forward pass
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(D, D)

        def forward(self, x):
            seen.append(torchref.is_recomputing())
            x = x if x.requires_grad else x.requires_grad_()
            e = torch.tanh(self.lin(x)).sum()
            (f,) = torch.autograd.grad(e, x, create_graph=True)
            return x + f

    torch.manual_seed(0)
    blocks = [Energy() for _ in range(2)]
    torchref.forward_blocks(blocks, _x().requires_grad_(), "full").sum().backward()
    # block 0's forward, its recompute for the gradient inside it, the same for block 1, then the
    # backward pass's recomputes of blocks 1 and 0
    assert seen == [False, True, False, True, True, True]


@pytest.mark.parametrize("plan", ["none", "full", "sqrt", "full+save_dots", "nested(sqrt,sqrt)"])
def test_full_backward_hooks_run_once_per_step(plan):
    # the recompute's graph is never differentiated, so backward hooks see only the real backward pass
    blocks = _blocks()
    calls = []
    for b in blocks:
        b.register_full_backward_hook(lambda m, grad_in, grad_out: calls.append(grad_out[0].shape))
    torchref.forward_blocks(blocks, _x().requires_grad_(), plan).sum().backward()
    assert calls == [(B, D)] * N
