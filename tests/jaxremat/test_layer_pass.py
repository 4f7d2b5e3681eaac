"""jaxremat.layer_pass.isolate with buffers: a one-trip loop that XLA keeps and updates in place."""

import re

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxremat.layer_pass import isolate, runs_once

N, D = 6, 32


def _write_rows(w, x):
    """Layer i writes ``tanh(x @ w[i])`` into row i of a stack, each layer isolated with the stack as a buffer."""
    def step(carry, i):
        x, stack = carry

        def layer(op, stack):
            w, x, i = op
            y = jnp.tanh(x @ w[i])
            return y, lax.dynamic_update_index_in_dim(stack, y, i, 0)
        x, stack = isolate(layer, (w, x, i), w[0, 0, 0], stack)
        return (x, stack), None
    (x, stack), _ = lax.scan(step, (x, jnp.zeros((N,) + x.shape, x.dtype)), jnp.arange(N))
    return x, stack


def _equations(jaxpr):
    """Every equation of ``jaxpr`` and of the programs inside it."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _equations(getattr(sub, "jaxpr", sub))


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.normal(size=(N, D, D)), jnp.float32) / 8,
            jnp.asarray(rng.normal(size=(4, D)), jnp.float32))


def test_isolate_with_buffers_keeps_the_loop_and_copies_no_stack(inputs):
    w, x = inputs
    text = jax.jit(_write_rows).lower(w, x).compile().as_text()
    assert len(re.findall(r"\bwhile\(", text)) == 2  # the scan and the layer's one-trip loop
    assert not re.search(rf"f32\[{N},4,{D}\]\S* copy\(", text)  # the stack is updated in place
    got_x, got_stack = jax.jit(_write_rows)(w, x)
    with jax.disable_jit():
        want_x, want_stack = _write_rows(w, x)
    np.testing.assert_allclose(got_stack, want_stack, rtol=1e-6)
    np.testing.assert_allclose(got_x, got_stack[-1], rtol=0)


def test_isolate_with_buffers_is_differentiable_and_marked_as_running_once(inputs):
    w, x = inputs
    loss = lambda w: jnp.sum(_write_rows(w, x)[1] ** 2)  # noqa: E731
    grad = jax.jit(jax.grad(loss))(w)
    with jax.disable_jit():
        want = jax.grad(loss)(w)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)  # jit against op by op: rounding only
    loops = [e for e in _equations(jax.make_jaxpr(_write_rows)(w, x).jaxpr) if e.primitive.name == "while"]
    assert len(loops) == 1 and runs_once(loops[0])
    user_loop = jax.make_jaxpr(lambda x: lax.while_loop(lambda c: c[1] < 2, lambda c: (c[0] * 2, c[1] + 1),
                                                        (x, 0)))(x).jaxpr.eqns[0]
    assert user_loop.primitive.name == "while" and not runs_once(user_loop)
