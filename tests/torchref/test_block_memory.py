"""One PyTorch block's saved tensors equal the per-tensor activation model exactly; the lean live-bytes
tracker agrees with MemTracker."""

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxremat.spec import sqrt
from jaxremat.models import TransformerConfig, init_params
from jaxremat.models.gpt.activation import torch_block_tensors
from torchref.block_memory import block_saved
from torchref.live_bytes import step_peak_bytes
from torchref.memory import peak_step_bytes
from torchref.model import GPT
from torchref.render import model_loss


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(B=st.integers(1, 3), T=st.integers(1, 8), H=st.integers(1, 3), hd=st.integers(1, 4), F=st.integers(1, 9),
       dtype=st.sampled_from(["float32", "float64"]))
def test_block_saved_matches_model_tensor_by_tensor(B, T, H, hd, F, dtype):
    cfg = TransformerConfig(n_layer=1, d_model=H * hd, n_head=H, d_ff=F, max_seq_len=8, dtype=dtype)
    measured = [(tuple(r["shapes"][0]), r["dtype"], r["bytes"], r["name"]) for r in block_saved(cfg, B, T)]
    assert measured == [(t.shape, t.dtype, t.bytes, t.name) for t in torch_block_tensors(cfg, B, T)]


def test_live_bytes_tracker_equals_memtracker_less_fixed_categories():
    cfg = TransformerConfig(vocab_size=64, n_layer=3, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
    model = GPT.from_params(cfg, init_params(cfg))
    tokens = torch.from_numpy(np.arange(18, dtype=np.int64).reshape(2, 9) % 64)

    def step():
        model.zero_grad(set_to_none=False)
        model_loss(model, tokens, sqrt).backward()

    step()
    ref = peak_step_bytes(step, model)
    fixed = sum(ref.breakdown.get(k, 0) for k in ("PARAM", "BUFFER", "GRAD", "OPT"))
    exclude = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters())]
    assert step_peak_bytes(step, exclude) == ref.peak_bytes - fixed > 0
