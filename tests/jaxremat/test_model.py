"""jaxremat.model: exact math, the NNX module's bitwise conversion, input validation, shapes."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxremat.model import GPT, block_forward, block_params_of, embed, forward, loss_fn
from jaxremat.spec import full, none, sqrt
from jaxremat.models import init_params


def test_import_spec_and_package_do_not_import_jax():
    code = "import sys, jaxremat, jaxremat.spec; assert 'jax' not in sys.modules, 'jax imported'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def _numpy_loss(cfg, params, tokens):
    """Independent float64 numpy GPT-2 forward (the formulas of the spec, written out again)."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    idx, tgt = np.asarray(tokens)[:, :-1], np.asarray(tokens)[:, 1:]
    B, T = idx.shape
    H, hd, D = cfg.n_head, cfg.head_dim, cfg.d_model

    def ln(x, w, b):
        m = x.mean(-1, keepdims=True)
        return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + cfg.layer_norm_eps) * w + b

    x = p["wte"][idx] + p["wpe"][:T]
    for i in range(cfg.n_layer):
        g = lambda n: p[f"h.{n}"][i]  # noqa: E731
        qkv = ln(x, g("ln_1.weight"), g("ln_1.bias")) @ g("attn.c_attn.weight") + g("attn.c_attn.bias")
        q, k, v = (qkv[..., j * D:(j + 1) * D].reshape(B, T, H, hd).transpose(0, 2, 1, 3) for j in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        y = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
        x = x + y @ g("attn.c_proj.weight") + g("attn.c_proj.bias")
        h = ln(x, g("ln_2.weight"), g("ln_2.bias")) @ g("mlp.c_fc.weight") + g("mlp.c_fc.bias")
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
        x = x + h @ g("mlp.c_proj.weight") + g("mlp.c_proj.bias")
    logits = ln(x, p["ln_f.weight"], p["ln_f.bias"]) @ p["wte"].T
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return float(np.mean(logz - np.take_along_axis(logits, tgt[..., None], -1)[..., 0]))


def test_loss_matches_independent_numpy_float64(tiny_cfg):
    cfg = tiny_cfg.replace(dtype="float64")
    params_np = init_params(cfg, seed=3)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, cfg.max_seq_len + 1))
    with jax.enable_x64(True):
        loss = loss_fn({k: jnp.asarray(v) for k, v in params_np.items()}, jnp.asarray(tokens, jnp.int32), cfg, none)
        assert loss.dtype == jnp.float64
        np.testing.assert_allclose(float(loss), _numpy_loss(cfg, params_np, tokens), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpt_round_trip_bitwise(tiny_cfg, dtype, bits):
    cfg = tiny_cfg.replace(dtype=dtype)
    params_np = init_params(cfg, seed=2)
    with jax.enable_x64(dtype == "float64"):
        back = GPT.from_params(cfg, params_np).to_params()
    assert list(back) == list(params_np)
    for k in params_np:
        assert back[k].dtype == np.dtype(dtype) and back[k].shape == params_np[k].shape, k
    bits.assert_tree(back, params_np, "round trip")


def test_gpt_parameters_are_nnx_params_with_layer_axis(tiny_cfg):
    gpt = GPT.from_params(tiny_cfg, init_params(tiny_cfg))
    state = nnx.state(gpt, nnx.Param)
    leaves = jax.tree_util.tree_leaves(state)
    assert len(leaves) == 16
    assert gpt.h["attn.c_attn.weight"][...].shape == (5, 16, 48)  # (N, D, 3D): layer axis leading
    assert sum(x.size for x in leaves) == sum(v.size for v in init_params(tiny_cfg).values())


def test_gpt_from_params_errors(tiny_cfg):
    params = init_params(tiny_cfg)
    with pytest.raises(ValueError, match="missing"):
        GPT.from_params(tiny_cfg, {k: v for k, v in params.items() if k != "wpe"})
    with pytest.raises(ValueError, match="dtype"):
        GPT.from_params(tiny_cfg, {**params, "wte": params["wte"].astype(np.float64)})
    cfg64 = tiny_cfg.replace(dtype="float64")
    with jax.enable_x64(False), pytest.raises(ValueError, match="jax_enable_x64"):
        GPT.from_params(cfg64, init_params(cfg64))


def test_gpt_call_shapes_and_schedule(tiny):
    cfg, params, tokens = tiny
    gpt = GPT.from_params(cfg, {k: np.asarray(v) for k, v in params.items()})
    logits = gpt(tokens[:, :-1])
    assert logits.shape == (2, cfg.max_seq_len, cfg.vocab_size) and logits.dtype == jnp.float32
    assert np.array_equal(np.asarray(logits), np.asarray(forward(params, tokens[:, :-1], cfg)))
    short = nnx.jit(lambda g, t: g(t, schedule=full))(gpt, tokens[:, :3])
    assert short.shape == (2, 3, cfg.vocab_size)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda t: t.at[0, 0].set(64), r"\[0, 64\)"),
        (lambda t: t.at[1, 2].set(-1), r"\[0, 64\)"),
        (lambda t: t[0], "shape"),
        (lambda t: t[None], "shape"),
        (lambda t: t.astype(jnp.float32), "integer"),
    ],
    ids=["id_too_large", "id_negative", "rank1", "rank3", "float_ids"],
)
def test_gpt_call_rejects_bad_tokens(tiny, make, match):
    cfg, params, tokens = tiny
    gpt = GPT.from_params(cfg, {k: np.asarray(v) for k, v in params.items()})
    with pytest.raises(ValueError, match=match):
        gpt(make(tokens[:, :-1]))


def test_too_long_sequence_rejected(tiny):
    cfg, params, tokens = tiny
    gpt = GPT.from_params(cfg, {k: np.asarray(v) for k, v in params.items()})
    with pytest.raises(ValueError, match="max_seq_len"):
        gpt(jnp.zeros((1, cfg.max_seq_len + 1), jnp.int32))
    with pytest.raises(ValueError, match="max_seq_len"):
        loss_fn(params, jnp.zeros((1, cfg.max_seq_len + 2), jnp.int32), cfg, none)


def test_loss_fn_traces_under_jit_with_shape_checks(tiny):
    cfg, params, tokens = tiny
    loss = jax.jit(loss_fn, static_argnums=(2, 3))(params, tokens, cfg, sqrt)
    assert loss.shape == () and np.isfinite(float(loss))
    # about log(V) for near-uniform logits at initialisation
    assert abs(float(loss) - np.log(cfg.vocab_size)) < 0.5


def test_block_dropout_uses_key_and_is_reproducible(tiny):
    cfg, params, _ = tiny
    cfg = cfg.replace(dropout=0.5)
    layer = {k: v[0] for k, v in block_params_of(params).items()}
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 8, 16)), jnp.float32)
    k = jax.random.key(7)
    blk = jax.jit(lambda layer, x, key: block_forward(layer, x, cfg, dropout_key=key))
    a, b = blk(layer, x, k), blk(layer, x, k)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(blk(layer, x, None)))
    # no key: deterministic even with dropout > 0
    assert np.array_equal(np.asarray(blk(layer, x, None)), np.asarray(blk(layer, x, None)))
    e = jax.jit(lambda p, i, key: embed(p, i, cfg, dropout_key=key))(params, jnp.zeros((1, 4), jnp.int32), k)
    assert e.shape == (1, 4, 16) and (np.asarray(e) == 0).any()


def test_fused_attention_remat_is_bitwise_under_jit_and_its_interior_has_no_names():
    from jaxremat.memory import saved_activation_bytes
    from jaxremat.models import TransformerConfig
    from jaxremat.spec import parse_plan

    fused = TransformerConfig(vocab_size=64, n_layer=4, d_model=32, n_head=2, d_ff=64, max_seq_len=16,
                              attention="fused")
    params = {k: jnp.asarray(v) for k, v in init_params(fused, seed=0).items()}
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 17)), jnp.int32)
    grads = {}
    for plan in ("none", "every_k(2)"):
        p = parse_plan(plan)
        _, grads[plan] = jax.jit(jax.value_and_grad(lambda q: loss_fn(q, tokens, fused, p.schedule)))(params)
    assert all(np.array_equal(grads["every_k(2)"][k], grads["none"][k]) for k in params)

    def kept(plan):
        p = parse_plan(plan)
        return saved_activation_bytes(lambda q: loss_fn(q, tokens, fused, p.schedule, policy=p.policy), params)

    # the fused call's scores and probabilities have no name: a policy naming them keeps nothing of it
    assert kept("full+save_names(attn_probs)") == kept("full") < kept("full+save_names(attn_out)")
