"""JAX and PyTorch agree on the same weights and real tokens, within the dtype's tolerance."""

import numpy as np
import pytest

from jaxremat.models import TransformerConfig, init_params
from parity.inputs.train import AdamWConfig
from parity.checks.compare import cross_check, cross_row, max_rel_err, tolerance_for
from parity.inputs.corpus import token_batch
from parity.runners.torch_loss_terms import loss_term_scale
from parity.runners.result import RunResult


def _result(loss, grads) -> RunResult:
    """A runner result with only what a cross-framework row reads: the loss and the gradients."""
    return RunResult(loss=np.asarray(loss), grads=grads, trained=None, mode="jit")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_frameworks_agree_within_tolerance_table(dtype, run_framework):
    cfg = TransformerConfig(n_layer=3, d_model=32, n_head=4, d_ff=64, max_seq_len=16, dtype=dtype)
    params, tokens = init_params(cfg, seed=3), token_batch(2, 16, seed=3)
    hp = AdamWConfig(steps=1)
    # loss and gradients only (with_training=False): the rows compare nothing else, and JAX compiles no AdamW update
    j = run_framework("jax", cfg, params, tokens, "every_k(2)", mode="jit", hparams=hp, timing_repeats=1,
                      with_reverse_loop=False, with_training=False)
    t = run_framework("torch", cfg, params, tokens, "every_k(2)", hparams=hp, timing_repeats=1, with_reverse_loop=False,
                      with_training=False)
    scale = loss_term_scale(cfg, params, tokens)
    r = cross_check(j.loss, t.loss, j.grads, t.grads, scale, dtype)
    assert r["ok"], r
    # the comparison is not vacuous: the gradients are nonzero and differ from the weights' scale
    assert all(abs(g).max() > 0 for g in t.grads.values())
    # one gradient tensor off by one part in a thousand fails (rounding stays far below that)
    name = r["worst_grad"]
    wrong = dict(t.grads, **{name: t.grads[name] * (1 + 1e-3)})
    bad = cross_check(j.loss, t.loss, j.grads, wrong, scale, dtype)
    assert not bad["ok"] and not bad["grads_ok"] and bad["max_rel_err_grads"] > 10 * tolerance_for(dtype).bound
    # a wrong weight conversion (transposed projection) is caught far above the tolerance
    swapped = dict(params)
    w = params["h.mlp.c_fc.weight"]
    swapped["h.mlp.c_fc.weight"] = w[:, ::-1, :].copy()
    t_bad = run_framework("torch", cfg, swapped, tokens, "every_k(2)", hparams=hp, timing_repeats=1,
                          with_reverse_loop=False, with_training=False)
    assert max_rel_err(j.grads, t_bad.grads) > 100 * tolerance_for(dtype).bound
    assert not cross_check(j.loss, t_bad.loss, j.grads, t_bad.grads, scale, dtype)["loss_ok"]


def test_loss_term_scale_is_the_size_of_the_cross_entropy_terms(run_framework):
    cfg = TransformerConfig(n_layer=2, d_model=32, n_head=4, d_ff=64, max_seq_len=16)
    params, tokens = init_params(cfg, seed=0), token_batch(2, 16, seed=0)
    t = run_framework("torch", cfg, params, tokens, "every_k(1)", hparams=AdamWConfig(steps=1), timing_repeats=1,
                      with_reverse_loop=False)
    scale = loss_term_scale(cfg, params, tokens)
    # at initialisation the logits are near 0: logsumexp is about log V and the terms do not cancel
    assert float(t.loss) <= scale < float(t.loss) * 1.1
    assert scale == pytest.approx(np.log(cfg.vocab_size), rel=0.05)


def test_loss_term_scale_of_the_contrastive_loss_is_its_similarity_logits(run_framework):
    from torchref.encoder import CONTRASTIVE_SCALE

    cfg = TransformerConfig(arch="bert", vocab_size=64, n_layer=2, d_model=16, n_head=2, d_ff=32, max_seq_len=8,
                            layer_norm_eps=1e-12)
    params = init_params(cfg, seed=1)
    ids = np.random.default_rng(0).integers(1, cfg.vocab_size, (4, 8))
    ids[1, 5:] = 0
    j = run_framework("jax", cfg, params, ids, "every_k(1)", mode="jit", hparams=AdamWConfig(steps=1),
                      timing_repeats=1, with_reverse_loop=False, with_training=False)
    scale = loss_term_scale(cfg, params, ids)
    # logits are 20 * cosine similarities: each term is at most 20 + log(pairs) in size
    assert float(j.loss) <= scale <= 2 * (CONTRASTIVE_SCALE + np.log(2))
    assert scale > 10  # random embeddings are alike (cosine near 1): the terms are near 20, not near the loss


def test_suite_cross_row_fields_and_report_columns():
    from parity.report.suite_report import CROSS_COLUMNS
    from parity.report.suite_report import cross_row as cross_cells

    g = {"w": np.ones((2, 3), np.float32)}
    row = cross_row("sqrt", "float32", _result(np.float32(0.02), g),
                    _result(np.float32(0.02) + np.float32(5e-7), g), 33.1)
    assert row["ok"] and row["error"] is None and row["loss_term_scale"] == 33.1
    assert row["tolerance"] == tolerance_for("float32").bound
    assert row["tolerance_loss"] == tolerance_for("float32", "loss").bound
    assert row["tolerance_reason"] == tolerance_for("float32").reason and "terms" in row["tolerance_loss_reason"]
    assert row["loss_err"] == pytest.approx(5e-7 / 33.1, rel=1e-2) and row["max_rel_err_loss"] > row["loss_err"]
    shown = dict(zip(CROSS_COLUMNS, cross_cells(row)))
    assert shown["loss err"] == f"{row['loss_err']:.2e}" and shown["grads tol"] == f"{row['tolerance']:.2e}"
    assert shown["ok"] == "yes" and shown["plan"] == "sqrt"
    # the rows of every suite come from this one builder: a variant is shown beside its plan
    variant = cross_row("none", "float32", _result(1.0, g), _result(1.0, g), 1.0, variant="frozen")
    assert dict(zip(CROSS_COLUMNS, cross_cells(variant)))["plan"] == "frozen: none"
    missing = cross_row("none", "float32", None, _result(1.0, g), 1.0)
    assert not missing["ok"] and "did not complete" in missing["error"]
    no_scale = cross_row("none", "float32", _result(1.0, g), _result(1.0, g), None, failure="scale: boom")
    assert not no_scale["ok"] and no_scale["error"] == "scale: boom"
    # trainable entries only (the frozen variant): the gradients compared are the ones given
    wrong = {"w": np.full((2, 3), 2.0, np.float32)}
    assert not cross_row("none", "float32", _result(1.0, g), _result(1.0, wrong), 1.0)["ok"]
    assert cross_row("none", "float32", _result(1.0, g), _result(1.0, wrong), 1.0, grads_a=g, grads_b=g)["ok"]
