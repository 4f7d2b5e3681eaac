"""torchref.doctor on user-like PyTorch steps: saved bytes per module, checkpoint regions and their
recomputes, reentrant checkpointing and a selective policy that keeps nothing flagged, and a Hugging
Face BertModel with ``gradient_checkpointing_enable()`` (tiny, built from a BertConfig)."""

import functools
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import torchref

D, B = 32, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, h):
        return h + self.down(torch.relu(self.up(h)))


def recompute_nothing_saved(ctx, op, *args, **kwargs):
    return CheckpointPolicy.PREFER_RECOMPUTE


class Net(nn.Module):
    """Three blocks, each run as ``mode`` says: plain, or under a checkpoint of some kind."""

    def __init__(self, mode: str):
        super().__init__()
        self.blocks, self.head, self.mode = nn.ModuleList(Block() for _ in range(3)), nn.Linear(D, 1), mode

    def forward(self, x):
        for block in self.blocks:
            if self.mode == "none":
                x = block(x)
            elif self.mode == "reentrant":
                x = checkpoint(block, x, use_reentrant=True)
            else:
                policy = {"non-reentrant": None, "selective-nothing": recompute_nothing_saved,
                          "selective-mm": [torch.ops.aten.addmm.default]}[self.mode]
                context = functools.partial(create_selective_checkpoint_contexts, policy) if policy else None
                x = checkpoint(block, x, use_reentrant=False, **({"context_fn": context} if context else {}))
        return self.head(x).pow(2).mean()


@functools.lru_cache(maxsize=None)
def diagnose(mode: str):
    torch.manual_seed(0)
    model, x = Net(mode), torch.randn(B, D)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reentrant checkpoint warns that no input requires grad
        return torchref.doctor(lambda: model(x).backward(), model), model


def test_doctor_plain_step_saves_per_module_and_flags_nothing():
    d, _ = diagnose("none")
    assert d.ok and d.peak_source.startswith("torch MemTracker") and d.peak_bytes > 0
    assert d.module("blocks.0").saved_bytes == B * 4 * D * 4  # the ReLU's output, float32
    assert d.module("blocks.0.up").saved_bytes == B * D * 4  # its input
    assert all(m.recompute_calls == 0 and m.checkpoint is None for m in d.modules)
    assert d.saved_bytes == sum(m.saved_bytes for m in d.modules)


def test_doctor_non_reentrant_checkpoint_recomputes_each_block_once():
    d, _ = diagnose("non-reentrant")
    net = d.module("Net")
    assert (net.checkpoint, net.checkpoint_calls, net.recomputes) == ("non-reentrant", 3, 3)
    assert [d.module(f"blocks.{i}").recompute_calls for i in range(3)] == [1, 1, 1]
    assert d.module("blocks.0").saved_bytes == 0 and d.ok  # what a checkpointed block saves is checkpoint's own


def test_doctor_flags_reentrant_checkpoint_whose_blocks_got_no_gradient():
    d, model = diagnose("reentrant")
    assert d.kinds() == ["reentrant-checkpoint"]
    assert d.module("Net").recomputes == 0 and "never ran" in d.problems[0].message
    assert all(p.grad is None for p in model.blocks.parameters())  # what the problem says, measured
    assert model.head.weight.grad is not None


def test_doctor_flags_a_selective_policy_that_keeps_nothing():
    dropped, _ = diagnose("selective-nothing")
    assert dropped.kinds() == ["policy-dropped"]
    net = dropped.module("Net")
    assert (net.checkpoint, net.saved_ops, net.recomputes) == ("selective", 0, 3) and net.policy_ops > 0
    kept, _ = diagnose("selective-mm")
    assert kept.ok and kept.module("Net").saved_ops == 6  # two addmm per block, three blocks
    assert "saved 6/" in str(kept)


@pytest.mark.parametrize("reentrant", [False, True])
def test_doctor_reports_hugging_face_gradient_checkpointing(reentrant):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=16)
    model = transformers.BertModel(config).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gradient_checkpointing_enable is deprecated in favour of activation_...
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    ids = torch.randint(0, 64, (2, 8))
    d = torchref.doctor(lambda: model(input_ids=ids).last_hidden_state.pow(2).mean().backward(), model)
    kind = "reentrant" if reentrant else "non-reentrant"
    for i in range(2):
        layer = d.module(f"encoder.layer.{i}")
        assert (layer.kind, layer.checkpoint, layer.checkpoint_calls, layer.recomputes) == ("BertLayer", kind, 1, 1)
        assert d.module(f"encoder.layer.{i}.attention.self.query").recompute_calls == 1
    assert d.module("embeddings").recompute_calls == 0
    assert d.kinds() == (["reentrant-checkpoint"] if reentrant else [])
    assert [p.where for p in d.problems] == (["encoder.layer.0", "encoder.layer.1"] if reentrant else [])
