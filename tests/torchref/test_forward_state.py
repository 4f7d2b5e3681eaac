"""Blocks passed as callables (lambdas, functions, partials, bound methods) that update BatchNorm
state: after 3 steps under every plan, running statistics, ``num_batches_tracked``, gradients and
weights equal no remat bit for bit; a state write the renderer cannot find is refused."""

import functools

import pytest
import torch
import torch.nn as nn

from jaxremat.spec import full, none
from jaxremat.spec.plan import parse_plan
from torchref.forward_state import StateWriteError, modules_of
from torchref.render import forward_blocks

N, B, D, STEPS = 3, 8, 6, 3
PLANS = ["none", "full", "every_k(2)", "sqrt", "segments(3)", "nested(sqrt,sqrt)", "full+save_dots"]


class BNBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.bn = nn.Linear(D, D), nn.BatchNorm1d(D)

    def forward(self, x, scale=1.0):  # (B, D) -> (B, D)
        return x + scale * torch.tanh(self.bn(self.lin(x)))


GLOBAL_BLOCKS: list = []


def _global_fn(i):
    def f(x):
        return GLOBAL_BLOCKS[i](x, 0.5)  # reads a module-level list, holds only the index
    return f


def _closure(b):
    def f(x):
        return b(x, scale=0.5)
    return f


CALLABLES = {
    "lambda-default": lambda blocks: [lambda x, b=b: b(x, 0.5) for b in blocks],
    "closure": lambda blocks: [_closure(b) for b in blocks],
    "partial": lambda blocks: [functools.partial(b, scale=0.5) for b in blocks],
    "bound-forward": lambda blocks: [functools.partial(b.forward, scale=0.5) for b in blocks],
    "global-list": lambda blocks: [_global_fn(i) for i in range(len(blocks))],
}


def _train(plan: str, as_callables=None):
    torch.manual_seed(0)
    blocks = nn.ModuleList(BNBlock() for _ in range(N))
    GLOBAL_BLOCKS[:] = list(blocks)
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    grads = []
    for step in range(STEPS):
        x = torch.randn(B, D, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        stack = as_callables(blocks) if as_callables else [functools.partial(b, scale=0.5) for b in blocks]
        p = parse_plan(plan)  # schedule and policy values: the callables, not the plan strings, are tested here
        forward_blocks(stack, x, p.schedule, policy=p.policy).square().mean().backward()
        grads.append([p.grad.clone() for p in blocks.parameters()])
        opt.step()
    return blocks, grads


def _state(blocks):
    return [t for b in blocks for t in (b.bn.running_mean, b.bn.running_var, b.bn.num_batches_tracked)]


def _bits(a, b):
    if a.dtype == torch.float32:
        a, b = a.view(torch.int32), b.view(torch.int32)
    return a.shape == b.shape and torch.equal(a, b)


@pytest.fixture(scope="module")
def reference():
    return _train("none")


@pytest.mark.parametrize("kind", list(CALLABLES))
@pytest.mark.parametrize("plan", PLANS[1:])
def test_callable_blocks_update_state_once_and_bitwise(reference, plan, kind):
    ref_blocks, ref_grads = reference
    blocks, grads = _train(plan, CALLABLES[kind])
    assert [int(b.bn.num_batches_tracked) for b in blocks] == [STEPS] * N
    assert all(_bits(a, b) for a, b in zip(_state(blocks), _state(ref_blocks)))
    assert all(_bits(g, r) for gs, rs in zip(grads, ref_grads) for g, r in zip(gs, rs))
    assert all(_bits(p, q) for p, q in zip(blocks.parameters(), ref_blocks.parameters()))


def test_modules_of_finds_the_modules_callables_hold():
    a, b = BNBlock(), BNBlock()
    GLOBAL_BLOCKS[:] = [a]
    assert modules_of(a) == [a]
    assert modules_of(lambda x, m=a: m(x)) == [a]
    assert modules_of(functools.partial(a, scale=2.0)) == [a]
    assert modules_of(a.forward) == [a]
    assert modules_of(_closure(b)) == [b]
    assert modules_of(_global_fn(0)) == [a]
    assert modules_of(lambda x: x * 2) == []


COUNTER = torch.zeros(())


def test_callable_writing_state_outside_any_module_is_refused():
    """A function that counts its calls in a plain tensor: the recompute would count again."""
    block = BNBlock()

    def counting(x):
        COUNTER.add_(1)
        return block(x)

    x = torch.randn(B, D)
    with pytest.raises(StateWriteError, match=r"pass the nn.Module itself, functools.partial\(module"):
        forward_blocks([counting, counting], x, full)
    assert forward_blocks([counting, counting], x, none).shape == x.shape  # nothing recomputed: allowed
