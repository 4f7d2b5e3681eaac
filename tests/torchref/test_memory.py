"""torchref.memory: what the forward pass saves for backward, and the peak bytes of a step."""

import numpy as np
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from jaxremat.spec import every_k, full, none, segments, sqrt
from jaxremat.models import TransformerConfig, init_params
from torchref.memory import SavedActivationRecorder, peak_step_bytes
from torchref.model import GPT
from torchref.render import model_loss

CFG = TransformerConfig(vocab_size=64, n_layer=4, d_model=16, n_head=2, d_ff=64, max_seq_len=32)
B = 4
TOKENS = torch.from_numpy(np.random.default_rng(0).integers(0, CFG.vocab_size, (B, CFG.max_seq_len + 1)))
BOUNDARY_BYTES = B * CFG.max_seq_len * CFG.d_model * 4  # one (B, T, D) float32 block input


def _residuals(schedule, cfg=CFG, exclude_params=True) -> SavedActivationRecorder:
    model = GPT.from_params(cfg, init_params(cfg))
    exclude = [*model.parameters(), *model.buffers()] if exclude_params else []
    recorder = SavedActivationRecorder(exclude=exclude)
    with recorder:
        model_loss(model, TOKENS, schedule, on_checkpoint_input=recorder.record_boundary)
    return recorder


def test_remat_saves_less_than_none():
    saved = {s.name: _residuals(s).total_bytes for s in (none, full, every_k(2), sqrt, segments(2))}
    assert saved["full"] < saved["sqrt"] < saved["none"]
    assert saved["every_k(2)"] < saved["none"] and saved["segments(2)"] < saved["none"]


@pytest.mark.parametrize("schedule", [full, every_k(2), every_k(3), segments(2)], ids=["full", "every_k(2)", "every_k(3)", "segments(2)"])
def test_checkpoint_inputs_recorded_once_per_checkpointed_segment(schedule):
    records = _residuals(schedule).records
    boundaries = [r for r in records if r["source"] == "checkpoint_input"]
    n_ckpt = sum(s.checkpointed for s in schedule.segments_for(CFG.n_layer))
    assert len(boundaries) == n_ckpt
    assert all(r["shape"] == (B, CFG.max_seq_len, CFG.d_model) and r["bytes"] == BOUNDARY_BYTES for r in boundaries)


def test_full_remat_keeps_only_boundaries_of_the_blocks():
    """Under ``full`` nothing from inside a block is saved: the block-stack residuals are N boundaries."""
    n_none = len(_residuals(none).records)
    full_records = _residuals(full).records
    surroundings = [r for r in full_records if r["source"] == "saved"]  # embed + head + loss
    per_block_none = (n_none - len(surroundings)) / CFG.n_layer
    assert per_block_none > 5  # a plain block saves many tensors ...
    assert len(full_records) - len(surroundings) == CFG.n_layer  # ... a checkpointed one only its input


def test_outer_hook_sees_checkpoint_input_but_nothing_inside():
    """Non-reentrant checkpoint's own hook is innermost: interior saves never reach an outer hook."""
    block = GPT.from_params(CFG, init_params(CFG)).blocks[0]
    x = torch.randn(B, CFG.max_seq_len, CFG.d_model, requires_grad=True) * 1.0
    exclude = [*block.parameters(), *block.buffers()]
    inside = SavedActivationRecorder(exclude=exclude)
    with inside:
        checkpoint(block, x, use_reentrant=False)
    assert [r["source"] for r in inside.records] == ["saved"]  # only the input, saved by checkpoint
    assert inside.records[0]["shape"] == tuple(x.shape)
    plain = SavedActivationRecorder(exclude=exclude)
    with plain:
        block(x)
    assert len(plain.records) > 5


def test_parameters_and_views_are_counted_once_or_not_at_all():
    with_params = _residuals(none, exclude_params=False).total_bytes
    without = _residuals(none).total_bytes
    assert with_params > without
    recorder = SavedActivationRecorder()
    a = torch.randn(6, 6, requires_grad=True)
    with recorder:
        qkv = a * 2.0
        q, k, v = qkv.split(2, dim=-1)
        (q * k * v).sum()  # q, k, v are views of one storage
    sizes = sorted(r["bytes"] for r in recorder.records)
    assert sizes.count(6 * 6 * 4) == 1  # qkv's storage once
    assert recorder.total_bytes == sum(sizes)


def test_residual_bytes_grow_linearly_without_remat():
    r2, r4, r8 = (_residuals(none, cfg=CFG.replace(n_layer=n)).total_bytes for n in (2, 4, 8))
    assert r8 - r4 == 2 * (r4 - r2) > 0  # every block saves the same tensors


def _step(model, opt, schedule):
    def step():
        opt.zero_grad(set_to_none=True)
        model_loss(model, TOKENS, schedule).backward()
        opt.step()
    return step


def test_peak_step_bytes_on_cpu_is_positive_with_source():
    peaks = {}
    for schedule in (none, full):
        model = GPT.from_params(CFG, init_params(CFG))
        opt = torch.optim.AdamW(model.parameters())
        _step(model, opt, schedule)()  # optimizer state allocated before the measured step
        peaks[schedule.name] = peak_step_bytes(_step(model, opt, schedule), model, opt)
    for peak in peaks.values():
        assert peak.source == "torch MemTracker (cpu)"
        assert peak.peak_bytes > 0
        n_param_bytes = sum(p.numel() * 4 for p in model.parameters())
        assert peak.breakdown["PARAM"] == n_param_bytes
        assert set(peak.breakdown) >= {"PARAM", "GRAD", "ACT", "TEMP", "OPT"}
    assert peaks["full"].peak_bytes < peaks["none"].peak_bytes


def test_peak_step_bytes_never_returns_zero():
    with pytest.raises(RuntimeError, match="refusing to return 0"):
        peak_step_bytes(lambda: None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.max_memory_allocated)")
def test_peak_step_bytes_on_cuda():
    model = GPT.from_params(CFG, init_params(CFG)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    tokens = TOKENS.cuda()

    def step():
        opt.zero_grad(set_to_none=True)
        model_loss(model, tokens, full).backward()
        opt.step()

    step()
    peak = peak_step_bytes(step, model, opt)
    assert peak.source == "torch.cuda.max_memory_allocated" and peak.peak_bytes > 0
