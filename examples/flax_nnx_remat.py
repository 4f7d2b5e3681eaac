import jax.numpy as jnp, numpy as np
from flax import nnx
from jaxremat.flax import remat_stack

@nnx.split_rngs(splits=16)
@nnx.vmap(in_axes=(0,), out_axes=0)
def make_stack(rngs):  # 16 layers of your own block, with dropout, stacked on a leading axis
    return nnx.Sequential(nnx.Linear(32, 32, rngs=rngs), nnx.gelu, nnx.Dropout(0.1, rngs=rngs))

x = jnp.ones((4, 32))
def grads(plan):  # the same weights and dropout keys for each plan
    loss = lambda m: remat_stack(m, x, plan).sum()
    return np.asarray(nnx.jit(nnx.grad(loss))(make_stack(nnx.Rngs(0)))["layers"][0]["kernel"][...])
print(np.array_equal(grads("none").view(np.uint32), grads("sqrt+save_dots").view(np.uint32)))  # True: same bits, same masks
