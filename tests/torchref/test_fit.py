"""torchref.plan_blocks: the PyTorch one-call planner, measured on the step's live activation bytes."""

import pytest
import torch

from torchref import plan_blocks


def _blocks(n=6, d=16):
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.Tanh(), torch.nn.Linear(4 * d, d)) for _ in range(n)]


def test_plan_blocks_fits_the_budget_and_keeps_the_gradients_bitwise():
    blocks = _blocks()
    fit = plan_blocks(blocks, torch.ones(8, 16), budget="60%", policies=["save_nothing"])
    assert fit.peak_bytes <= fit.budget_bytes == int(0.6 * fit.none_peak_bytes)
    assert fit.grads_bitwise_equal is True and sum(s.length for s in fit.plan.segments) == 6


def test_plan_blocks_refuses_no_blocks_and_a_budget_below_reach():
    with pytest.raises(ValueError, match="blocks is empty"):
        plan_blocks([], torch.ones(2, 16), budget="50%")
    with pytest.raises(ValueError, match="the least reached is"):
        plan_blocks(_blocks(), torch.ones(8, 16), budget=64, policies=["save_nothing"])
