"""The planner's time cost measured in PyTorch (torchref.block_time): structure, never speed."""

import math

import torch
from torch import nn

from torchref.block_time import block_option_times


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


def test_every_option_is_timed_on_one_thread_and_the_threads_are_restored():
    threads = torch.get_num_threads()
    times = block_option_times(_Block, torch.randn(4, 8), ["store", "save_nothing", "save_dots"], rounds=2,
                               min_sample_s=1e-4)
    assert torch.get_num_threads() == threads
    assert list(times) == ["store", "save_nothing", "save_dots"]
    for t in times.values():
        assert t.rounds == 2 and t.lengths == (2, 4)
        for s in (t.forward, t.backward, t.segment):
            assert s.low_s <= s.median_s <= s.high_s and all(map(math.isfinite, (s.low_s, s.high_s)))
        assert t.as_dict()["step_ms"] == 1e3 * t.step_time_s
