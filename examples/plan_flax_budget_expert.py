import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jaxremat.flax import remat_stack
from jaxremat.memory import saved_activation_bytes
from jaxremat.planner import block_options
from jaxremat.spec.planner import chain_costs, plan_for_budget

class Block(nnx.Module):  # your block: (B, D) -> (B, D)
    def __init__(self, rngs: nnx.Rngs):
        self.up, self.down = nnx.Linear(64, 256, rngs=rngs), nnx.Linear(256, 64, rngs=rngs)
    def __call__(self, x):
        return x + self.down(nnx.gelu(self.up(x)))

@nnx.split_rngs(splits=16)  # 16 layers stacked on a leading axis
@nnx.vmap(in_axes=(0,), out_axes=0)
def make_stack(rngs):
    return Block(rngs)

stack, x = make_stack(nnx.Rngs(0)), jnp.ones((32, 64))
graphdef, state = nnx.split(stack)
one_layer = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), state)
menu = block_options(lambda s, h: nnx.merge(graphdef, s)(h), one_layer, x, ["save_nothing", "save_dots"])
boundary = x.size * x.dtype.itemsize  # what a checkpointed segment keeps: its input
stored_peak = chain_costs([menu] * 16, [(16, "store")], boundary)[0]
r = plan_for_budget([menu] * 16, stored_peak // 2, boundary)  # half of what storing everything needs
print(r.plan.name, r.peak_bytes <= stored_peak // 2)

loss = lambda m, plan: remat_stack(m, x, plan).sum()
saved = saved_activation_bytes(lambda s: loss(nnx.merge(graphdef, s), r.plan), state)
print(saved == r.saved_bytes)  # True: the plan keeps the bytes the planner predicted
g = {p: nnx.jit(nnx.grad(loss), static_argnums=1)(stack, p)["up"]["kernel"][...] for p in ("none", r.plan)}
print(np.array_equal(np.asarray(g["none"]).view(np.uint32), np.asarray(g[r.plan]).view(np.uint32)))  # True
