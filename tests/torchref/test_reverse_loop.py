"""torchref.reverse_loop: the hand-rolled reverse segment loop equals the library schedule bit for bit."""

import numpy as np
import pytest
import torch

from jaxremat.spec import every_k, full, none, segments, sqrt
from jaxremat.models import TransformerConfig, init_params
from torchref.model import GPT
from torchref.render import model_loss
from torchref.reverse_loop import reverse_segment_loop

CFG = TransformerConfig(vocab_size=64, n_layer=5, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
SCHEDULES = [none, full, every_k(2), every_k(3), sqrt, segments(3)]
IDS = [s.name for s in SCHEDULES]
TOKENS = torch.from_numpy(np.random.default_rng(0).integers(0, CFG.vocab_size, (2, CFG.max_seq_len + 1)))


def _uint(a: np.ndarray) -> np.ndarray:
    return a.view({4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_reverse_loop_bitwise_equal_to_library(schedule, dropout):
    cfg = CFG.replace(dropout=dropout)
    params = init_params(cfg, seed=2)

    library = GPT.from_params(cfg, params)
    torch.manual_seed(0)
    loss = model_loss(library, TOKENS, schedule)
    loss.backward()
    rng_after_library = torch.get_rng_state()
    want = library.to_params(grads=True)

    loop = GPT.from_params(cfg, params)
    torch.manual_seed(0)
    loop_loss, got = reverse_segment_loop(loop, TOKENS, schedule)
    # same RNG stream consumed: recomputation replays the masks without advancing the generator
    assert torch.equal(torch.get_rng_state(), rng_after_library)

    assert np.array_equal(_uint(loop_loss.numpy()), _uint(loss.detach().numpy()))
    for k in want:
        assert np.array_equal(_uint(got[k]), _uint(want[k])), k
    # gradients are also left on the model, like a normal backward
    assert all(np.array_equal(_uint(loop.to_params(grads=True)[k]), _uint(got[k])) for k in got)


def test_reverse_loop_recomputes_checkpointed_segments_once():
    model = GPT.from_params(CFG, init_params(CFG))
    counts = [0] * CFG.n_layer
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda mod, args, i=i: counts.__setitem__(i, counts[i] + 1))
    schedule = segments(2)  # blocks [0, 2) checkpointed, [2, 5) kept
    reverse_segment_loop(model, TOKENS, schedule)
    assert counts == [2, 2, 1, 1, 1]


def test_reverse_loop_clears_previous_grads():
    model = GPT.from_params(CFG, init_params(CFG))
    _, first = reverse_segment_loop(model, TOKENS, full)
    _, second = reverse_segment_loop(model, TOKENS, full)
    assert all(np.array_equal(first[k], second[k]) for k in first)
