"""torchref.early_stop_cost: what early stop off costs, measured (the numbers docs/framework-differences.md
section 10 quotes come from ``python -m parity.experiments.early_stop_cost``)."""

from jaxremat.models import TransformerConfig
from torchref import render
from torchref.early_stop_cost import measure

CFG = TransformerConfig(vocab_size=32, n_layer=3, d_model=16, n_head=2, d_ff=64, max_seq_len=8)


def test_early_stop_off_reruns_each_segments_tail_and_nothing_else():
    r = measure("full", CFG, batch=2, repeats=1)
    # the GPT block's tail after its last save: the MLP down-projection, its view, the residual add
    assert r["backward_ops_early_stop_off"] - r["backward_ops_early_stop_on"] == 3 * CFG.n_layer
    extra = 2 * 2 * CFG.max_seq_len * CFG.d_ff * CFG.d_model * CFG.n_layer  # one (B*T, F) x (F, D) addmm per block
    assert r["backward_flops_early_stop_off"] - r["backward_flops_early_stop_on"] == extra
    assert r["peak_bytes_early_stop_off"] >= r["peak_bytes_early_stop_on"] > 0
    assert r["step_time_s_early_stop_off"] > 0 and r["step_time_s_early_stop_on"] > 0
    assert render.EARLY_STOP is False  # restored after the measurement


def test_cached_products_make_the_tail_free_in_flops():
    r = measure("full+save_dots", CFG, batch=2, repeats=1)
    assert r["backward_flops_early_stop_off"] == r["backward_flops_early_stop_on"]
    assert r["backward_ops_early_stop_off"] > r["backward_ops_early_stop_on"]
