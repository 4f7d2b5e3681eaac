"""torchref.encoder: bitwise under every schedule (with dropout), named regions, reverse loop, layout."""

import functools

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from jaxremat.spec import every_k, full, none, segments, sqrt
from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.names import ACTIVATION_NAMES
from parity.checks.compare import compare_bitwise
from torchref.encoder import Encoder, encoder_loss
from torchref.encoder_reverse_loop import reverse_segment_loop
from torchref.names import current_name

CFG = TransformerConfig(arch="bert", vocab_size=64, n_layer=5, d_model=16, n_head=2, d_ff=32, max_seq_len=8,
                        layer_norm_eps=1e-12)
SCHEDULES = [full, every_k(2), every_k(3), sqrt, segments(3)]
IDS = [s.name for s in SCHEDULES]


def _tokens():
    ids = np.random.default_rng(0).integers(1, CFG.vocab_size, (4, 8))
    ids[1, 5:] = 0
    ids[3, 3:] = 0
    return torch.from_numpy(ids)


@functools.lru_cache(maxsize=None)
def _run(schedule, dropout=0.0, dtype="float32"):
    cfg = CFG.replace(dropout=dropout, dtype=dtype)
    model = Encoder.from_params(cfg, init_params(cfg, seed=1))
    torch.manual_seed(7)
    loss = encoder_loss(model, _tokens(), schedule)
    loss.backward()
    return {"loss": loss.detach().numpy().copy(), **model.to_params(grads=True)}


def _assert_bitwise(a, b):
    res = compare_bitwise(a, b)
    assert res.equal, f"not bitwise: {res.mismatched} (max ULP {res.max_ulp}, max abs {res.max_abs_diff:.3e})"


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_encoder_schedule_bitwise_equal_to_none(schedule, dropout):
    _assert_bitwise(_run(schedule, dropout), _run(none, dropout))


def test_encoder_schedule_bitwise_float64():
    _assert_bitwise(_run(sqrt, 0.1, "float64"), _run(none, 0.1, "float64"))


def test_encoder_dropout_is_active_in_training_mode():
    assert not np.array_equal(_run(none, 0.1)["loss"], _run(none, 0.0)["loss"])


@pytest.mark.parametrize("schedule", [full, every_k(2), segments(3)], ids=["full", "every_k(2)", "segments(3)"])
def test_encoder_reverse_loop_bitwise(schedule):
    cfg = CFG.replace(dropout=0.1)
    model = Encoder.from_params(cfg, init_params(cfg, seed=1))
    torch.manual_seed(7)
    loss, grads = reverse_segment_loop(model, _tokens(), schedule)
    _assert_bitwise({"loss": loss.numpy().copy(), **grads}, _run(schedule, 0.1))


def test_encoder_params_round_trip_bitwise():
    params = init_params(CFG, seed=3)
    _assert_bitwise(Encoder.from_params(CFG, params).to_params(), params)


def test_encoder_padding_is_masked():
    model = Encoder.from_params(CFG, init_params(CFG, seed=1)).eval()
    ids = _tokens()[:, :6]
    longer = torch.cat([ids, torch.zeros(4, 2, dtype=ids.dtype)], dim=1)
    real = (ids != 0).numpy()
    with torch.no_grad():
        short_h, long_h = model(ids).numpy(), model(longer).numpy()
        leak = model(longer, attention_mask=torch.ones_like(longer)).numpy()
    np.testing.assert_allclose(long_h[:, :6][real], short_h[real], rtol=1e-5, atol=1e-6)
    assert not np.allclose(leak[:, :6][real], short_h[real], rtol=1e-3)


_VIEWS = {"view", "_unsafe_view", "t", "transpose", "expand", "alias", "detach", "split", "slice", "unsqueeze",
          "squeeze", "permute", "as_strided", "_reshape_alias"}


class _OpsByRegion(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: dict[str, list[str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = current_name()
        op = func.overloadpacket.__name__
        if name is not None and op not in _VIEWS:
            self.ops.setdefault(name, []).append(op)
        return func(*args, **(kwargs or {}))


def test_encoder_block_runs_one_computing_op_per_named_region():
    model = Encoder.from_params(CFG.replace(n_layer=1), init_params(CFG.replace(n_layer=1), seed=1)).eval()
    rec = _OpsByRegion()
    with torch.no_grad(), rec:
        model(_tokens())
    names_in_block = set(ACTIVATION_NAMES) - {"block_input"}  # the block input is produced outside the block
    assert set(rec.ops) == names_in_block
    assert {n: len(ops) for n, ops in rec.ops.items()} == {n: 1 for n in names_in_block}, rec.ops


def test_encoder_rejects_bad_input():
    model = Encoder.from_params(CFG, init_params(CFG, seed=1))
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.full((2, 4), 64))
    with pytest.raises(ValueError, match="even"):
        encoder_loss(model, _tokens()[:3], none)
    with pytest.raises(ValueError, match="arch='bert'"):
        Encoder(CFG.replace(arch="gpt"))
