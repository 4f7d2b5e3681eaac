"""torchref.render: every schedule is bitwise equal to no remat and recomputes what the spec says."""

import numpy as np
import pytest
import torch

from jaxremat.spec import every_k, full, none, segments, sqrt
from jaxremat.models import TransformerConfig, init_params
from torchref.model import GPT
from torchref.render import forward_blocks, model_loss

CFG = TransformerConfig(vocab_size=64, n_layer=5, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
SCHEDULES = [full, every_k(2), every_k(3), sqrt, segments(3)]
IDS = [s.name for s in SCHEDULES]
TOKENS = torch.from_numpy(np.random.default_rng(0).integers(0, CFG.vocab_size, (2, CFG.max_seq_len + 1)))


def _uint(a: np.ndarray) -> np.ndarray:
    return a.view({4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _loss_and_grads(cfg, schedule, seed=0):
    model = GPT.from_params(cfg, init_params(cfg, seed=1))
    torch.manual_seed(seed)
    loss = model_loss(model, TOKENS, schedule)
    loss.backward()
    return loss.detach().numpy(), model.to_params(grads=True)


def _assert_bitwise(a, b):
    loss_a, grads_a = a
    loss_b, grads_b = b
    assert np.array_equal(_uint(loss_a), _uint(loss_b)), (loss_a, loss_b)
    for k in grads_a:
        assert np.array_equal(_uint(grads_a[k]), _uint(grads_b[k])), f"{k}: max |diff| {np.abs(grads_a[k] - grads_b[k]).max()}"


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_schedule_bitwise_equal_to_none(schedule):
    _assert_bitwise(_loss_and_grads(CFG, schedule), _loss_and_grads(CFG, none))


@pytest.mark.parametrize("schedule", [full, segments(3)], ids=["full", "segments(3)"])
def test_schedule_bitwise_equal_to_none_float64(schedule):
    cfg = CFG.replace(dtype="float64")
    _assert_bitwise(_loss_and_grads(cfg, schedule), _loss_and_grads(cfg, none))


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_schedule_bitwise_with_dropout(schedule):
    cfg = CFG.replace(dropout=0.1)
    dropped = _loss_and_grads(cfg, none)
    _assert_bitwise(_loss_and_grads(cfg, schedule), dropped)
    # dropout is active: the masks change the result
    assert not np.array_equal(dropped[0], _loss_and_grads(CFG, none)[0])


def test_model_loss_none_equals_plain_forward():
    model = GPT.from_params(CFG, init_params(CFG, seed=1))
    a = model_loss(model, TOKENS, none).detach().numpy()
    b = model.loss(TOKENS).detach().numpy()
    assert np.array_equal(_uint(a), _uint(b))


@pytest.mark.parametrize("schedule", [none, *SCHEDULES, segments(1), segments(5), every_k(5)],
                         ids=["none", *IDS, "segments(1)", "segments(5)", "every_k(5)"])
def test_block_forward_counts_match_segments(schedule):
    """Each block of a checkpointed segment runs twice (forward + recompute), the others once."""
    model = GPT.from_params(CFG, init_params(CFG))
    counts = [0] * CFG.n_layer
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda mod, args, i=i: counts.__setitem__(i, counts[i] + 1))
    inputs = []
    loss = model_loss(model, TOKENS, schedule, on_checkpoint_input=inputs.append)
    assert counts == [1] * CFG.n_layer  # the forward pass runs every block once
    loss.backward()
    segs = schedule.segments_for(CFG.n_layer)
    expected = [1] * CFG.n_layer
    for seg in segs:
        for i in range(seg.start, seg.stop):
            expected[i] += seg.checkpointed
    assert counts == expected
    assert len(inputs) == sum(s.checkpointed for s in segs)  # reported once, not again on recompute
    assert all(t.shape == (2, CFG.max_seq_len, CFG.d_model) for t in inputs)


def test_checkpoint_inputs_are_segment_boundaries():
    model = GPT.from_params(CFG, init_params(CFG))
    x = model.embed(TOKENS[:, :-1])
    boundaries = [x]
    with torch.no_grad():
        for block in model.blocks:
            boundaries.append(block(boundaries[-1]))
    for schedule in (every_k(2), segments(3)):
        seen = []
        forward_blocks(model.blocks, x, schedule, on_checkpoint_input=seen.append)
        starts = [s.start for s in schedule.segments_for(CFG.n_layer) if s.checkpointed]
        assert len(seen) == len(starts)
        for t, start in zip(seen, starts):
            assert torch.equal(t, boundaries[start])


def test_segments_larger_than_depth_raises():
    model = GPT.from_params(CFG, init_params(CFG))
    with pytest.raises(ValueError, match="segments"):
        model_loss(model, TOKENS, segments(CFG.n_layer + 1))
