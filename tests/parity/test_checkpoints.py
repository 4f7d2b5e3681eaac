"""parity.inputs.checkpoints: Hugging Face directories in and out, exact, with errors naming key and shapes."""

import json

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="safetensors is a dev/minilm extra: pip install -e '.[dev]'")
from safetensors.numpy import load_file, save_file  # noqa: E402

from jaxremat.models import TransformerConfig, init_params  # noqa: E402
from parity.inputs.checkpoints import (  # noqa: E402
    config_from_hf, hf_config_dict, hf_shapes, load_hf_checkpoint, save_hf_checkpoint,
)
from parity.checks.compare import compare_bitwise  # noqa: E402

BERT = TransformerConfig(arch="bert", vocab_size=40, n_layer=2, d_model=8, n_head=2, d_ff=16, max_seq_len=12,
                         layer_norm_eps=1e-12, dropout=0.1)
GPT2 = TransformerConfig(vocab_size=40, n_layer=2, d_model=8, n_head=2, d_ff=32, max_seq_len=12)


@pytest.fixture(params=[BERT, GPT2], ids=["bert", "gpt2"])
def ckpt(request, tmp_path):
    cfg = request.param
    params = init_params(cfg, seed=2)
    return cfg, params, save_hf_checkpoint(tmp_path / "ckpt", cfg, params)


def _rewrite(path, change):
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_round_trip_is_bitwise(ckpt):
    cfg, params, path = ckpt
    loaded_cfg, loaded = load_hf_checkpoint(path)
    assert loaded_cfg == cfg
    assert compare_bitwise(loaded, params).equal


def test_float64_load_is_an_exact_upcast(ckpt):
    cfg, params, path = ckpt
    _, loaded = load_hf_checkpoint(path, dtype="float64")
    assert all(v.dtype == np.float64 and np.array_equal(v, params[k].astype(np.float64)) for k, v in loaded.items())


def test_bert_keys_are_huggingface_names():
    keys = set(hf_shapes(BERT))
    assert "encoder.layer.1.attention.self.query.weight" in keys and "embeddings.LayerNorm.bias" in keys
    assert hf_shapes(BERT)["encoder.layer.0.intermediate.dense.weight"] == (16, 8)  # nn.Linear (out, in)


def test_missing_key_names_key_and_shape(ckpt):
    cfg, _, path = ckpt
    key = "encoder.layer.1.output.dense.bias" if cfg.arch == "bert" else "h.1.mlp.c_proj.bias"
    _rewrite(path, lambda t: t.pop(key))
    with pytest.raises(ValueError, match=rf"missing key '{key}' \(expected shape \(8,\)\)"):
        load_hf_checkpoint(path)


def test_unexpected_key_names_key_and_shape(ckpt):
    _, _, path = ckpt
    _rewrite(path, lambda t: t.update({"extra.head.weight": np.zeros((3, 5), np.float32)}))
    with pytest.raises(ValueError, match=r"unexpected key 'extra.head.weight' \(shape \(3, 5\)\)"):
        load_hf_checkpoint(path)


def test_shape_mismatch_names_key_and_both_shapes(ckpt):
    cfg, _, path = ckpt
    key = "embeddings.word_embeddings.weight" if cfg.arch == "bert" else "wte.weight"
    _rewrite(path, lambda t: t.update({key: np.zeros((41, 8), np.float32)}))
    with pytest.raises(ValueError, match=rf"'{key}': shape \(41, 8\) in the checkpoint, expected \(40, 8\)"):
        load_hf_checkpoint(path)


def test_known_non_parameter_keys_and_prefix_are_accepted(tmp_path):
    params = init_params(BERT, seed=2)
    path = save_hf_checkpoint(tmp_path, BERT, params)

    def add_heads(t):
        for k in list(t):
            t["bert." + k] = t.pop(k)
        t["bert.pooler.dense.weight"] = np.zeros((8, 8), np.float32)
        t["bert.embeddings.position_ids"] = np.arange(12, dtype=np.int64)[None]
        t["cls.predictions.bias"] = np.zeros(40, np.float32)

    _rewrite(path, add_heads)
    assert compare_bitwise(load_hf_checkpoint(path)[1], params).equal


def test_gpt2_untied_head_is_refused(tmp_path):
    path = save_hf_checkpoint(tmp_path, GPT2, init_params(GPT2, seed=2))
    _rewrite(path, lambda t: t.update({"lm_head.weight": np.ones((40, 8), np.float32)}))
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_hf_checkpoint(path)


def test_pickle_only_directory_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(BERT)))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ValueError, match="pickle files are never loaded"):
        load_hf_checkpoint(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "t5"}, "model_type 't5' is not supported"),
    ({"hidden_act": "relu"}, "hidden_act 'relu'"),
    ({"attention_probs_dropout_prob": 0.2}, "dropout rates differ"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
])
def test_unsupported_config_is_a_clear_error(change, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**hf_config_dict(BERT), **change})


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_hf_checkpoint(tmp_path / "nope")


def test_malformed_config_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="must hold a JSON object"):
        config_from_hf([])
    with pytest.raises(ValueError, match="missing field 'vocab_size'"):
        config_from_hf({"model_type": "bert"})
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError):
        load_hf_checkpoint(f)
