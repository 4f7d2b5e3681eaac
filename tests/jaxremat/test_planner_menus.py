"""The JAX planner menus (jaxremat.planner): measured on the block, checked against the account and the run."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxremat.memory import saved_activation_bytes
from jaxremat.model import loss_fn
from jaxremat.models.gpt import activation as am
from jaxremat.models.params import init_params
from jaxremat.planner import DEFAULT_MENU, block_options, gpt_block_options, gpt_chain, plan_gpt
from jaxremat.spec import parse_schedule
from jaxremat.spec.planner import NoPlanFits, chain_costs
from jaxremat.models.config import TransformerConfig

CFG = TransformerConfig(arch="gpt", vocab_size=64, n_layer=4, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
B, T = 2, 8


@pytest.fixture(scope="module")
def menu():
    return gpt_block_options(CFG, B, T)


def test_menu_lists_store_then_each_policy(menu):
    assert [o.name for o in menu] == ["store", *DEFAULT_MENU]
    assert not menu[0].checkpointed and all(o.checkpointed for o in menu[1:])


def test_store_keeps_the_accounts_layer_bytes(menu):
    assert menu[0].kept_bytes == am.layer_bytes("jax", CFG, B, T)
    assert am.stack_invariant_bytes("jax", CFG, B, T) == menu[0].segment_bytes == 0


@pytest.mark.parametrize("option", ["store", "save_nothing", "save_dots", "attention_only"])
def test_a_segments_kept_bytes_are_linear_in_its_length_up_to_four(menu, option):
    from jaxremat.planner import _gpt_block, _segment_kept  # noqa: PLC2701 - the measurement itself

    block, params, x = _gpt_block(CFG, B, T)
    o = {m.name: m for m in menu}[option]
    policy = None if option in ("store", "save_nothing") else o.policy
    assert _segment_kept(block, params, x, o.checkpointed, policy, 4) == 4 * o.kept_bytes + o.segment_bytes


def test_recompute_flops_order_and_save_nothing_is_about_one_forward(menu):
    by = {o.name: o for o in menu}
    assert by["store"].recompute_flops == 0
    # keeping more recomputes less: every policy between keeping nothing and keeping the dots
    for name in ("attention_only", "save_qkv_proj", "mlp_only"):
        assert by["save_dots"].recompute_flops < by[name].recompute_flops < by["save_nothing"].recompute_flops
    # save_nothing recomputes the block's forward except its last op (the MLP down-projection, whose output
    # only the next block reads): the forward's dot FLOPs less that dot, within the elementwise FLOPs
    D, F, H = CFG.d_model, CFG.d_ff, CFG.n_head
    hd = D // H
    dots = 2 * B * T * D * 3 * D + 2 * 2 * B * H * T * T * hd + 2 * B * T * D * D + 2 * B * T * D * F
    assert dots <= by["save_nothing"].recompute_flops < dots + 2 * B * T * D * F


@functools.lru_cache(maxsize=None)
def _inputs():
    params = {k: jnp.asarray(v) for k, v in init_params(CFG).items()}
    return params, jnp.asarray(np.random.default_rng(0).integers(0, CFG.vocab_size, (B, T + 1)), jnp.int32)


@functools.lru_cache(maxsize=None)
def _grads_none():
    """``none``'s gradients at :func:`_inputs` (not under jit), computed once for both menus below."""
    params, tok = _inputs()
    return jax.grad(lambda p: loss_fn(p, tok, CFG, parse_schedule("none")))(params)


@pytest.mark.parametrize("policies", [["save_nothing"], list(DEFAULT_MENU)])
def test_a_planned_plan_runs_bitwise_and_keeps_what_the_planner_predicts(policies):
    chain = gpt_chain(CFG, B, T, policies)
    fixed = chain["fixed_bytes"]
    none_peak = am.predict_peak_activation_bytes("jax", CFG, B, T, parse_schedule("none"))
    r = plan_gpt(CFG, B, T, int(0.7 * none_peak), policies)
    assert r.peak_bytes <= int(0.7 * none_peak) and r.recompute_flops > 0
    params, tok = _inputs()
    outside = sum(t.bytes for t in am.outside_tensors("jax", CFG, B, T))
    measured = saved_activation_bytes(lambda p: loss_fn(p, tok, CFG, r.plan), params)
    # exact: the LayerNorm weights' (1, 1, D) broadcasts are computed again in the backward pass
    # (jaxremat.layer_pass.LayerProgram.residuals), in every segment, one layer long or not
    assert measured == outside + r.saved_bytes
    g_plan = jax.grad(lambda p: loss_fn(p, tok, CFG, r.plan))(params)
    g_none = _grads_none()
    for k in g_none:  # op by op: bitwise (under jit too: tests/jaxremat/test_bitwise_jit.py)
        assert np.asarray(g_plan[k]).tobytes() == np.asarray(g_none[k]).tobytes(), k
    names = {o.name for o in chain["options_per_block"][0]}
    segs = [(s.length, (s.policy.name if s.policy is not None else "save_nothing") if s.checkpointed else "store")
            for s in r.plan.segments]
    assert {n for _, n in segs} <= names
    assert chain_costs(chain["options_per_block"], segs, chain["boundary_bytes"],
                       chain["invariant_bytes"])[0] + fixed == r.peak_bytes


def test_no_plan_fits_names_the_least_peak_on_the_budgets_scale():
    with pytest.raises(NoPlanFits) as e:
        plan_gpt(CFG, B, T, 1000)
    fixed = gpt_chain(CFG, B, T)["fixed_bytes"]
    assert e.value.min_peak_bytes > fixed and e.value.budget_bytes == 1000
    assert "raise the budget to at least" in str(e.value)


def test_a_users_own_block_gets_a_measured_menu():
    def block(p, x):
        return x + jnp.tanh(x @ p["w1"]) @ p["w2"]

    params = {"w1": jax.ShapeDtypeStruct((8, 32), jnp.float32), "w2": jax.ShapeDtypeStruct((32, 8), jnp.float32)}
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    opts = block_options(block, params, x, ["save_nothing", "save_dots"])
    # stored, each block keeps its input too (read by x @ w1's weight gradient): the scan over a stored segment
    # stacks every block's input, the first one's as well (a copy of the segment's input), so no intercept
    alone = saved_activation_bytes(lambda p, h: jnp.sum(block(p, h)), params, x)
    assert (opts[0].kept_bytes, opts[0].segment_bytes) == (alone + 4 * 8 * 4, 0)
    assert opts[1].kept_bytes == 0 and opts[1].recompute_flops >= 2 * 4 * 8 * 32
    assert opts[2].kept_bytes > 0 and opts[2].recompute_flops < opts[1].recompute_flops


@pytest.mark.parametrize("policies, match", [
    (["qkv_proj_offloaded"], "offloads"), (["save_everything"], "never better"),
    (["save_dots", "save_dots"], "distinct"), ("save_dots", "list of policy names"), (["nope"], "unknown"),
])
def test_bad_menus_are_refused(policies, match):
    with pytest.raises(ValueError, match=match):
        gpt_block_options(CFG, B, T, policies)


def test_other_families_and_dropout_are_refused():
    with pytest.raises(ValueError, match="dropout"):
        gpt_block_options(CFG.replace(dropout=0.1), B, T)
    with pytest.raises(ValueError, match="budget_bytes"):
        plan_gpt(CFG, B, T, -1)


BERT = TransformerConfig(arch="bert", vocab_size=64, n_layer=4, d_model=16, n_head=2, d_ff=32, max_seq_len=8,
                         layer_norm_eps=1e-12, dropout=0.0)


def test_the_encoder_chain_is_measured_on_its_block_and_its_plan_runs():
    from jaxremat.encoder import loss_fn as encoder_loss
    from jaxremat.planner import model_chain, plan_model

    chain = model_chain(BERT, 4, T)
    menu = chain["options_per_block"][0]
    assert [o.name for o in menu] == ["store", *DEFAULT_MENU] and len(chain["options_per_block"]) == 4
    assert chain["fixed_bytes"] == chain["invariant_bytes"] == 0 and chain["boundary_bytes"] == 4 * T * 16 * 4
    # a stored stack of 4 keeps what the encoder's own stack keeps (its residuals less what lies outside it)
    assert menu[0].kept_bytes > menu[2].kept_bytes > 0 == menu[1].kept_bytes
    store_all = chain_costs(chain["options_per_block"], [(4, "store")], chain["boundary_bytes"])[0]
    from jaxremat.spec.planner import min_peak_plan
    least = min_peak_plan(chain["options_per_block"], chain["boundary_bytes"])[0]
    r = plan_model(BERT, 4, T, (least + store_all) // 2)
    assert r.recompute_flops > 0 and r.peak_bytes <= (least + store_all) // 2
    # at the least peak only one-block checkpointed segments fit (a 2-block one recomputes a stored block more):
    # the space holds them, and they are bitwise under jit (docs/framework-differences.md, 2). Which plan the
    # half-way budget picks turns on the menu's FLOP counts, which JAX's GELU changes (0.12.1: 22528 fewer).
    tight = plan_model(BERT, 4, T, least)
    assert tight.peak_bytes == least and any(s.length == 1 and s.checkpointed for s in tight.plan.segments), tight.plan
    params = {k: jnp.asarray(v) for k, v in init_params(BERT).items()}
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 64, (4, T)))
    grad = jax.jit(jax.grad(encoder_loss), static_argnums=(2, 3))
    grads = [grad(params, tokens, BERT, s) for s in (parse_schedule("none"), tight.plan)]
    for k in grads[0]:  # under jit: the plan changes no bit
        assert np.array_equal(np.asarray(grads[0][k]), np.asarray(grads[1][k])), k
    with pytest.raises(ValueError, match="encoder_chain plans the BERT"):
        from jaxremat.planner import encoder_chain
        encoder_chain(CFG, B, T)
