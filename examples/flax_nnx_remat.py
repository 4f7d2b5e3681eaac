import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jaxremat.flax import remat_stack

class Block(nnx.Module):  # your block: (B, D) -> (B, D), with dropout
    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(32, 32, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
    def __call__(self, x):
        return x + self.drop(nnx.gelu(self.lin(x)))

@nnx.split_rngs(splits=16)  # 16 layers: every variable gets a leading layer axis
@nnx.vmap(in_axes=(0,), out_axes=0)
def make_stack(rngs):
    return Block(rngs)

x = jnp.ones((4, 32))
def grads(schedule, policy=None):
    stack = make_stack(nnx.Rngs(0))  # same weights and dropout keys for each schedule
    loss = lambda m: remat_stack(m, x, schedule, policy=policy).sum()
    return nnx.jit(nnx.grad(loss))(stack)["lin"]["kernel"][...]

g_none = np.asarray(grads("none"))
g_sqrt = np.asarray(grads("sqrt", policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable))
print(np.array_equal(g_none.view(np.uint32), g_sqrt.view(np.uint32)))  # True: same bits, same masks
