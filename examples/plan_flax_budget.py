import jax.numpy as jnp
from flax import nnx
from jaxremat.flax import plan_stack
@nnx.split_rngs(splits=16)
@nnx.vmap(in_axes=(0,), out_axes=0)
def make_stack(rngs):  # your own layer: 16 of them, stacked on a leading axis
    return nnx.Sequential(nnx.Linear(64, 256, rngs=rngs), nnx.gelu, nnx.Linear(256, 64, rngs=rngs))

fit = plan_stack(make_stack(nnx.Rngs(0)), jnp.ones((32, 64)), budget="50%")
print(fit.plan.name, fit.peak_bytes <= fit.budget_bytes, fit.grads_bitwise_equal)
