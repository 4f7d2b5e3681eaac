"""jaxremat.encoder: the BERT-style encoder under every schedule, its mask, tags and reverse loop."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxremat import encoder
from jaxremat.encoder_reverse_loop import reverse_loop_value_and_grad
from jaxremat.spec import every_k, full, none, segments, sqrt
from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.names import ACTIVATION_NAMES
from jaxremat.tags import sub_jaxprs, tag_name
from parity.checks.compare import compare_bitwise

CFG = TransformerConfig(arch="bert", vocab_size=64, n_layer=4, d_model=16, n_head=2, d_ff=32, max_seq_len=8,
                        layer_norm_eps=1e-12)
# Under jit, segments of >= 2 layers keep the no-remat loop structure and are bitwise; one-layer
# segments at tiny shapes are the known trip-count-1 case (docs/framework-differences.md), so they
# are checked op by op (which is slow: a few eager cases only).
JIT_SCHEDULES = [every_k(2), sqrt, segments(2)]
JIT_IDS = [s.name for s in JIT_SCHEDULES]


def _tokens(cfg=CFG, T=8):
    """Two pairs (4 rows), with padding (id 0) at the end of rows 1 and 3."""
    ids = np.random.default_rng(0).integers(1, cfg.vocab_size, (4, T))
    ids[1, 5:] = 0
    ids[3, 3:] = 0
    return jnp.asarray(ids, jnp.int32)


def _params(cfg=CFG):
    return {k: jnp.asarray(v) for k, v in init_params(cfg, seed=1).items()}


@functools.lru_cache(maxsize=None)
def _eager(schedule, dropout=0.0):
    cfg = CFG.replace(dropout=dropout)
    key = jax.random.key(3) if dropout else None
    with jax.disable_jit():
        loss, grads = jax.value_and_grad(encoder.loss_fn)(_params(cfg), _tokens(), cfg, schedule, key)
    return {"loss": np.asarray(loss), **{k: np.asarray(v) for k, v in grads.items()}}


@functools.lru_cache(maxsize=None)
def _jit(schedule, dropout=0.0):
    cfg = CFG.replace(dropout=dropout)
    key = jax.random.key(3) if dropout else None
    f = jax.jit(jax.value_and_grad(lambda p, t, k: encoder.loss_fn(p, t, cfg, schedule, k)))
    loss, grads = f(_params(cfg), _tokens(), key)
    return {"loss": np.asarray(loss), **{k: np.asarray(v) for k, v in grads.items()}}


def _assert_bitwise(a, b):
    res = compare_bitwise(a, b)
    assert res.equal, f"not bitwise: {res.mismatched} (max ULP {res.max_ulp}, max abs {res.max_abs_diff:.3e})"


# Each combination is two fresh compiles of the encoder step, so all run with JAXREMAT_SLOW_TESTS=1. By default
# every_k(2) with dropout 0.1 under jit is bitwise with none in
# tests/parity/test_finetune.py::test_jax_runner_on_the_encoder_is_bitwise_under_jit (gradients and trained
# weights, same encoder shape), and a remat schedule under jit with a policy in
# test_encoder_policy_saves_the_named_activation_only below.
JIT_CASES = [pytest.param(s, d, id=f"{i}-{d}", marks=pytest.mark.jaxremat_slow)
             for s, i in zip(JIT_SCHEDULES, JIT_IDS) for d in (0.0, 0.1)]


@pytest.mark.parametrize("schedule, dropout", JIT_CASES)
def test_encoder_schedule_bitwise_equal_to_none_jit(schedule, dropout):
    _assert_bitwise(_jit(schedule, dropout), _jit(none, dropout))


# Op by op a 3-layer encoder step costs ~30 s here; dropout under remat is checked by default under jit.
@pytest.mark.parametrize("schedule", [pytest.param(full, marks=pytest.mark.jaxremat_slow),
                                      pytest.param(every_k(3), marks=pytest.mark.jaxremat_slow)],
                         ids=["full", "every_k(3)"])
def test_encoder_one_layer_segments_bitwise_eager_with_dropout(schedule):
    _assert_bitwise(_eager(schedule, 0.1), _eager(none, 0.1))


def test_encoder_dropout_changes_the_loss():
    # op by op, on the primitives test_encoder_reverse_loop_bitwise_eager compiles for its step with dropout
    with jax.disable_jit():
        plain = encoder.loss_fn(_params(), _tokens(), CFG, every_k(3))
    assert not np.array_equal(_eager(every_k(3), 0.1)["loss"], np.asarray(plain))


@pytest.mark.parametrize("schedule", [every_k(3)], ids=["every_k(3)"])
def test_encoder_reverse_loop_bitwise_eager(schedule):
    key = jax.random.key(3)
    cfg = CFG.replace(dropout=0.1)
    with jax.disable_jit():
        loss, grads = reverse_loop_value_and_grad(_params(cfg), _tokens(), cfg, schedule, key)
    _assert_bitwise({"loss": np.asarray(loss), **{k: np.asarray(v) for k, v in grads.items()}}, _eager(schedule, 0.1))


def test_encoder_padding_is_masked():
    """Real tokens' hidden states do not depend on how much padding follows, nor on the pad ids' content."""
    params = _params()
    short = _tokens(T=6)
    long = jnp.concatenate([short, jnp.zeros((4, 2), jnp.int32)], axis=1)
    h_short = np.asarray(encoder.encode(params, short, CFG))
    h_long = np.asarray(encoder.encode(params, long, CFG))
    real = np.asarray(short != 0)
    np.testing.assert_allclose(h_long[:, :6][real], h_short[real], rtol=1e-5, atol=1e-6)
    # an explicit mask hiding the same positions gives the same bits as the pad-derived mask
    h_mask = np.asarray(encoder.encode(params, long, CFG, attention_mask=long != 0))
    assert np.array_equal(h_mask, h_long)
    # without the mask the padded keys leak into real tokens
    h_nomask = np.asarray(encoder.encode(params, long, CFG, attention_mask=jnp.ones_like(long)))
    assert not np.allclose(h_nomask[:, :6][real], h_short[real], rtol=1e-3)


def test_encoder_tags_every_activation_name():
    jaxpr = jax.make_jaxpr(lambda p: encoder.loss_fn(p, _tokens(), CFG, none))(_params())
    names = set()

    def walk(jx):  # read with jaxremat.tags, so either value of jax_remat3 is read
        for eqn in jx.eqns:
            if tag_name(eqn) is not None:
                names.add(tag_name(eqn))
            for sub in sub_jaxprs(eqn):
                walk(sub)

    walk(jaxpr.jaxpr)
    assert names == set(ACTIVATION_NAMES)


def test_encoder_policy_saves_the_named_activation_only():
    from jaxremat.memory import saved_residuals

    params, tokens = _params(), _tokens()
    policy = jax.checkpoint_policies.save_only_these_names("qkv_proj")
    sched = every_k(2)
    nothing = saved_residuals(lambda p: encoder.loss_fn(p, tokens, CFG, sched), params)
    saving = saved_residuals(lambda p: encoder.loss_fn(p, tokens, CFG, sched, policy=policy), params)
    activations = lambda records: sorted(r.shape for r in records if not r.is_argument)  # noqa: E731
    added = [s for s in activations(saving) if s not in activations(nothing)]
    assert added == [(2, 2, 4, 8, 3 * CFG.d_model)]  # (segments, layers, B, T, 3D): qkv_proj only
    assert [s for s in activations(nothing) if s not in activations(saving)] == []
    f = jax.jit(jax.value_and_grad(lambda p, t: encoder.loss_fn(p, t, CFG, sched, policy=policy)))
    loss, g = f(params, tokens)
    _assert_bitwise({"loss": np.asarray(loss), **{k: np.asarray(v) for k, v in g.items()}}, _jit(none))


def test_encoder_bad_inputs():
    with pytest.raises(ValueError, match="arch='bert'"):
        encoder.encode(_params(), _tokens(), CFG.replace(arch="gpt"))
    with pytest.raises(ValueError, match="even"):
        encoder.loss_fn(_params(), _tokens()[:3], CFG)
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        encoder.loss_fn(_params(), _tokens().at[0, 0].set(64), CFG)
    with pytest.raises(ValueError, match="max_seq_len"):
        encoder.encode(_params(), jnp.ones((2, 9), jnp.int32), CFG)
