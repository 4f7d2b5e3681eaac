"""``python -m parity finetune``: every plan's losses and trained weights against none step by step, both
frameworks, JAX against PyTorch, and an interrupted run continued (a tiny local BERT checkpoint)."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="safetensors is a dev/minilm extra: pip install -e '.[dev]'")
pytest.importorskip("tokenizers", reason="tokenizers is a dev/minilm extra: pip install -e '.[dev]'")

from jaxremat.models import TransformerConfig, init_params  # noqa: E402
from parity.cases.finetune import loss_bits, resumable, trained_bound, weights_digest  # noqa: E402
from parity.cli.run import main  # noqa: E402
from parity.inputs.checkpoints import save_hf_checkpoint  # noqa: E402
from parity.inputs.pretrained import FINE_TUNE, checkpoint_preset, preset_batches  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, word_tokenizer):
    ckpt = tmp_path_factory.mktemp("tiny-bert")
    vocab = word_tokenizer(ckpt)
    cfg = TransformerConfig(arch="bert", vocab_size=vocab, n_layer=4, d_model=32, n_head=2, d_ff=64, max_seq_len=32,
                            layer_norm_eps=1e-12, dropout=0.1)
    save_hf_checkpoint(ckpt, cfg, init_params(cfg, seed=0))
    out = tmp_path_factory.mktemp("ft") / "out"
    argv = ["finetune", "--checkpoint", str(ckpt), "--steps", str(STEPS), "--schedules", "none,every_k(2)",
            "--no-progress", "--out", str(out)]
    rc = main(argv)
    return rc, out, argv


def test_every_plan_is_bitwise_at_every_step_in_both_frameworks(tiny_run):
    rc, out, _ = tiny_run
    report = json.loads((out / "finetune.json").read_text())
    cases = report["cases"]
    assert {(c["framework"], c["mode"], c["plan"], c["dropout"]) for c in cases} == {
        ("jax", "jit", "none", 0.1), ("jax", "jit", "every_k(2)", 0.1), ("torch", "eager", "none", 0.1),
        ("torch", "eager", "every_k(2)", 0.1), ("jax", "jit", "none", 0.0), ("torch", "eager", "none", 0.0)}
    for c in cases:
        assert len(c["losses"]) == len(c["loss_bits"]) == STEPS and c["losses_bitwise_equal"], c
        assert c["weights_bitwise_equal"] and len(c["weights_digest"]) == 64
        assert np.frombuffer(bytes.fromhex(c["loss_bits"][-1]), np.float32)[0] == np.float32(c["losses"][-1])
    by = {(c["framework"], c["plan"], c["dropout"]): c for c in cases}
    # dropout draws other masks than without: the runs at 0.1 and at 0 are not the same computation
    assert by["torch", "none", 0.1]["loss_bits"] != by["torch", "none", 0.0]["loss_bits"]
    (cross,) = report["cross_framework"]
    assert len(cross["loss_err_per_step"]) == STEPS and cross["ok"], cross
    assert 0 < cross["trained_max_rel_err"] <= cross["tolerance_trained"]
    assert rc == 0 or any(c["status"] == "no_saving" for c in cases)  # a tiny model may save nothing
    assert (out / "loss_curve.png").stat().st_size > 0 and "loss_curves" in (out / "report.html").read_text()
    assert "losses bitwise" in (out / "finetune.md").read_text()


def test_an_interrupted_run_is_continued_from_its_finished_cases(tiny_run, capsys):
    rc, out, argv = tiny_run
    report = json.loads((out / "finetune.json").read_text())
    kept = [c for c in report["cases"] if not (c["framework"] == "torch" and c["plan"] == "every_k(2)")]
    (out / "finetune.json").write_text(json.dumps({**report, "cases": kept, "complete": False}))
    capsys.readouterr()
    assert main(argv) == rc
    err = capsys.readouterr().err
    assert f"{len(kept)} finished cases kept" in " ".join(err.split())  # a note folds to the terminal's width
    again = json.loads((out / "finetune.json").read_text())
    redone = next(c for c in again["cases"] if c["framework"] == "torch" and c["plan"] == "every_k(2)")
    assert redone["resumed"] is False and redone["losses_bitwise_equal"] and redone["weights_bitwise_equal"]
    assert sum(c["resumed"] for c in again["cases"]) == len(kept)
    # another setting: one line, exit 2, nothing run
    (out / "finetune.json").write_text(json.dumps({**report, "complete": False}))
    assert main([*argv[:4], str(STEPS + 1), *argv[5:]]) == 2
    assert "interrupted run with another steps (3, not 4)" in capsys.readouterr().err


def test_jax_runner_on_the_encoder_is_bitwise_under_jit(tiny_run, run_framework):
    # The JAX runner (parity.runners.jax_runner.run_plan, the suite's path) on tiny_run's encoder (dropout 0.1),
    # first batch and AdamW settings: its loss+gradient programs are the ones tiny_run compiled
    # (jax_runner.compiled_step, once per model, plan, batch shape and dropout key in a process), so this test
    # adds no compile of them (a dropout encoder's costs ~7 s of CPU each).
    from parity.checks.compare import compare_bitwise

    _, _, argv = tiny_run
    preset = checkpoint_preset(Path(argv[argv.index("--checkpoint") + 1]))
    cfg, params, batches = preset_batches(preset, "float32", 0, 1)
    cfg = cfg.replace(dropout=max(preset.dropouts))  # the rate tiny_run's plans trained at
    assert cfg.arch == "bert" and cfg.dropout == 0.1
    hp = dataclasses.replace(preset.hparams or FINE_TUNE, steps=2)
    runs = [run_framework("jax", cfg, params, batches[0], s, mode="jit", hparams=hp, timing_repeats=1,
                          with_reverse_loop=False) for s in ("none", "every_k(2)")]
    assert compare_bitwise(runs[1].grads, runs[0].grads).equal
    assert compare_bitwise(runs[1].trained, runs[0].trained).equal
    assert runs[1].memory.saved_bytes < runs[0].memory.saved_bytes


def test_resumable_and_the_digest():
    a = {"w": np.ones(3, np.float32)}
    assert weights_digest(a) == weights_digest({"w": np.ones(3, np.float32)})
    assert weights_digest(a) != weights_digest({"w": np.ones(3, np.float64)})
    assert loss_bits(np.array([1.0], np.float32)) == ["0000803f"]
    eps = float(np.finfo(np.float32).eps)  # measured on minilm-l6: 48 eps after 1 step, 95 after 16
    assert (trained_bound("float32", 1), trained_bound("float32", 16)) == (256 * eps, 496 * eps)
    fp = {k: 1 for k in ("model", "config", "batch_size", "seq_len", "steps", "hparams", "seed", "plans", "frameworks")}
    done = {"framework": "jax", "mode": "jit", "plan": "none", "dropout": 0.1, "status": "pass", "weights_digest": "x"}
    assert resumable({**fp, "complete": False, "cases": [done]}, fp) == ({("jax", "jit", "none", 0.1): done}, None)
    assert resumable({**fp, "complete": True, "cases": [done]}, fp) == ({}, None)
