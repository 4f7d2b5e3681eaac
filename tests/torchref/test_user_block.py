"""torchref.render.forward_blocks on a user-style block that is not our transformer: an MLP-Mixer
block with dropout 0.2. Every schedule's gradients are bitwise equal to no remat because the
recompute restores the forward's RNG state (``preserve_rng_state=True``); with
``preserve_rng_state=False`` the recompute draws new masks and the gradients differ.
"""

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from jaxremat.spec import every_k, full, none, segments, sqrt
from torchref.render import forward_blocks

N, B, T, D = 5, 2, 8, 16
SCHEDULES = [full, every_k(2), sqrt, segments(3)]


class Mixer(nn.Module):
    """MLP-Mixer block (Tolstikhin et al. 2021): token mixing, then channel mixing, each with dropout."""

    def __init__(self, rate: float = 0.2):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.tok = nn.Sequential(nn.Linear(T, 2 * T), nn.GELU(), nn.Linear(2 * T, T))
        self.ch = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.rate = rate

    def forward(self, x):  # (B, T, D) -> (B, T, D)
        x = x + F.dropout(self.tok(self.ln1(x).transpose(1, 2)).transpose(1, 2), self.rate, self.training)
        return x + F.dropout(self.ch(self.ln2(x)), self.rate, self.training)


def _blocks() -> nn.ModuleList:
    torch.manual_seed(1)
    return nn.ModuleList(Mixer() for _ in range(N))


def _run(forward) -> tuple[np.ndarray, list[np.ndarray]]:
    """(loss, grads) of ``sum(forward(blocks, x) * w)``, with the dropout RNG seeded identically."""
    blocks = _blocks()
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(B, T, D, generator=gen), torch.randn(B, T, D, generator=gen)
    torch.manual_seed(0)
    loss = (forward(blocks, x) * w).sum()
    loss.backward()
    return loss.detach().numpy(), [p.grad.numpy().copy() for p in blocks.parameters()]


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return np.isfinite(a).all() and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _same(a, b) -> bool:
    return _bits_equal(a[0], b[0]) and all(_bits_equal(x, y) for x, y in zip(a[1], b[1]))


def _plain(blocks, x):
    for block in blocks:
        x = block(x)
    return x


REF = {}


def _reference():
    if "plain" not in REF:
        REF["plain"] = _run(_plain)
    return REF["plain"]


def test_none_is_the_plain_loop():
    assert _same(_run(lambda b, x: forward_blocks(b, x, none)), _reference())


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[s.name for s in SCHEDULES])
def test_schedule_bitwise_equal_to_no_remat(schedule):
    assert _same(_run(lambda b, x: forward_blocks(b, x, schedule)), _reference())


def test_dropout_is_active():
    def eval_mode(blocks, x):
        blocks.eval()
        return _plain(blocks, x)

    assert not _bits_equal(_run(eval_mode)[0], _reference()[0])


@pytest.mark.parametrize("preserve", [True, False])
def test_preserve_rng_state_is_what_makes_it_bitwise(preserve):
    """``full`` by hand: with ``preserve_rng_state=False`` the recompute draws other masks."""

    def full_by_hand(blocks, x):
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False, preserve_rng_state=preserve)
        return x

    result = _run(full_by_hand)
    assert _bits_equal(result[0], _reference()[0])  # the forward (the loss) is the same either way
    assert _same(result, _reference()) is preserve


# ---------------------------------------------------------------- random ops writing their noise in place
PLANS = ["full", "every_k(2)", "sqrt", "segments(3)", "nested(sqrt,sqrt)", "full+save_dots",
         "every_k(2)+save_dots_no_batch"]


class RReLUBlock(nn.Module):
    """``x + rrelu(W x)`` in training mode: ``rrelu_with_noise`` draws its slopes into a buffer in place."""

    def __init__(self, functional: bool):
        super().__init__()
        self.lin, self.act, self.functional = nn.Linear(D, D), nn.RReLU(0.1, 0.3), functional

    def forward(self, x):
        h = self.lin(x)
        return x + (F.rrelu(h, 0.1, 0.3, training=True) if self.functional else self.act(h))


def _rrelu_run(forward, functional: bool):
    torch.manual_seed(1)
    blocks = nn.ModuleList(RReLUBlock(functional) for _ in range(N))
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    (forward(blocks, x) ** 2).sum().backward()
    return [p.grad.numpy().copy() for p in blocks.parameters()]


@pytest.mark.parametrize("functional", [False, True], ids=["nn.RReLU", "F.rrelu"])
@pytest.mark.parametrize("plan", PLANS)
def test_rrelu_noise_written_in_place_is_bitwise_under_every_plan(plan, functional):
    ref = _rrelu_run(_plain, functional)
    got = _rrelu_run(lambda b, x: forward_blocks(b, x, plan), functional)
    assert all(_bits_equal(g, r) for g, r in zip(got, ref)), plan


def test_rrelu_is_random_in_training_mode():
    a = _rrelu_run(_plain, False)
    torch.manual_seed(5)
    b = _rrelu_run(lambda bl, x: (torch.manual_seed(7), _plain(bl, x))[1], False)
    assert not all(_bits_equal(x, y) for x, y in zip(a, b))


class _CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, op):
        super().__init__()
        self.op, self.count = op, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is self.op
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("early_stop", [True, False])
def test_rrelu_early_stopped_recompute_never_fills_the_noise(early_stop):
    """The mechanism: early stop ends the recompute at ``rrelu_with_noise``'s save of its noise,
    before the kernel that fills it runs; without early stop the kernel runs in the recompute."""
    torch.manual_seed(1)
    block = RReLUBlock(False)
    y = checkpoint(block, torch.randn(B, T, D), use_reentrant=False, early_stop=early_stop)
    count = _CountOps(torch.ops.aten.rrelu_with_noise.default)
    with count:
        y.sum().backward()
    assert count.count == (0 if early_stop else 1)


# ---------------------------------------------------------------- gradients inside blocks, double backward
class EnergyBlock(nn.Module):
    """``x - 0.1 dE/dx`` with ``E = sum(tanh(W x)^2)``: the block takes a gradient in its forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        x = x if x.requires_grad else x.requires_grad_()
        force, = torch.autograd.grad(torch.tanh(self.lin(x)).pow(2).sum(), x, create_graph=True)
        return x - 0.1 * force


def _second_order_run(forward, block_cls, penalty: bool):
    """Grads of ``sum(out^2)`` (``penalty=False``) or of the gradient penalty ``|d sum(out) / dx|^2``."""
    torch.manual_seed(1)
    blocks = nn.ModuleList(block_cls() for _ in range(N))
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2), requires_grad=True)
    out = forward(blocks, x)
    if penalty:
        g, = torch.autograd.grad(out.sum(), x, create_graph=True)
        (g ** 2).sum().backward()
    else:
        (out ** 2).sum().backward()
    return [None if p.grad is None else p.grad.numpy().copy() for p in blocks.parameters()]


def _same_grads(got, ref) -> bool:
    """Same parameters reached (a bias the penalty does not reach has no gradient) and same bits."""
    return all((g is None and r is None) or (g is not None and r is not None and _bits_equal(g, r))
               for g, r in zip(got, ref))


@pytest.mark.parametrize("plan", ["full", "sqrt", "full+save_dots", "every_k(2)+save_dots_no_batch",
                                  "nested(every_k(3),every_k(2))+save_dots"])
def test_autograd_grad_inside_a_block_is_bitwise_under_selective_plans(plan):
    ref = _second_order_run(_plain, EnergyBlock, penalty=False)
    got = _second_order_run(lambda b, x: forward_blocks(b, x, plan), EnergyBlock, penalty=False)
    assert all(r is not None for r in ref) and _same_grads(got, ref), plan


@pytest.mark.parametrize("plan", ["full", "full+save_dots", "every_k(2)+save_dots_no_batch", "sqrt+save_dots"])
def test_double_backward_is_bitwise_under_selective_plans(plan):
    ref = _second_order_run(_plain, Mixer, penalty=True)
    got = _second_order_run(lambda b, x: forward_blocks(b, x, plan), Mixer, penalty=True)
    assert sum(r is not None for r in ref) >= len(ref) // 2 and _same_grads(got, ref), plan


def test_second_backward_with_retain_graph_under_a_selective_plan():
    torch.manual_seed(1)
    blocks = _blocks().eval()
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2))
    out = forward_blocks(blocks, x, "full+save_dots").sum()
    out.backward(retain_graph=True)
    once = [p.grad.clone() for p in blocks.parameters()]
    out.backward()
    assert all(torch.equal(p.grad, 2 * g) for p, g in zip(blocks.parameters(), once))
