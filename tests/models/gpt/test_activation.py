"""jaxremat.models.gpt.activation: the per-tensor account, pure arithmetic (no JAX, no PyTorch)."""

import pytest

from jaxremat.spec import full, none, parse_schedule, peak_units, sqrt
from jaxremat.models import TransformerConfig
from jaxremat.models.gpt import activation as am

CFG = TransformerConfig(n_layer=8, d_model=32, n_head=2, d_ff=128, max_seq_len=32)


def test_torch_layer_is_korthikanti_plus_layer_norm_statistics_and_mask():
    """Korthikanti et al.'s no-dropout terms (8BTD + 2BTF + BHT^2 elements) + 4BT stats + T^2 mask."""
    B, T = 2, 16
    k = am.korthikanti_layer_bytes(B, T, CFG.d_model, CFG.n_head, bytes_per_element=4, dropout=False, d_ff=CFG.d_ff)
    assert am.layer_bytes("torch", CFG, B, T) == k + 4 * B * T * 4 + T * T


def test_korthikanti_formula_at_their_setting():
    """sbh(34 + 5as/h) bytes at 16 bits with dropout and F = 4h (their equation 1)."""
    s, b, h, a = 16, 2, 32, 4
    assert am.korthikanti_layer_bytes(b, s, h, a) == s * b * h * 34 + 5 * a * s * s * b


@pytest.mark.parametrize("B,T", [(1, 1), (1, 16), (2, 16), (4, 32), (3, 7)])
def test_jax_layer_keeps_no_more_than_torch(B, T):
    """JAX (jaxremat.ops) keeps T^2 mask bytes and 2BT statistics fewer than PyTorch per layer."""
    jax_bytes, torch_bytes = am.layer_bytes("jax", CFG, B, T), am.layer_bytes("torch", CFG, B, T)
    assert jax_bytes == torch_bytes - T * T - 2 * B * T * 4


def test_saved_prediction_follows_the_schedule():
    B, T = 2, 16
    for fw in am.FRAMEWORKS:
        out = sum(t.bytes for t in am.outside_tensors(fw, CFG, B, T))
        assert am.predict_saved_bytes(fw, CFG, B, T, full) == out + CFG.n_layer * am.boundary_bytes(CFG, B, T)
        inv = am.stack_invariant_bytes(fw, CFG, B, T)
        assert am.predict_saved_bytes(fw, CFG, B, T, none) == out + CFG.n_layer * am.layer_bytes(fw, CFG, B, T) + inv


def test_peak_prediction_tracks_the_unit_model_at_depth():
    """At N=64 the per-layer model's none/sqrt ratio is near the unit model's 65/16, never above N+1."""
    cfg = CFG.replace(n_layer=64)
    for fw in am.FRAMEWORKS:
        r = am.predict_peak_activation_bytes(fw, cfg, 2, 16, none) / am.predict_peak_activation_bytes(fw, cfg, 2, 16, sqrt)
        assert 2.0 < r < peak_units(64, none) / 2
    assert am.predict_peak_activation_bytes("torch", cfg, 2, 16, parse_schedule("nested")) <= \
        am.predict_peak_activation_bytes("torch", cfg, 2, 16, none)


def test_bytes_by_name_sums_to_block_bytes_and_uses_known_names():
    from jaxremat.spec.names import ACTIVATION_NAMES

    for fw in am.FRAMEWORKS:
        by = am.bytes_by_name(fw, CFG, 2, 16)
        assert sum(by.values()) == am.block_bytes(fw, CFG, 2, 16)
        assert set(by) - {None} <= set(ACTIVATION_NAMES)


@pytest.mark.parametrize("bad", [dict(framework="tf"), dict(batch=0), dict(seq=999)])
def test_bad_input_raises(bad):
    args = dict(framework="jax", cfg=CFG, batch=2, seq=8) | bad
    with pytest.raises(ValueError):
        am.block_tensors(args["framework"], args["cfg"], args["batch"], args["seq"])


def test_dropout_is_out_of_scope_with_a_clear_error():
    with pytest.raises(ValueError, match="dropout 0"):
        am.block_tensors("torch", CFG.replace(dropout=0.1), 2, 8)
