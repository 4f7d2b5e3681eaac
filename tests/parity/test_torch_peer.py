"""Hugging Face ``BertModel`` with its own gradient checkpointing beside torchref's ``full``: one training step
of a tiny random encoder, through PyTorch's ``peer_step_rows`` verb."""

import numpy as np
import pytest

import parity.checks.peer
from jaxremat.models import TransformerConfig, init_params
from parity.checks.compare import tolerance_for
from parity.inputs.checkpoints import canonical_to_hf
from parity.report.peer_report import PEER_STEP_COLUMNS, peer_step_markdown, peer_step_row
from parity.runners.framework import get_framework
from parity.runners.torch_peer import PEER_STEP_CHECK, STEP_VARIANTS, hf_checkpointing_peer


@pytest.fixture(scope="module", autouse=True)
def _transformers():
    """Skip the module without transformers; checked when its first test runs, not at import (every xdist worker
    imports every test module, and importing transformers takes ~0.9 s)."""
    pytest.importorskip("transformers", reason="transformers is a dev extra: pip install -e '.[dev]'")

CFG = TransformerConfig(arch="bert", vocab_size=50, n_layer=3, d_model=32, n_head=4, d_ff=64, max_seq_len=16,
                        layer_norm_eps=1e-12, dropout=0.1)
STEP_KEYS = {"check", "dtype", "batch_size", "seq_len", "peak_bytes", "peak_activation_bytes", "step_time_s",
             "peak_ratio", "time_ratio", "time_ratio_range", "none", "checkpointing_peak_ratio", "loss_err",
             "loss_abs_diff", "max_rel_err_grads", "worst_grad", "tolerance", "tolerance_loss",
             "none_max_rel_err_grads", "bitwise_to_none", "ok", "note"}


def _ids():
    ids = np.random.default_rng(1).integers(1, CFG.vocab_size, (4, 12))
    ids[1, 8:] = 0
    ids[3, 5:] = 0
    return ids


@pytest.fixture(scope="module")
def tiny_step():
    params = init_params(CFG, seed=0)
    (row,) = get_framework("torch").peer_step_rows(CFG, params, _ids(), 1)
    return params, row


def test_peer_step_row_holds_every_measure(tiny_step):
    _, row = tiny_step
    assert set(row) == STEP_KEYS and row["check"] == PEER_STEP_CHECK
    assert (row["batch_size"], row["seq_len"], row["dtype"]) == (4, 12, "float32")
    for key in ("peak_bytes", "peak_activation_bytes", "step_time_s"):
        assert tuple(row[key]) == STEP_VARIANTS and all(v > 0 for v in row[key].values()), row[key]
    act, peak = row["peak_activation_bytes"], row["peak_bytes"]
    assert all(act[k] < peak[k] for k in STEP_VARIANTS)
    hf, ours, hf_none, ours_none = STEP_VARIANTS
    assert row["peak_ratio"] == act[hf] / act[ours] and row["none"]["peak_ratio"] == act[hf_none] / act[ours_none]
    assert row["time_ratio_range"][0] <= row["time_ratio"] <= row["time_ratio_range"][1]
    # checkpointing every layer keeps less than none in both, and changes no bit of the step in either
    assert row["checkpointing_peak_ratio"]["transformers"] < 1 and row["checkpointing_peak_ratio"]["torchref"] < 1
    assert row["bitwise_to_none"] == {"transformers": True, "torchref": True}
    assert row["tolerance"] == tolerance_for("float32").bound
    assert row["ok"] is True and 0 < row["max_rel_err_grads"] <= row["tolerance"], row
    assert row["loss_err"] <= row["tolerance_loss"] and row["none_max_rel_err_grads"] <= row["tolerance"]
    assert "MemTracker" in row["note"] and "use_reentrant=False" in row["note"]
    cells = peer_step_row(row)
    assert len(cells) == len(PEER_STEP_COLUMNS) and cells[2] == "4 x 12" and cells[-1] == "yes"
    assert PEER_STEP_CHECK in "\n".join(peer_step_markdown({"peer_step": [row]}))


def test_peer_step_fails_on_a_wrong_weight(tiny_step, monkeypatch):
    params, _ = tiny_step

    def one_weight_off(cfg, params):
        state = canonical_to_hf(cfg, params)
        key = "encoder.layer.1.intermediate.dense.weight"
        state[key] = state[key] + np.float32(1e-3)
        return state

    monkeypatch.setattr(parity.checks.peer, "canonical_to_hf", one_weight_off)
    row = hf_checkpointing_peer(CFG, params, _ids(), repeats=1)
    assert row["ok"] is False and row["max_rel_err_grads"] > row["tolerance"], row


def test_peer_step_is_pytorchs_alone_and_refuses_bad_repeats(tiny_step):
    params, _ = tiny_step
    assert get_framework("jax").peer_step_rows(CFG, params, _ids(), 1) == []
    assert get_framework("torch").peer_step_rows(CFG.replace(arch="gpt"), params, _ids(), 1) == []
    with pytest.raises(ValueError, match="repeats"):
        hf_checkpointing_peer(CFG, params, _ids(), repeats=0)
