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
