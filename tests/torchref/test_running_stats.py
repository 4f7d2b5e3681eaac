"""State updated in the forward pass under remat: running statistics and counters count each batch once."""

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from jaxremat.spec import parse_schedule
from torchref.forward_state import ForwardState
from torchref.render import forward_blocks

D, N, STEPS = 8, 4, 3
SCHEDULES = ("none", "full", "every_k(2)", "every_k(3)", "sqrt", "segments(2)", "nested(sqrt,sqrt)", "full+save_dots")


class StatsBlock(nn.Module):
    """A user-style block: ``x + W2 gelu(W1 bn(x))`` with BatchNorm running statistics, plus a
    forward counter whose value the output reads (a recompute must see the pre-forward value)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.register_buffer("seen", torch.zeros((), dtype=torch.float32))

    def forward(self, x):  # (B, T, D)
        B, T, _ = x.shape
        h = self.bn(x.reshape(B * T, D)).reshape(B, T, D)
        self.seen.add_(1.0)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(h))) * (1.0 + 0.01 * self.seen)


def _stack():
    torch.manual_seed(0)
    return nn.ModuleList(StatsBlock() for _ in range(N))


def _train(plan: str, *, plain_checkpoint: bool = False):
    blocks = _stack()
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    from jaxremat.spec.plan import parse_plan
    p = parse_plan(plan)
    grads = []
    for _ in range(STEPS):
        x = torch.randn(2, 5, D, generator=gen)
        opt.zero_grad()
        if plain_checkpoint:
            y = x
            for b in blocks:
                y = checkpoint(b, y, use_reentrant=False)
        else:
            y = forward_blocks(blocks, x, p.schedule, policy=p.policy)
        y.square().mean().backward()
        grads.append([q.grad.clone() for q in blocks.parameters()])
        opt.step()
    return blocks, grads


def _bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a,
                                                                     b.view(torch.int32) if b.dtype == torch.float32 else b)


@pytest.fixture(scope="module")
def reference():
    return _train("none")


def test_plain_checkpoint_counts_every_batch_twice(reference):
    ref, _ = reference
    blocks, _ = _train("full", plain_checkpoint=True)
    for b, r in zip(blocks, ref):
        assert int(r.bn.num_batches_tracked) == STEPS and float(r.seen) == STEPS
        assert int(b.bn.num_batches_tracked) == 2 * STEPS and float(b.seen) == 2 * STEPS
        assert not torch.equal(b.bn.running_mean, r.bn.running_mean)


@pytest.mark.parametrize("plan", SCHEDULES[1:])
def test_renderer_updates_state_once_and_bitwise(reference, plan):
    ref, ref_grads = reference
    blocks, grads = _train(plan)
    for b, r in zip(blocks, ref):
        assert int(b.bn.num_batches_tracked) == STEPS and float(b.seen) == STEPS
        for name in ("running_mean", "running_var"):
            assert _bits(getattr(b.bn, name), getattr(r.bn, name)), (plan, name)
        for p, q in zip(b.parameters(), r.parameters()):
            assert _bits(p.detach(), q.detach()), plan
    for step, (g, rg) in enumerate(zip(grads, ref_grads)):
        assert all(_bits(a, c) for a, c in zip(g, rg)), (plan, step)


def test_forward_state_drops_constant_buffers_and_restores_after_recompute():
    block = StatsBlock()
    block.register_buffer("mask", torch.ones(3, dtype=torch.bool))
    fs = ForwardState([block])
    run = fs.wrap(block)
    x = torch.randn(2, 3, D)
    run(x)
    assert sorted(n for _, n, _ in fs.state) == ["num_batches_tracked", "running_mean", "running_var", "seen"]
    after = {n: t.clone() for n, t in block.named_buffers()}
    run(x)  # a recompute: runs on the pre-forward values, leaves the post-forward ones
    assert all(torch.equal(t, after[n]) for n, t in block.named_buffers())
