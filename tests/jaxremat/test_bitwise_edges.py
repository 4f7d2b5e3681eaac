"""Bit for bit under ``jit`` where XLA once saw the layer differently per pass (jaxremat.layer_pass).

Three ways a recompute read other values than ``none``'s forward pass, each fixed in the rendering
and pinned here at a tiny shape (docs/framework-differences.md, section 2):

* a stack input closed over by the differentiated function (a constant of the program): XLA folded
  the first layer's LayerNorm statistics at compile time in ``none`` (``nnx.LayerNorm``, N=1, D=12:
  198 ULP); the isolated computations read their operands through ``lax.optimization_barrier``;
* ``jit(vmap(grad))`` over stacked parameters: a batched predicate turned every isolated
  computation into an inline ``select``, and layer 0 saw an unbatched carry in one pass and a
  batched one in another (N=3, D=12: 2,955 ULP); predicates are never batched, carries always;
* bfloat16 compute: XLA's excess precision let ``none``'s forward pass read a matrix product
  unrounded where the recompute read the saved, rounded value (``every_k(2)+save_dots``, N=2, D=48:
  2.1e9 ULP); narrow matrix products and names are read rounded in every pass.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxremat.flax import remat_stack
from jaxremat.layer_pass import LayerProgram
from jaxremat.render import remat_scan
from jaxremat.same_program import SAVEABLE_PRIMITIVES


class LayerNormBlock(nnx.Module):
    def __init__(self, d: int, rngs: nnx.Rngs):
        self.ln = nnx.LayerNorm(d, rngs=rngs)
        self.up, self.down = nnx.Linear(d, 2 * d, rngs=rngs), nnx.Linear(2 * d, d, rngs=rngs)

    def __call__(self, x):
        return x + self.down(nnx.gelu(self.up(self.ln(x))))


def _nnx_grads(plan: str, d: int = 12):
    @nnx.split_rngs(splits=1)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return LayerNormBlock(d, rngs)

    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, d), np.float32))  # closed over: a constant of the program
    grad = nnx.jit(nnx.grad(lambda m: remat_stack(m, x, plan).sum()))
    return [np.asarray(a) for a in jax.tree.leaves(nnx.state(grad(make(nnx.Rngs(0)))))]


def test_closed_over_input_nnx_layer_norm_full_bitwise_with_none(bits):
    got, want = _nnx_grads("full"), _nnx_grads("none")
    assert len(got) == len(want) == 6  # ln scale/bias, up and down kernel/bias
    for a, b in zip(got, want):
        assert bits.equal(a, b), bits.max_ulp(a, b)


def _mlp_block(dtype, rate):
    def block(w, x, key):
        m = x.mean(-1, keepdims=True)
        h = ((x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)).astype(dtype)
        a = jax.nn.gelu(h @ w["up"].astype(dtype))
        if rate:
            a = jnp.where(jax.random.bernoulli(key, 1 - rate, a.shape), a / (1 - rate), 0)
        return x + (a @ w["down"].astype(dtype)).astype(x.dtype) + w["b"]
    return block


def _mlp_inputs(n, d):
    # numpy's normal draws: jax.random.normal compiles its sampler once per shape (~0.5 s each here)
    rng = np.random.default_rng(0)
    ws = {"up": jnp.asarray(rng.standard_normal((n, d, 2 * d), np.float32) / np.sqrt(d, dtype=np.float32)),
          "down": jnp.asarray(rng.standard_normal((n, 2 * d, d), np.float32) / np.sqrt(2 * d, dtype=np.float32)),
          "b": jnp.asarray(rng.standard_normal((n, d), np.float32) * np.float32(0.1))}
    return ws, jnp.asarray(rng.standard_normal((3, d), np.float32)), jax.random.split(jax.random.key(4), n)


def _ensemble_grads(plan: str):
    """``jit(vmap(grad))`` over 3 stacks of N=3, D=12 (the parameters batched): (gradients, optimized HLO)."""
    ws, x, keys = _mlp_inputs(3, 12)
    ws = jax.tree.map(lambda a: jnp.stack([a, a * 0.9, a * 1.1]), ws)
    block = _mlp_block(jnp.float32, 0.0)
    g = jax.grad(lambda w, h: remat_scan(block, w, h, plan, xs=keys).sum(), argnums=(0, 1))
    compiled = jax.jit(jax.vmap(g, in_axes=(0, None))).lower(ws, x).compile()
    return jax.tree.leaves(compiled(ws, x)), compiled.as_text()


def test_vmap_over_stacked_params_bitwise_with_none(bits):
    """``every_k(2)+save_dots`` at N=3: a two-layer segment, then a one-layer one. With a batched predicate
    it was 2,955 ULP off; with unbatched predicates but carries batched as each loop left them, 2,560."""
    (got, text), (want, _) = _ensemble_grads("every_k(2)+save_dots"), _ensemble_grads("none")
    for a, b in zip(got, want):
        assert bits.equal(a, b), bits.max_ulp(a, b)
    # the one-layer segment's forward pass and recompute stay conditionals (an unbatched predicate)
    assert len(re.findall(r"\bconditional\(", text)) >= 2


def test_bf16_dropout_policy_segment_bitwise_with_none(bits):
    ws, x, keys = _mlp_inputs(2, 48)
    block = _mlp_block(jnp.bfloat16, 0.1)

    def grads(plan):
        g = jax.grad(lambda w, h: remat_scan(block, w, h, plan, xs=keys).sum(), argnums=(0, 1))
        return jax.tree.leaves(jax.jit(g)(ws, x))
    for a, b in zip(grads("every_k(2)+save_dots"), grads("none")):
        assert bits.equal(a, b), bits.max_ulp(a, b)


def test_layer_program_reads_narrow_dots_through_a_barrier():
    """Each bfloat16 matrix product of the layer's forward program feeds an optimization barrier;
    in float32 the program has none."""
    ws, x, keys = _mlp_inputs(2, 8)

    def counts(dtype):
        block = _mlp_block(dtype, 0.0)
        prog = LayerProgram(lambda p, c, k, consts: (block(p, c, k), None), ws, keys, [], x)
        names = [e.primitive.name for e in prog.jaxpr.eqns]
        return names.count("dot_general"), names.count("optimization_barrier")
    assert "dot_general" in SAVEABLE_PRIMITIVES
    assert counts(jnp.bfloat16) == (2, 2)
    assert counts(jnp.float32) == (2, 0)
