"""A stack whose variables have no layer axis (one block handed to remat_stack / linen_remat_stack)
is one clear error, whether its layers are square (which ran silently as rows of one kernel) or
not (which failed with a broadcasting error); stacked stacks, square or not, still run."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxremat.flax import linen_init_stack, linen_remat_stack, remat_stack

D = 8
UNSTACKED = r"not stacked on one leading layer axis \(it is one block\).*"


class LinearBlock(nnx.Module):
    def __init__(self, d_in, d_out, *, rngs):
        self.lin = nnx.Linear(d_in, d_out, rngs=rngs)
        self.back = nnx.Linear(d_out, d_in, rngs=rngs) if d_out != d_in else None

    def __call__(self, x):
        h = nnx.gelu(self.lin(x))
        return x + (self.back(h) if self.back is not None else h)


class ParamBlock(nnx.Module):
    """Raw parameters, no Flax layer: ``x + tanh(x @ w + b)``."""

    def __init__(self, *, rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (D, D)) * 0.1)
        self.b = nnx.Param(jnp.zeros(D))

    def __call__(self, x):
        return x + jnp.tanh(x @ self.w + self.b)


class NormBlock(nnx.Module):
    def __init__(self, *, rngs):
        self.ln = nnx.LayerNorm(D, rngs=rngs)

    def __call__(self, x):
        return x + self.ln(x)


def stacked(make, n):
    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def build(rngs):
        return make(rngs)

    return build(nnx.Rngs(0))


@pytest.mark.parametrize("batch,make", [
    (D, lambda r: LinearBlock(D, D, rngs=r)),          # square layers, batch == D: ran silently before
    (3, lambda r: LinearBlock(D, D, rngs=r)),          # square layers: broadcasting error before
    (3, lambda r: LinearBlock(D, 2 * D, rngs=r)),      # rectangular: "leading sizes differ" before
    (3, lambda r: NormBlock(rngs=r)),                  # one LayerNorm
    (3, lambda r: ParamBlock(rngs=r)),                 # raw parameters: the layer fails on its slice
], ids=["square-silent", "square", "rectangular", "layernorm", "raw-params"])
def test_unstacked_nnx_block_is_one_clear_error(batch, make):
    with pytest.raises(ValueError, match=UNSTACKED + "nnx.vmap over the block constructor"):
        remat_stack(make(nnx.Rngs(0)), jnp.ones((batch, D)), "full")


@pytest.mark.parametrize("n,make", [(D, lambda r: LinearBlock(D, D, rngs=r)), (3, lambda r: ParamBlock(rngs=r)),
                                    (D, lambda r: NormBlock(rngs=r))], ids=["square-N=D", "raw-params", "layernorm"])
def test_stacked_stacks_still_run_and_equal_a_loop(n, make):
    """Op by op (a scan runs its body as a loop then), layer i reads slice i: the same bits as a loop."""
    stack, x = stacked(make, n), jnp.asarray(np.random.default_rng(1).standard_normal((D, D), np.float32))
    graphdef, state = nnx.split(stack)
    with jax.disable_jit():
        y = remat_stack(stack, x, "full")
        ref = x
        for i in range(n):
            ref = nnx.merge(graphdef, jax.tree.map(lambda a: a[i], state))(ref)
    assert np.array_equal(np.asarray(y).view(np.uint32), np.asarray(ref).view(np.uint32))


class Dense(nn.Module):
    features: int = D

    @nn.compact
    def __call__(self, x):
        return x + jnp.tanh(nn.Dense(self.features)(x))


@pytest.mark.parametrize("batch", [D, 3])
def test_unstacked_linen_variables_are_one_clear_error(batch):
    x = jnp.ones((batch, D))
    variables = Dense().init(jax.random.key(0), x)  # one layer: kernel (D, D), bias (D,)
    with pytest.raises(ValueError, match=UNSTACKED + r"shape block.init gives one layer.*linen_init_stack"):
        linen_remat_stack(Dense(), variables, x, "full")


def test_stacked_linen_variables_with_n_equal_d_still_run():
    x = jnp.ones((3, D))
    variables = linen_init_stack(Dense(), jax.random.key(0), x, D)  # kernel (D, D, D)
    assert linen_remat_stack(Dense(), variables, x, "full").shape == x.shape


class CountingScale(nnx.Module):
    """``x * scale``, counting its calls in a variable: it writes state, which a stack refuses."""

    def __init__(self, *, rngs):
        self.scale = nnx.Param(jnp.ones(D))
        self.calls = nnx.BatchStat(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        self.calls[...] += 1
        return x * self.scale


def test_stacked_block_that_writes_state_is_not_called_unstacked():
    """A stacked block whose whole stack also runs as one block (x of shape (N, D) broadcasts with
    the stacked scale (N, D)) and whose layer writes a variable: the error is the write, as it is."""
    n = 4
    with pytest.raises(ValueError, match=r"wrote variables during its call: \['calls'\]") as info:
        remat_stack(stacked(lambda r: CountingScale(rngs=r), n), jnp.ones((n, D)), "full")
    assert "not stacked" not in str(info.value)
