"""forward_blocks with extra arguments for every block (masks, positions), schedules and plans as
strings: every plan's gradients, including those of the extra tensors, equal the plain loop's bits."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from jaxremat.spec import full, sqrt
from torchref.render import forward_blocks

N, B, T, D = 4, 2, 6, 8
PLANS = ["full", "every_k(2)", "sqrt", "segments(3)", "nested(sqrt,sqrt)", "full+save_dots", sqrt]


class MaskedBlock(nn.Module):
    """Single-head attention with an additive mask and learned positions passed in, plus dropout."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x, mask, *, pos, rate=0.1):  # x (B, T, D), mask (T, T) additive, pos (T, D)
        q, k, v = self.qkv(x + pos).chunk(3, dim=-1)
        att = F.dropout(torch.softmax(q @ k.transpose(-1, -2) / D ** 0.5 + mask, -1), rate, self.training)
        return x + self.out(att @ v)


def _run(forward):
    torch.manual_seed(0)
    blocks = nn.ModuleList(MaskedBlock() for _ in range(N))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, D, generator=gen)
    pos = torch.randn(T, D, generator=gen, requires_grad=True)
    mask = torch.full((T, T), float("-inf")).triu(1)
    torch.manual_seed(2)
    forward(blocks, x, mask, pos).square().sum().backward()
    return [t.grad.view(torch.int32).clone() for t in [pos, *blocks.parameters()]]


def _plain(blocks, x, mask, pos):
    for b in blocks:
        x = b(x, mask, pos=pos)
    return x


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_extra_args_and_kwargs_reach_every_block_bitwise(plan):
    ref = _run(_plain)
    got = _run(lambda blocks, x, mask, pos: forward_blocks(blocks, x, plan, mask, pos=pos, rate=0.1))
    assert all(torch.equal(g, r) for g, r in zip(got, ref))
    assert ref[0].abs().sum() > 0  # the positions, passed in, get their gradient


def test_schedule_and_plan_strings_equal_the_values():
    ref = _run(lambda b, x, m, p: forward_blocks(b, x, full, m, policy="save_dots", pos=p))
    for plan in ("full+save_dots", " full + save_dots "):
        got = _run(lambda b, x, m, p: forward_blocks(b, x, plan, m, pos=p))
        assert all(torch.equal(g, r) for g, r in zip(got, ref))


@pytest.mark.parametrize("schedule,policy,match", [
    ("full+save_dots", "save_dots", "give the policy once"),
    ("fulll", None, "unknown schedule"),
    ("full+save_dotz", None, "unknown policy"),
    (torch.ones(2), None, "schedule must be a jaxremat.spec schedule.*got Tensor"),
])
def test_bad_schedule_or_plan_is_one_clear_error(schedule, policy, match):
    blocks = [MaskedBlock() for _ in range(2)]
    with pytest.raises(ValueError, match=match):
        forward_blocks(blocks, torch.ones(B, T, D), schedule, torch.zeros(T, T), policy=policy, pos=torch.zeros(T, D))
