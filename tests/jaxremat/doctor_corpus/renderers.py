"""User-like losses and steps on jaxremat's own renderers, ``remat_scan`` and ``remat_stack`` (the doctor's corpus).

Each function returns ``(fn, args)``; ``EXPECTED`` maps it to the one problem kind the doctor must
report (None: no problem).
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

import jaxremat

L, B, D = 4, 16, 64


def params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"w_in": jax.random.normal(k1, (L, D, D)) / D ** 0.5, "w_out": jax.random.normal(k2, (L, D, D)) / D ** 0.5}


def batch():
    return jax.random.normal(jax.random.key(1), (B, D))


def block(p, h, _):
    u = checkpoint_name(h @ p["w_in"], "mlp_hidden")
    return h + jnp.tanh(u) @ p["w_out"]


def scan_loss(schedule, **kw):
    def loss(p, x):
        return jnp.mean(jaxremat.remat_scan(block, p, x, schedule, **kw) ** 2)

    return loss, (params(), batch())


def correct():
    return scan_loss("every_k(2)", policy="save_dots")


def correct_checkpoint_method():
    return scan_loss("full", policy="save_names(mlp_hidden)", method="checkpoint")


def one_segment_loop():  # segments(2) at N=4: two segments of 2, each a checkpointed loop of trip count 1
    return scan_loss("segments(2)", method="checkpoint")


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.up = nnx.Linear(D, 2 * D, rngs=rngs)
        self.down = nnx.Linear(2 * D, D, rngs=rngs)

    def __call__(self, h):
        return h + self.down(nnx.relu(checkpoint_name(self.up(h), "mlp_hidden")))


@nnx.split_rngs(splits=L)
@nnx.vmap(in_axes=(0,), out_axes=0)
def make_stack(rngs):
    return Block(rngs)


def stack_loss(policy):
    def loss(stack, x):
        return jnp.mean(jaxremat.remat_stack(stack, x, "sqrt", policy=policy) ** 2)

    return loss, (make_stack(nnx.Rngs(0)), batch())


def correct_stack():
    return stack_loss("save_names(mlp_hidden)")


def stack_name_missing():  # a GPT policy name on a block that tags no qkv_proj
    return stack_loss("save_qkv_proj")


def correct_train_step():  # an NNX step over remat_stack: the parameters are not handed out of the loop
    loss, (stack, x) = stack_loss("save_names(mlp_hidden)")

    def step(model, x):
        value, grads = nnx.value_and_grad(loss)(model, x)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(model, nnx.Param), grads))
        return value

    return step, (stack, x)


EXPECTED = {
    "correct": None, "correct_checkpoint_method": None, "correct_stack": None, "correct_train_step": None,
    "one_segment_loop": "remat-not-surviving", "stack_name_missing": "policy-name-missing",
}
