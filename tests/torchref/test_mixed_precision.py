"""Mixed precision in PyTorch: autocast bfloat16 compute over float32 parameters, every schedule bitwise."""

import numpy as np
import pytest
import torch

from jaxremat.spec import parse_schedule
from jaxremat.models import TransformerConfig, init_params
from torchref.model import GPT
from torchref.render import model_loss

CFG = TransformerConfig(vocab_size=64, n_layer=4, d_model=16, n_head=2, d_ff=32, max_seq_len=8, compute_dtype="bfloat16")
TOKENS = torch.from_numpy(np.random.default_rng(0).integers(0, CFG.vocab_size, (2, CFG.max_seq_len + 1)))


def _grads(schedule: str):
    model = GPT.from_params(CFG, init_params(CFG, seed=1))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
        loss = model_loss(model, TOKENS, parse_schedule(schedule))
    loss.backward()
    return loss, model.to_params(grads=True), saved


@pytest.fixture(scope="module")
def reference():
    return _grads("none")


def test_bf16_compute_float32_params_and_grads(reference):
    loss, grads, saved = reference
    assert loss.dtype == torch.float32 and all(g.dtype == np.float32 for g in grads.values())
    assert torch.bfloat16 in saved  # the matmuls ran in bfloat16


@pytest.mark.parametrize("schedule", ["full", "every_k(3)", "sqrt", "segments(2)", "nested(sqrt,sqrt)"])
def test_bf16_schedule_bitwise_equal_to_none(reference, schedule, ):
    loss, grads, _ = _grads(schedule)
    ref_loss, ref_grads, _ = reference
    assert torch.equal(loss.view(torch.int32), ref_loss.view(torch.int32))
    bad = [k for k in grads if not np.array_equal(grads[k].view(np.uint32), ref_grads[k].view(np.uint32))]
    assert not bad, (schedule, bad)


def test_recompute_outside_the_forwards_precision_is_caught():
    """The control: a forward in bfloat16 and a recompute in float32 save tensors of another dtype;
    non-reentrant checkpoint compares the recomputed tensors' metadata and raises, so a renderer
    that dropped the autocast state could not pass silently."""
    from torch.utils.checkpoint import CheckpointError, checkpoint

    model = GPT.from_params(CFG, init_params(CFG, seed=1))
    calls = []

    def block0(x):
        calls.append(torch.is_autocast_enabled("cpu"))
        with torch.autocast("cpu", enabled=len(calls) == 1):  # recompute (2nd call) in float32
            return model.blocks[0](x)

    from torchref.model import compute_context, lm_loss, split_tokens
    inputs, targets = split_tokens(TOKENS)
    with compute_context(CFG):
        x = checkpoint(block0, model.embed(inputs), use_reentrant=False)
        for b in list(model.blocks)[1:]:
            x = b(x)
        logits = model.head(x)
    with pytest.raises(CheckpointError, match="metadata"):
        lm_loss(logits.float(), targets).backward()
    assert calls == [True, True]  # checkpoint restored autocast for the recompute; the block turned it off
