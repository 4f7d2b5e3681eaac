"""torchref.model: exact math, canonical conversion round trips, input validation."""

import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from jaxremat.models import TransformerConfig, init_params, param_shapes
from torchref.model import GPT, split_tokens

TINY = TransformerConfig(vocab_size=50, n_layer=3, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
REPO = pathlib.Path(__file__).resolve().parents[2]


def _uint(a: np.ndarray) -> np.ndarray:
    return a.view({4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _tokens(cfg, batch=2, seq=8, seed=0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, cfg.vocab_size, (batch, seq + 1)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_params_round_trip_bitwise(dtype):
    cfg = TINY.replace(dtype=dtype)
    params = init_params(cfg, seed=3)
    rng = np.random.default_rng(1)
    for k in params:  # full-range random bit patterns, not only N(0, 0.02) values
        params[k] = (params[k] * rng.uniform(-1e3, 1e3, params[k].shape)).astype(dtype)
    tiny = np.finfo(dtype).smallest_subnormal
    params["wte"].flat[:5] = [-0.0, tiny, -tiny, np.inf, np.nan]
    back = GPT.from_params(cfg, params).to_params()
    assert list(back) == list(param_shapes(cfg))
    for k, v in params.items():
        assert back[k].dtype == np.dtype(dtype) and back[k].flags.c_contiguous, k
        assert np.array_equal(_uint(back[k]), _uint(v)), k


def test_from_params_transposes_linear_weights_only():
    params = init_params(TINY, seed=0)
    model = GPT.from_params(TINY, params)
    block = model.blocks[1]
    assert isinstance(model.blocks, torch.nn.ModuleList) and len(model.blocks) == TINY.n_layer
    assert block.attn.c_attn.weight.shape == (3 * TINY.d_model, TINY.d_model)
    np.testing.assert_array_equal(block.attn.c_attn.weight.detach().numpy(), params["h.attn.c_attn.weight"][1].T)
    np.testing.assert_array_equal(block.mlp.c_proj.weight.detach().numpy(), params["h.mlp.c_proj.weight"][1].T)
    np.testing.assert_array_equal(block.ln_2.weight.detach().numpy(), params["h.ln_2.weight"][1])
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_from_params_rejects_bad_params():
    params = init_params(TINY)
    with pytest.raises(ValueError, match="expected dtype float32"):
        GPT.from_params(TINY, {**params, "wte": params["wte"].astype(np.float64)})
    with pytest.raises(ValueError, match="missing"):
        GPT.from_params(TINY, {k: v for k, v in params.items() if k != "ln_f.bias"})
    with pytest.raises(ValueError, match="h.mlp.c_fc.weight"):
        GPT.from_params(TINY, {**params, "h.mlp.c_fc.weight": params["h.mlp.c_fc.weight"][:, :, :3]})


def test_grads_to_params_requires_a_backward():
    with pytest.raises(ValueError, match="no gradient"):
        GPT.from_params(TINY, init_params(TINY)).to_params(grads=True)


def test_forward_shape_and_dtype():
    for dtype in ("float32", "float64"):
        cfg = TINY.replace(dtype=dtype)
        model = GPT.from_params(cfg, init_params(cfg))
        logits = model(_tokens(cfg, batch=3, seq=5)[:, :-1])
        assert logits.shape == (3, 5, cfg.vocab_size) and logits.dtype == getattr(torch, dtype)
        loss = model.loss(_tokens(cfg))
        assert loss.shape == () and loss.dtype == getattr(torch, dtype)


def test_input_validation_errors():
    model = GPT.from_params(TINY, init_params(TINY))
    idx = _tokens(TINY)[:, :-1]
    with pytest.raises(ValueError, match="vocab_size"):
        model(idx.clone().fill_(TINY.vocab_size))
    with pytest.raises(ValueError, match="vocab_size"):
        model(idx.clone().fill_(-1))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, TINY.max_seq_len + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="rank 1"):
        model(idx[0])
    with pytest.raises(ValueError, match="integer"):
        model(idx.double())
    with pytest.raises(ValueError, match=r"\(B, T\+1\)"):
        model.loss(idx[0])
    with pytest.raises(ValueError, match="2 columns"):
        split_tokens(idx[:, :1])


def _np_layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)  # biased variance
    return (x - mu) / np.sqrt(var + eps) * w + b


def _np_loss(cfg, p, tokens):
    """The spec's math written in numpy (float64), independently of torch."""
    idx, tgt = tokens[:, :-1], tokens[:, 1:]
    B, T = idx.shape
    H, hd = cfg.n_head, cfg.head_dim
    x = p["wte"][idx] + p["wpe"][:T]
    for l in range(cfg.n_layer):
        g = lambda name: p["h." + name][l]  # noqa: E731
        h = _np_layer_norm(x, g("ln_1.weight"), g("ln_1.bias"), cfg.layer_norm_eps)
        q, k, v = np.split(h @ g("attn.c_attn.weight") + g("attn.c_attn.bias"), 3, axis=-1)
        q, k, v = (t.reshape(B, T, H, hd).transpose(0, 2, 1, 3) for t in (q, k, v))
        s = (q @ k.transpose(0, 1, 3, 2)) * (1 / math.sqrt(hd))
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        y = (pr @ v).transpose(0, 2, 1, 3).reshape(B, T, -1)
        x = x + y @ g("attn.c_proj.weight") + g("attn.c_proj.bias")
        h2 = _np_layer_norm(x, g("ln_2.weight"), g("ln_2.bias"), cfg.layer_norm_eps)
        a = h2 @ g("mlp.c_fc.weight") + g("mlp.c_fc.bias")
        m = 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))
        x = x + m @ g("mlp.c_proj.weight") + g("mlp.c_proj.bias")
    logits = _np_layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], cfg.layer_norm_eps) @ p["wte"].T
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, tgt[..., None], -1).mean()


def test_loss_matches_numpy_transcription_of_the_spec():
    cfg = TINY.replace(dtype="float64")
    params = init_params(cfg, seed=5)
    tokens = _tokens(cfg, batch=2, seq=7, seed=2)
    got = GPT.from_params(cfg, params).loss(tokens).item()
    want = _np_loss(cfg, params, tokens.numpy())
    assert got == pytest.approx(want, rel=1e-12)


def test_import_torchref_does_not_import_jax():
    code = "import torchref, sys; assert 'jax' not in sys.modules, sorted(m for m in sys.modules if 'jax' in m)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_from_params_leaves_global_rng_untouched():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    GPT.from_params(TINY, init_params(TINY))
    assert torch.equal(torch.get_rng_state(), state)


def test_fused_attention_is_one_sdpa_call_remat_bitwise_and_names_attn_out_only():
    from jaxremat.spec import parse_plan
    from torchref.policies import SelectiveCheckpoint
    from torchref.render import model_loss

    cfg = TransformerConfig(vocab_size=64, n_layer=4, d_model=32, n_head=2, d_ff=64, max_seq_len=16)
    params = init_params(cfg, seed=0)
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, 64, (2, 17)))
    fused = cfg.replace(attention="fused")
    ref = GPT.from_params(cfg, params).loss(tokens)
    model = GPT.from_params(fused, params)
    assert not any("causal_mask" in n for n, _ in model.named_buffers())  # is_causal=True masks inside the call
    assert torch.allclose(model.loss(tokens), ref, rtol=1e-6, atol=0)
    grads = {}
    for plan in ("none", "every_k(2)", "full+save_dots"):
        m = GPT.from_params(fused, params)
        p = parse_plan(plan)
        model_loss(m, tokens, p.schedule, policy=p.policy).backward()
        grads[plan] = m.to_params(grads=True)
    assert all(np.array_equal(grads[p][k], grads["none"][k]) for p in grads for k in grads[p])
    sac = SelectiveCheckpoint("save_names(attn_out,attn_probs)")
    with pytest.warns(Warning, match="keeps attn_probs, but the block marks no value with that name"):
        model_loss(GPT.from_params(fused, params), tokens, parse_plan("full").schedule, policy=sac)
    assert {r.name for r in sac.records} == {"attn_out"}  # the call's output (and log-sum-exp), kept under its name
