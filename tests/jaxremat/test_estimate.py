"""jaxremat.estimate: the compile from shapes alone equals a concrete compile, byte for byte."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxremat
from jaxremat.estimate import PlanEstimate, abstract, compile_plan
from jaxremat.memory import compiled_stats
from jaxremat.model import loss_fn
from jaxremat.models import TransformerConfig, init_params, param_shapes
from jaxremat.spec.plan import parse_plan

GPT_SMALL = TransformerConfig(vocab_size=256, n_layer=8, d_model=64, n_head=4, d_ff=256, max_seq_len=64)
B, T = 4, 64


def gpt_loss(plan, params, tokens):
    return loss_fn(params, tokens, GPT_SMALL, plan.schedule, policy=plan.policy)


@pytest.fixture(scope="module")
def concrete():
    params = {k: jnp.asarray(v) for k, v in init_params(GPT_SMALL, seed=0).items()}
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (B, T + 1)), jnp.int32)
    return params, tokens


def test_estimate_equals_the_concrete_compile_byte_for_byte_at_gpt_small(concrete, plan="every_k(2)"):
    params_abs = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in param_shapes(GPT_SMALL).items()}
    tokens_abs = jax.ShapeDtypeStruct((B, T + 1), jnp.int32)
    (est,) = jaxremat.estimate(gpt_loss, params_abs, tokens_abs, plans=[plan])
    compiled, _ = compile_plan(gpt_loss, parse_plan(plan), concrete)
    real = compiled_stats(compiled)
    assert isinstance(est, PlanEstimate) and est.plan == plan
    assert (est.argument_bytes, est.output_bytes, est.alias_bytes, est.temp_bytes, est.peak_bytes) == (
        real["argument_bytes"], real["output_bytes"], real["alias_bytes"], real["temp_bytes"], real["peak_bytes"])
    param_bytes = sum(int(v.nbytes) for v in concrete[0].values())
    assert est.argument_bytes == param_bytes + B * (T + 1) * 4  # parameters and int32 tokens
    # gradients, the float32 loss and XLA's output tuple (one 8-byte pointer per output)
    assert est.output_bytes == param_bytes + 4 + 8 * (len(concrete[0]) + 1)
    assert est.temp_bytes > 0 and est.compile_time_s > 0 and "cpu" in est.backend
    # the reason: the program lowered from shapes is the one lowered from arrays
    step = jax.jit(jax.value_and_grad(lambda p, t: gpt_loss(parse_plan(plan), p, t)))
    assert step.lower(params_abs, tokens_abs).as_text() == step.lower(*concrete).as_text()


def test_estimate_refuses_bad_plans_before_compiling():
    calls = []

    def loss(plan, x):
        calls.append(plan)
        return jnp.sum(x)

    x = jax.ShapeDtypeStruct((2,), jnp.float32)
    with pytest.raises(ValueError, match="unknown"):
        jaxremat.estimate(loss, x, plans=["none", "every_kk(2)"])
    with pytest.raises(ValueError, match="non-empty list"):
        jaxremat.estimate(loss, x, plans="none")
    assert calls == []


def test_abstract_keeps_shapes_and_dtypes_only():
    tree = {"a": np.zeros((2, 3), np.float32), "b": jax.ShapeDtypeStruct((4,), jnp.int32)}
    out = abstract(tree)
    assert out["a"] == jax.ShapeDtypeStruct((2, 3), jnp.float32) and out["b"] is tree["b"]


def test_jaxremat_estimate_is_callable_and_holds_its_names():
    import jaxremat.estimate as module

    assert jaxremat.estimate is module and callable(module) and module.PlanEstimate is PlanEstimate
    assert "estimate" in jaxremat.__all__ and "PlanEstimate" in jaxremat.__all__
