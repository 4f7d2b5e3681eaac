import jax, jax.numpy as jnp, jaxremat
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
class Block(nnx.Module):  # your block: it tags its hidden activation "mlp_hidden"
    def __init__(self, rngs):
        self.up, self.down = nnx.Linear(64, 256, rngs=rngs), nnx.Linear(256, 64, rngs=rngs)
    def __call__(self, h):
        return h + self.down(nnx.gelu(checkpoint_name(self.up(h), "mlp_hidden")))
stack = nnx.eval_shape(lambda: nnx.vmap(Block)(nnx.Rngs(0).split(12)))  # 12 layers, shapes only
policy = jax.checkpoint_policies.save_only_these_names("mlp_in")  # the mistake: nothing is tagged "mlp_in"
layer = nnx.remat(lambda block, h: block(h), policy=policy)
loss = lambda stack, x: nnx.scan(layer, in_axes=(0, nnx.Carry), out_axes=nnx.Carry)(stack, x).mean()
print(*jaxremat.doctor(loss, stack, jax.ShapeDtypeStruct((32, 64), jnp.float32)).problems, sep="\n")
