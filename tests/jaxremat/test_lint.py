"""jaxremat.lint: a policy that will keep nothing it names warns (RematPolicyWarning) before the
stack runs -- untagged blocks, dots that all have batch dimensions under jax.vmap, a policy on
``none`` -- and every warning says what the saved residuals show (the same as ``save_nothing``)."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxremat.flax import linen_init_stack, linen_remat_stack, remat_stack
from jaxremat.lint import RematPolicyWarning, check_plan
from jaxremat.memory import saved_residuals
from jaxremat.model import block_forward, block_params_of
from jaxremat.render import remat_scan
from jaxremat.spec import full, none
from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.policies import POLICIES

N, B, D = 4, 3, 8
WS = X = None  # the stacked weights and the input, set when the module's first test runs (stack_inputs)


@pytest.fixture(scope="module", autouse=True)
def _module_arrays(stack_inputs):
    global WS, X
    WS, X = stack_inputs(N, D, B)


def untagged(w, x, _):
    return x + jnp.tanh(x @ w)


def tagged(w, x, _):
    return x + jnp.tanh(checkpoint_name(x @ w, "mlp_hidden"))


def _saved_bytes(fn, *args) -> int:
    return sum(r.bytes for r in saved_residuals(fn, *args) if not r.is_argument)


def _quiet(fn):
    """``fn()`` with RematPolicyWarning raised as an error (the case must not warn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematPolicyWarning)
        return fn()


@pytest.mark.parametrize("policy", ["save_qkv_proj", "attention_only", "save_names(mlp_hidden)", "qkv_proj_offloaded"])
def test_name_policy_on_untagged_block_warns_and_keeps_what_save_nothing_keeps(policy):
    with pytest.warns(RematPolicyWarning, match=r"marks no value with th.*keeps nothing.*checkpoint_name"):
        check_plan(untagged, WS, X, full, policy=policy)
    loss = lambda p: lambda ws: remat_scan(untagged, ws, X, full, policy=p).sum()
    assert _saved_bytes(loss(policy), WS) == _saved_bytes(loss(None), WS)


def test_tagged_block_keeps_its_name_and_does_not_warn():
    assert _quiet(lambda: check_plan(tagged, WS, X, full, policy="save_names(mlp_hidden)")) == []
    loss = lambda p: lambda ws: remat_scan(tagged, ws, X, full, policy=p).sum()
    assert _saved_bytes(loss("save_names(mlp_hidden)"), WS) > _saved_bytes(loss(None), WS)


def test_partly_tagged_block_names_the_missing_names():
    with pytest.warns(RematPolicyWarning, match=r"keeps mlp_act, mlp_norm, but .*those names keep nothing"):
        check_plan(tagged, WS, X, full, policy="attention_only")


def _ensemble_grad(policy, per_example: bool = False, method: str = "checkpoint"):
    """grad of a loss that vmaps the stack over an ensemble of 2 (or over examples)."""
    def loss(ws):
        run = lambda w, x: remat_scan(untagged, w, x, full, policy=policy, method=method).sum()  # noqa: E731
        if per_example:
            return jax.vmap(lambda xi: run(ws, xi))(X).sum()
        return jax.vmap(lambda w: run(w, X))(jnp.stack([ws, ws])).sum()
    return loss


def _linted_ensemble(policy, per_example=False, method: str = "checkpoint"):
    """The messages check_plan gives at the point where the stack runs, inside the vmap and the grad."""
    out = []

    def loss(ws):
        def one(w, x):
            out.append(check_plan(untagged, w, x, full, policy=policy, method=method))
            return remat_scan(untagged, w, x, full, policy=policy, method=method).sum()
        if per_example:
            return jax.vmap(lambda xi: one(ws, xi))(X).sum()
        return jax.vmap(lambda w: one(w, X))(jnp.stack([ws, ws])).sum()

    jax.grad(loss)(WS)
    return out[0]


@pytest.mark.parametrize("policy", ["minimal", "save_dots_no_batch", jax.checkpoint_policies.dots_with_no_batch_dims_saveable])
def test_no_batch_dots_policy_under_an_ensemble_vmap_warns_and_keeps_nothing(policy):
    with pytest.warns(RematPolicyWarning, match=r"matrix products has batch dimensions \(a jax.vmap"):
        assert _linted_ensemble(policy)
    assert _saved_bytes(_ensemble_grad(policy), WS) == _saved_bytes(_ensemble_grad(None), WS)
    # the same policy without the vmap keeps the product
    single = lambda p: lambda ws: remat_scan(untagged, ws, X, full, policy=p).sum()
    assert _saved_bytes(single(policy), WS) > _saved_bytes(single(None), WS)


def test_reverse_loop_policy_sees_the_unbatched_layer_under_vmap():
    """The default rendering differentiates inside a custom_vjp traced unbatched: the policy keeps its product."""
    policy = "save_dots_no_batch"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematPolicyWarning)
        assert _linted_ensemble(policy, method="reverse_loop") == []
    kept = _saved_bytes(_ensemble_grad(policy, method="reverse_loop"), WS)
    assert kept > _saved_bytes(_ensemble_grad(None, method="reverse_loop"), WS)


def test_per_example_vmap_and_vmap_of_grad_keep_the_products_and_do_not_warn():
    assert _quiet(lambda: _linted_ensemble("minimal", per_example=True)) == []
    assert _saved_bytes(_ensemble_grad("minimal", True), WS) > _saved_bytes(_ensemble_grad(None, True), WS)
    out = []
    grad = jax.grad(lambda w: (out.append(check_plan(untagged, w, X, full, policy="minimal")),
                               remat_scan(untagged, w, X, full, policy="minimal").sum())[1])
    _quiet(lambda: jax.vmap(grad)(jnp.stack([WS, WS])))  # the vmap outside the grad: the policy sees no batch
    assert out == [[]]


def test_save_dots_under_an_ensemble_vmap_does_not_warn():
    assert _quiet(lambda: _linted_ensemble("save_dots")) == []
    assert _saved_bytes(_ensemble_grad("save_dots"), WS) > _saved_bytes(_ensemble_grad(None), WS)


def test_dots_policy_on_a_block_without_products_warns():
    with pytest.warns(RematPolicyWarning, match="the block has no matrix product"):
        check_plan(lambda w, x, _: x + jnp.tanh(x * w[0]), WS, X, full, policy="save_dots")


@pytest.mark.parametrize("schedule", ["none", "segments(1)", "none+save_dots"])
def test_policy_on_a_schedule_that_checkpoints_nothing_warns_in_remat_stack(schedule):
    @nnx.split_rngs(splits=N)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return nnx.Linear(D, D, rngs=rngs)

    with pytest.raises(ValueError) if schedule == "none+save_dots" else pytest.warns(
            RematPolicyWarning, match=r"remat_stack: policy 'save_dots' has no effect"):
        remat_stack(make(nnx.Rngs(0)), X, schedule, policy="save_dots")


class Dense(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + jnp.tanh(nn.Dense(D)(x))


def test_linen_remat_stack_warns_for_untagged_names():
    variables = linen_init_stack(Dense(), jax.random.key(0), X, N)
    with pytest.warns(RematPolicyWarning, match=r"linen_remat_stack: policy 'save_qkv_proj' keeps qkv_proj"):
        linen_remat_stack(Dense(), variables, X, "full+save_qkv_proj")
    _quiet(lambda: linen_remat_stack(Dense(), variables, X, "full", policy="save_dots"))


def test_unknown_names_are_errors_in_the_library_api():
    variables = linen_init_stack(Dense(), jax.random.key(0), X, N)
    with pytest.raises(ValueError, match=r"unknown activation name\(s\) 'qkv'"):
        linen_remat_stack(Dense(), variables, X, "full", policy="save_names(qkv)")


@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"save_nothing"}))
def test_model_block_never_warns(policy):
    cfg = TransformerConfig(vocab_size=32, n_layer=2, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
    params = {k: jnp.asarray(v) for k, v in init_params(cfg, seed=0).items()}
    x = jnp.ones((2, 8, 16))
    fn = lambda p, c, _: block_forward(p, c, cfg)
    assert _quiet(lambda: check_plan(fn, block_params_of(params), x, full, policy=policy)) == []


def test_no_effect_warning_for_none_comes_from_the_neutral_check():
    with pytest.warns(RematPolicyWarning, match="schedule none checkpoints no segment at n_layer=4"):
        assert check_plan(untagged, WS, X, none, policy="save_dots")
