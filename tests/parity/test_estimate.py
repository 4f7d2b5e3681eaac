"""Estimates at real sizes: shapes and their bad input, both frameworks' rows, a budget met on its own estimate,
and the table (terminal, Markdown, JSON)."""

import json

import numpy as np
import pytest

from jaxremat.models import TransformerConfig, param_shapes
from parity.inputs import real_sizes
from parity.inputs.real_sizes import MAX_TENSOR_BYTES, REAL_SIZE_PRESETS, resolve_shape
from parity.runners import estimate_budget, estimate_table, jax_estimate, torch_estimate

GPT_TINY = TransformerConfig(vocab_size=256, n_layer=4, d_model=32, n_head=2, d_ff=64, max_seq_len=16)


def test_gpt_1_3b_is_seed_002s_shape():
    s = resolve_shape("gpt-1.3b")
    c = s.config
    assert (c.n_layer, c.d_model, c.n_head, c.d_ff, c.vocab_size, s.seq_len, s.batch_size) == (
        24, 2048, 16, 8192, 50257, 2048, 8)
    assert round(s.parameter_count / 1e9, 2) == 1.32 and set(REAL_SIZE_PRESETS) == {"gpt2-124m", "gpt2-350m",
                                                                                      "gpt-1.3b"}


def test_shapes_from_explicit_sizes_overrides_and_bfloat16():
    s = resolve_shape(n_layer=12, d_model=256, n_head=4, seq_len=256, batch_size=4, precision="bfloat16",
                      attention="fused")
    c = s.config
    assert (c.d_ff, c.vocab_size, c.max_seq_len, c.dtype, c.compute_dtype, c.attention) == (
        1024, 50257, 256, "float32", "bfloat16", "fused")
    assert "bfloat16 compute (float32 parameters, gradients and AdamW) fused" in s.describe()
    s = resolve_shape("gpt2-124m", seq_len=512, batch_size=2, n_layer=6)
    assert (s.config.n_layer, s.seq_len, s.batch_size, s.config.max_seq_len) == (6, 512, 2, 1024)
    assert resolve_shape("minilm-l6", batch_size=32, seq_len=128).config.arch == "bert"


def test_shapes_from_a_hugging_face_config_json(tmp_path):
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
            "vocab_size": 50257, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}
    (tmp_path / "config.json").write_text(json.dumps(gpt2))
    s = resolve_shape(config_path=tmp_path, seq_len=1024, batch_size=8)
    assert (s.config.arch, s.config.d_ff, s.config.dropout) == ("gpt", 3072, 0.0)
    bert = {"model_type": "bert", "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
            "intermediate_size": 1536, "max_position_embeddings": 512, "vocab_size": 30522}
    (tmp_path / "bert.json").write_text(json.dumps(bert))
    s = resolve_shape(config_path=tmp_path / "bert.json", seq_len=64, batch_size=8)
    assert (s.config.arch, s.config.n_layer, s.config.d_model) == ("bert", 6, 384)


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_layer=2, d_model=100, n_head=3, seq_len=8, batch_size=1), "n_head \\(3\\) must divide d_model \\(100\\)"),
    (dict(model="gpt-9b"), "unknown model 'gpt-9b'; valid models: gpt2-124m"),
    (dict(model="gpt2-124m", seq_len=2048), "gpt2-124m has 1024 positions; seq_len 2048 exceeds them"),
    (dict(model="minilm-l6", batch_size=3), "batch_size must be even"),
    (dict(n_layer=2, d_model=64), "missing n_head"),
    (dict(n_layer=2, d_model=64, n_head=4, seq_len=0, batch_size=1), "seq_len must be an integer >= 1"),
    (dict(n_layer=24, d_model=2048, n_head=16, seq_len=2**20, batch_size=8), "attention probabilities .* TiB"),
    (dict(n_layer=10**9, d_model=8, n_head=1, seq_len=8, batch_size=1), "n_layer 1000000000 is absurd"),
    (dict(model="gpt-1.3b", precision="float16"), "precision must be one of float32, bfloat16"),
    (dict(model="minilm-l6", attention="fused"), "not implemented for arch='bert'"),
])
def test_bad_shapes_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        resolve_shape(**kwargs)
    assert "\n" not in str(info.value)


def test_absurd_size_limit_is_a_tensor_no_device_holds():
    assert MAX_TENSOR_BYTES == 2**48 and real_sizes.MAX_LAYERS == 100_000


@pytest.fixture(scope="module")
def jax_rows():
    return jax_estimate.estimate_plans(GPT_TINY, 2, 16, [], budget="90%", menu=("save_nothing",))


def test_jax_rows_hold_every_key_state_and_a_budget_plan_within_budget(jax_rows):
    assert [r["plan"] for r in jax_rows][0] == "none" and len(jax_rows) == 2
    assert all(set(estimate_budget.ROW_KEYS) <= set(r) for r in jax_rows)
    none, planned = jax_rows
    p = none["parameters_bytes"]
    assert p == 4 * sum(int(np.prod(s)) for s in param_shapes(GPT_TINY).values())
    assert none["gradients_bytes"] == p and none["adamw_state_bytes"] == 2 * p + 4
    assert none["total_peak_bytes"] == none["activation_peak_bytes"] + 4 * p + 4 and none["ratio_to_none"] == 1.0
    assert none["recompute_flops"] == 0 and planned["recompute_flops"] > 0
    budget = planned["budget"]
    assert budget["budget"] == "90%" and budget["within_budget"] and planned["plan"].startswith("plan(")
    assert planned["total_peak_bytes"] <= budget["budget_bytes"] == int(0.9 * none["total_peak_bytes"])
    assert planned["ratio_to_none"] == planned["total_peak_bytes"] / none["total_peak_bytes"]


def test_a_bytes_budget_below_the_floor_is_refused_before_any_compile(monkeypatch):
    monkeypatch.setattr(jax_estimate, "estimate", lambda *a, **k: pytest.fail("compiled"))
    with pytest.raises(ValueError, match="below anything a plan reaches in jax") as info:
        jax_estimate.estimate_plans(GPT_TINY, 2, 16, ["full"], budget="1KiB", menu=("save_nothing",))
    assert "\n" not in str(info.value)


def test_a_compile_that_needs_more_host_memory_than_there_is_is_refused(monkeypatch):
    monkeypatch.setattr(jax_estimate, "available_memory_bytes", lambda: 2**29)
    monkeypatch.setattr(torch_estimate, "available_memory_bytes", lambda: 2**29)
    with pytest.raises(ValueError, match="needs about 1.0 GiB of host memory but 0.5 GiB is available"):
        jax_estimate.estimate_plans(GPT_TINY, 2, 16, ["full"])
    with pytest.raises(ValueError, match="4 layers needs about 1.0 GiB of host memory"):
        torch_estimate.estimate_plans(GPT_TINY, 2, 16, ["full"])


def test_torch_rows_have_the_jax_keys_and_meet_a_budget():
    rows = torch_estimate.estimate_plans(GPT_TINY, 2, 16, [], budget="90%", menu=("save_nothing", "save_dots"))
    assert rows[0]["plan"] == "none" and len(rows) == 2 and all(r["framework"] == "torch" for r in rows)
    assert all(set(estimate_budget.ROW_KEYS) <= set(r) for r in rows)
    assert rows[0]["adamw_state_bytes"] > 2 * rows[0]["parameters_bytes"] and rows[1]["recompute_flops"] > 0
    assert rows[-1]["budget"]["within_budget"] and rows[-1]["total_peak_bytes"] <= rows[-1]["budget"]["budget_bytes"]


def _row(fw, plan, total, act, **kw):
    return {"framework": fw, "plan": plan, "parameters_bytes": 5 * 2**30, "gradients_bytes": 5 * 2**30,
            "adamw_state_bytes": 10 * 2**30, "activation_peak_bytes": act, "total_peak_bytes": total,
            "ratio_to_none": None, "recompute_flops": 3.3e13, "backend": f"{fw} backend", "compile_time_s": 4.2, **kw}


def test_table_fits_100_columns_and_spells_long_plans_below():
    long = "plan(1*5+save_qkv_proj,3+save_qkv_proj,1+attention_only,1*2+save_dots,2*4+save_nothing,1:store)"
    rows = estimate_budget.add_ratios([
        _row("jax", "none", 131 * 2**30, 110 * 2**30), _row("jax", "full+attention_only", 61 * 2**30, 40 * 2**30),
        _row("torch", "none", 129 * 2**30, 113 * 2**30),
        _row("torch", long, 60 * 2**30, 40 * 2**30, budget={"budget": "64GiB", "budget_bytes": 64 * 2**30,
                                                            "within_budget": True, "attempts": [{}]})])
    text = estimate_table.terminal_table(rows)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= estimate_table.TERMINAL_WIDTH
    assert lines[0].startswith("bytes in GiB") and "[1]" in text and "within budget 64GiB" in text
    assert lines[2].split()[:8] == ["jax", "none", "5.00", "5.00", "10.00", "110.00", "131.00", "1.00"]
    assert lines[-1] == estimate_table.TORCH_TOTAL_NOTE  # PyTorch's total is not its columns' sum: said last
    assert estimate_table.TORCH_TOTAL_NOTE not in estimate_table.terminal_table(rows[:2])  # JAX's total is the sum
    md = estimate_table.markdown_table(rows)
    assert f"`{long}`" in md and "| total GiB |" in md and "- torch: torch backend" in md
    assert md.endswith("Total: the step's peak; PyTorch's may be below its columns' sum (gradients appear as "
                       "activations go).")
    assert "columns' sum" not in estimate_table.markdown_table(rows[:2])
    assert json.loads(estimate_table.to_json(rows, {"name": "gpt-1.3b"}))["rows"][1]["ratio_to_none"] == 61 / 131


def _chain(n=8):
    from jaxremat.spec.planner import BlockOption
    store = BlockOption("store", False, kept_bytes=100, working_bytes=100)
    ckpt = BlockOption("save_nothing", True, "save_nothing", kept_bytes=0, working_bytes=100, recompute_flops=1e9)
    return {"options_per_block": [[store, ckpt]] * n, "boundary_bytes": 10, "invariant_bytes": 0, "fixed_bytes": 0}


def _none_row(act=800):
    return {"framework": "jax", "plan": "none", "parameters_bytes": 1000, "gradients_bytes": 1000,
            "adamw_state_bytes": 2000, "activation_peak_bytes": act, "total_peak_bytes": 4000 + act}


def test_budget_plan_is_re_chosen_until_its_own_estimate_fits():
    seen = []

    def measure(plan):  # the "compiled" figure runs 100 bytes over the chain's prediction
        from jaxremat.spec.planner import chain_costs
        segs = [(s.length, "save_nothing" if s.checkpointed else "store") for s in plan.segments_for(8)]
        seen.append(plan.name)
        return {**_none_row(), "plan": plan.name,
                "total_peak_bytes": 4000 + chain_costs(_chain()["options_per_block"], segs, 10)[0] + 100}

    row = estimate_budget.plan_within_budget(4500, _none_row(), _chain(), 8, measure, "jax")
    assert len(seen) == 2 and row["plan"] == seen[-1] and row["total_peak_bytes"] <= 4500
    attempts = row["budget"]["attempts"]
    assert [a["within_budget"] for a in attempts] == [False, True] and attempts[1]["target_bytes"] < attempts[0][
        "target_bytes"]


def test_budget_not_met_after_the_attempts_is_one_line_with_the_lowest_row():
    measure = lambda plan: {**_none_row(), "plan": plan.name, "total_peak_bytes": 10**6}  # noqa: E731
    rows = [_none_row()]
    with pytest.raises(estimate_budget.BudgetNotMet, match="no plan was estimated within the budget") as info:
        estimate_budget.budget_row(rows, lambda: estimate_budget.plan_within_budget(4500, rows[0], _chain(), 8,
                                                                                     measure, "torch"))
    assert "\n" not in str(info.value) and info.value.row["budget"]["within_budget"] is False
    assert [r["plan"] for r in info.value.rows] == ["none", info.value.row["plan"]]
    assert info.value.rows[1]["ratio_to_none"] == 10**6 / 4800
    with pytest.raises(ValueError, match="below anything a plan reaches in jax"):
        estimate_budget.plan_within_budget(3999, _none_row(), _chain(), 8, measure, "jax")
