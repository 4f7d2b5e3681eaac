"""jaxremat.same_program.hoist_constants: values of constants alone leave the layer, read as operands."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxremat.layer_pass import LayerProgram, predicate
from jaxremat.same_program import hoist_constants, run_time

T = 4


def _masked_softmax(s, mask):
    x = jnp.where(mask, s * np.float32(0.144337565), -jnp.inf)
    e = jnp.exp(x - x.max(-1, keepdims=True))
    return e * (1.0 / e.sum(-1, keepdims=True))


def _layer(p, c, x, consts):
    """A layer whose causal mask is computed from constants alone, plus a broadcast of a literal."""
    return _masked_softmax(c * p, jnp.tril(jnp.ones((T, T), bool))) + jnp.zeros(c.shape), None


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.normal(size=(2, 1, 1, 1)) + 2, jnp.float32),
            jnp.asarray(rng.normal(size=(64, 2, T, T)) * 3, jnp.float32))


def test_hoist_constants_moves_the_mask_out_and_leaves_broadcasts_in(inputs):
    _, s = inputs
    f = lambda s: _layer(np.float32(1.0), s, None, [])[0]  # noqa: E731
    jaxpr = jax.make_jaxpr(f)(s).jaxpr
    program, cone = hoist_constants(jaxpr)
    assert [str(v.aval) for v in program.invars] == [f"bool[{T},{T}]", str(jaxpr.invars[0].aval)]
    names = {e.primitive.name for e in program.eqns}
    assert "iota" not in names and "broadcast_in_dim" in names  # the zeros stay a broadcast inside
    (mask,) = jax.core.eval_jaxpr(cone, [])
    np.testing.assert_array_equal(mask, np.tril(np.ones((T, T), bool)))
    (got,) = jax.core.eval_jaxpr(program, [], mask, s)
    assert np.array_equal(np.asarray(got).view(np.int32), np.asarray(f(s)).view(np.int32))
    plain = jax.make_jaxpr(lambda s: s * 2.0)(s).jaxpr
    assert hoist_constants(plain) == (plain, None)
    (same,) = jax.jit(lambda m: run_time([m], True))(mask)
    np.testing.assert_array_equal(same, mask)


def test_layer_program_gives_the_same_bits_in_a_branch_and_in_a_loop(inputs):
    """A checkpointed segment runs a layer as a branch, ``none`` as a one-trip loop that writes its
    residuals: the same bits (XLA hoists the mask out of the loop only; here it is an operand of both)."""
    p, s = inputs

    def run(p, s, in_loop):
        prog = LayerProgram(_layer, p, None, [], s, pred=predicate(p))
        stacks = prog.stacks(2) if in_loop else None
        return prog.forward(p, None, [], 1, s, stacks=stacks, j=0 if in_loop else None)[0]
    branch, loop = (jax.jit(run, static_argnums=2)(p, s, in_loop) for in_loop in (False, True))
    assert np.array_equal(np.asarray(branch).view(np.int32), np.asarray(loop).view(np.int32))
