"""The stress suite: its variants appear for both frameworks and pass; frozen parameters in JAX."""

import numpy as np
import pytest

from jaxremat.models import TransformerConfig, init_params
from parity.inputs.train import AdamWConfig
from parity.cases import stress_frozen
from parity.checks.compare import compare_bitwise
from parity.inputs.presets import get_preset
from parity.report.suite_report import markdown
from parity.cases.stress import VARIANTS, run_stress
from parity.cases.stress_user import UserStack
from parity.cases.suite import SuiteConfig
from parity.checks.verdict import report_passed

MODES = {("jax", "jit"), ("jax", "eager"), ("torch", "eager")}


def test_stress_suite_lists_every_variant_and_the_user_stack_variants_pass():
    suite = SuiteConfig(name="stress", preset=get_preset("gpt-tiny"), plans=("every_k(2)",), timing_repeats=1)
    assert {"bf16", "frozen", "running_stats", "dropout(0.1)+noise", "dropout(0.5)+noise"} == set(VARIANTS)
    report = run_stress(suite, variants=("running_stats", "dropout(0.5)+noise"),
                        user_stack=UserStack(d_model=16, d_ff=32, batch=2, seq=8))
    cases = report["cases"]
    assert {(c["variant"], c["framework"], c["mode"], c["plan"]) for c in cases} == {
        (v, f, m, s) for v in ("running_stats", "dropout(0.5)+noise") for f, m in MODES for s in ("none", "every_k(2)")}
    for c in cases:
        assert c["status"] == "pass", c
        assert c["grads_bitwise_equal"] and c["weights_bitwise_equal"], c
        if c["variant"] == "running_stats":
            assert c["state_bitwise_equal"] and c["state_counts"] == [3], c
    assert [x["variant"] for x in report["cross_framework"]] == ["running_stats", "running_stats"]
    assert all(x["ok"] for x in report["cross_framework"]) and report_passed(report)
    assert "running_stats: every_k(2)" in markdown(report)


CFG = TransformerConfig(vocab_size=64, n_layer=4, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
TOKENS = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, CFG.max_seq_len + 1))
HP = AdamWConfig(steps=2)


@pytest.fixture(scope="module")
def frozen_runs(run_framework):
    params = init_params(CFG, seed=1)
    runs = {(fw, s): run_framework(fw, CFG, params, TOKENS, s, hparams=HP, frozen=True)
            for fw in ("jax", "torch") for s in ("none", "every_k(2)")}
    return params, runs


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_frozen_trainable_grads_bitwise_present_and_frozen_weights_unchanged(frozen_runs, framework):
    params, runs = frozen_runs
    ref, got = runs[framework, "none"], runs[framework, "every_k(2)"]
    train = stress_frozen.split_trainable(CFG, got.grads)
    assert sorted(k for k in train if k.startswith("h.ln_1.weight")) == ["h.ln_1.weight[2]", "h.ln_1.weight[3]"]
    assert "wte" not in train and "ln_f.weight" in train
    assert all(np.any(g) for g in train.values())  # none None, none zero
    assert compare_bitwise(train, stress_frozen.split_trainable(CFG, ref.grads)).equal
    assert compare_bitwise(got.trained, ref.trained).equal
    assert compare_bitwise(stress_frozen.frozen_entries(CFG, got.trained), stress_frozen.frozen_entries(CFG, params)).equal
    moved, start = stress_frozen.split_trainable(CFG, got.trained), stress_frozen.split_trainable(CFG, params)
    assert all(not compare_bitwise({k: v}, {k: start[k]}).equal for k, v in moved.items())
    if framework == "torch":
        assert got.frozen_grads_none is True
    else:
        assert all(not np.any(g) for g in stress_frozen.frozen_entries(CFG, got.grads).values())
