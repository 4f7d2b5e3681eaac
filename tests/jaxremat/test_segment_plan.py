"""Segment plans in JAX: each segment under its own policy, bitwise with ``none``, keeping what it names.

Measured facts these tests pin down (XLA:CPU, jax 0.10.2), for the GPT at the tiny config (N=5,
D=16, T=8, B=2) and the default one (N=8, D=64, T=64, B=4):

* op by op, both renderings of ``remat_scan`` give the bits of ``none`` for a plan mixing
  ``save_dots``, ``attention_only`` and stored segments, a one-layer segment included;
* under ``jit``, a plan whose policy segments hold >= 2 layers is bitwise at the tiny config;
  a one-layer segment under a policy is bitwise at the default config (and at every width since
  each layer runs as an isolated XLA computation, :mod:`jaxremat.layer_pass`: before, at the tiny
  config it rounded some gradients apart -- ``c_attn.bias``'s key part, zero in exact arithmetic,
  ~1.4e9 ULP; tests/jaxremat/test_bitwise_jit.py checks every plan at every width);
* what a checkpointed segment keeps depends on its own policy only: the kept bytes of a plan add
  up segment by segment, and a uniform plan spelled as segments keeps the bytes of the uniform one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxremat.flax import RematStack, remat_stack
from jaxremat.memory import saved_activation_bytes
from jaxremat.model import block_forward, block_params_of, cross_entropy, embed, head
from jaxremat.render import ScanGroup, plan_groups, remat_scan
from jaxremat.spec import POLICIES, none, parse_plan, parse_schedule

MIXED = parse_schedule("plan(2+save_dots,1+attention_only,2:store)")  # N=5, a one-layer policy segment
WIDE = parse_schedule("plan(2+save_dots,1,2+attention_only)")  # policy segments of 2 layers


def _assert_same(a, b, bits):
    assert bits.equal(a[0], b[0]), ("loss", float(a[0]), float(b[0]))
    bits.assert_tree(a[1], b[1], "grads")


def _loss(cfg, schedule, method, policy=None):
    def loss(p, tokens):
        x = embed(p, tokens[:, :-1], cfg)
        x = remat_scan(lambda lp, c, _: block_forward(lp, c, cfg), block_params_of(p), x, schedule,
                       method=method, policy=policy)
        return cross_entropy(head(p, x, cfg), tokens[:, 1:])
    return loss


def _op_by_op(cfg, params, tokens, schedule, method):
    with jax.disable_jit():
        loss, grads = jax.value_and_grad(_loss(cfg, schedule, method))(params, tokens)
    return np.asarray(loss), {k: np.asarray(v) for k, v in grads.items()}


# ---------------------------------------------------------------- grouping


def test_plan_groups_split_at_policy_changes():
    sd, ao = POLICIES["save_dots"], POLICIES["attention_only"]
    segs = parse_schedule("plan(2*2+save_dots,2+attention_only,1,1)").segments_for(8)
    assert plan_groups(segs) == (ScanGroup(0, 4, 2, 2, True, None, sd), ScanGroup(4, 6, 2, 1, True, None, ao),
                                 ScanGroup(6, 8, 1, 2, True))


# ---------------------------------------------------------------- values: bit for bit


def test_mixed_plan_bitwise_op_by_op_reverse_loop(run, bits):
    _assert_same(run("tiny", MIXED, "eager"), run("tiny", none, "eager"), bits)


def test_mixed_plan_bitwise_op_by_op_checkpoint_method(tiny, run, bits):
    cfg, params, tokens = tiny
    _assert_same(_op_by_op(cfg, params, tokens, MIXED, "checkpoint"), run("tiny", none, "eager"), bits)


def test_plan_with_two_layer_policy_segments_bitwise_jit(run, bits):
    _assert_same(run("tiny", WIDE, "jit"), run("tiny", none, "jit"), bits)


# Two fresh compiles of the N=8, D=64 model: runs with JAXREMAT_SLOW_TESTS=1. By default one-layer segments under a
# policy are bitwise with none under jit in
# tests/jaxremat/test_bitwise_jit.py::test_every_plan_bitwise_with_none_under_jit (its pinned example,
# plan(1+save_dots,1+save_nothing,2:store) at gpt-tiny's width, and one random plan per run).
@pytest.mark.jaxremat_slow
def test_one_layer_policy_segment_bitwise_jit_at_default_config(run, bits):
    plan = parse_schedule("plan(3*2+save_dots,1+attention_only,1:store)")
    _assert_same(run("default", plan, "jit"), run("default", none, "jit"), bits)


# ---------------------------------------------------------------- what is kept


def _stack_bytes(tiny, schedule, policy=None, method="reverse_loop"):
    cfg, params, _ = tiny
    bp, x = block_params_of(params), jnp.ones((2, 8, cfg.d_model))
    fn = lambda bp, x: remat_scan(lambda lp, c, _: block_forward(lp, c, cfg), bp, x, schedule,  # noqa: E731
                                  policy=policy, method=method).sum()
    return saved_activation_bytes(fn, bp, x)


@pytest.mark.parametrize("method", ["reverse_loop", "checkpoint"])
def test_each_segment_keeps_what_its_own_policy_keeps_there(tiny, method):
    """What a segment keeps depends on its own policy only: the kept bytes add up segment by segment."""
    bare = _stack_bytes(tiny, parse_schedule("plan(2,1,2:store)"), method=method)  # boundaries and the stored tail
    dots = _stack_bytes(tiny, parse_schedule("plan(2+save_dots,1,2:store)"), method=method) - bare
    attention = _stack_bytes(tiny, parse_schedule("plan(2,1+attention_only,2:store)"), method=method) - bare
    assert dots > 0 and attention > 0
    assert _stack_bytes(tiny, MIXED, method=method) == bare + dots + attention


@pytest.mark.parametrize("method", ["reverse_loop", "checkpoint"])
@pytest.mark.parametrize("spelled, uniform, policy", [
    ("plan(2*2,1)", "every_k(2)", "save_dots"), ("plan(1*5+attention_only)", "full", None),
])
def test_a_uniform_plan_spelled_as_segments_keeps_the_same_bytes(tiny, method, spelled, uniform, policy):
    uniform_policy = policy or "attention_only"
    assert _stack_bytes(tiny, parse_schedule(spelled), policy=policy, method=method) == \
        _stack_bytes(tiny, parse_schedule(uniform), policy=uniform_policy, method=method)


def test_policy_argument_is_the_default_of_segments_naming_none(tiny):
    plan = parse_schedule("plan(2+save_dots,3)")
    got = _stack_bytes(tiny, plan, policy="mlp_only")
    assert got == _stack_bytes(tiny, parse_schedule("plan(2+save_dots,3+mlp_only)")) != _stack_bytes(tiny, plan)


def test_policy_argument_that_reaches_no_segment_is_refused(tiny):
    cfg, params, _ = tiny
    bp = block_params_of(params)
    fn = lambda lp, c, _: block_forward(lp, c, cfg)  # noqa: E731
    with pytest.raises(ValueError, match="remat_scan: policy 'mlp_only' was given, but every checkpointed segment"):
        remat_scan(fn, bp, jnp.ones((2, 8, 16)), "plan(2+save_dots,3:store)", policy="mlp_only")
    with pytest.raises(ValueError, match="sum to 4 blocks but the stack has n_layer=5"):
        remat_scan(fn, bp, jnp.ones((2, 8, 16)), "plan(2+save_dots,2:store)")
    # save_nothing says nothing: no conflict
    remat_scan(fn, bp, jnp.ones((2, 8, 16)), "plan(2+save_dots,3:store)", policy="save_nothing")


# ---------------------------------------------------------------- Flax NNX


class _MLP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.a, self.b = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 8, rngs=rngs)

    def __call__(self, x):
        return x + self.b(jnp.tanh(self.a(x)))


def _mlp_stack(n=4):
    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return _MLP(rngs=rngs)

    return make(nnx.Rngs(0))


def test_remat_stack_and_rematstack_take_a_segment_plan(bits):
    stack, x = _mlp_stack(), jnp.asarray(np.random.default_rng(1).standard_normal((4, 8), np.float32))

    def grads(schedule, policy=None):
        def loss(s):
            return jnp.sum(remat_stack(s, x, schedule, policy=policy) ** 2)
        return nnx.grad(loss)(stack)

    ref = jax.tree.leaves(grads("none"))
    for schedule, policy in [("plan(2+save_dots_no_batch,1,1:store)", None), ("plan(2+save_dots,2)", "save_dots")]:
        for a, b in zip(jax.tree.leaves(grads(schedule, policy)), ref):
            assert bits.equal(a, b), schedule
    with pytest.raises(ValueError, match="remat_stack: policy 'save_dots' was given, but every checkpointed"):
        grads("plan(2+save_dots_no_batch,2:store)", "save_dots")
    module = RematStack(_mlp_stack(), "plan(2+save_dots_no_batch,2)")
    assert module.schedule == parse_plan("plan(2+save_dots_no_batch,2)").schedule
    assert bits.equal(module(x), remat_stack(_mlp_stack(), x, "none"))
