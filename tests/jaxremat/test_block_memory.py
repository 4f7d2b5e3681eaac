"""One JAX block's residuals equal the per-tensor activation model exactly (any small size, both dtypes)."""

import jax
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxremat.block_memory import block_residuals
from jaxremat.models import TransformerConfig
from jaxremat.models.gpt.activation import jax_block_tensors


def _check(B, T, H, hd, F, dtype):
    cfg = TransformerConfig(n_layer=1, d_model=H * hd, n_head=H, d_ff=F, max_seq_len=8, dtype=dtype)
    with jax.enable_x64(dtype == "float64"):
        measured = block_residuals(cfg, B, T)
    model = jax_block_tensors(cfg, B, T)
    assert [(r.shape, r.dtype, r.bytes, r.name) for r in measured] == [(t.shape, t.dtype, t.bytes, t.tag) for t in model]


def test_block_residuals_match_model_at_the_sweep_size():
    _check(2, 8, 2, 16, 128, "float32")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(B=st.integers(1, 3), T=st.integers(1, 8), H=st.integers(1, 3), hd=st.integers(1, 4), F=st.integers(1, 9),
       dtype=st.sampled_from(["float32", "float64"]))
def test_block_residuals_match_model_tensor_by_tensor(B, T, H, hd, F, dtype):
    _check(B, T, H, hd, F, dtype)
