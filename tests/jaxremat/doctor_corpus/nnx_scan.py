"""User-like Flax NNX losses and steps: a stacked block under ``nnx.remat`` + ``nnx.scan`` (the doctor's corpus).

Each function returns ``(fn, args)`` (the module itself among the args; the doctor splits it into its
state); ``EXPECTED`` maps it to the one problem kind the doctor must report (None: no problem).
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

L, B, D, F = 4, 16, 64, 128
cp = jax.checkpoint_policies


class MLPBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, dtype=None):
        self.norm = nnx.LayerNorm(D, rngs=rngs)
        self.up = nnx.Linear(D, F, rngs=rngs, dtype=dtype)
        self.down = nnx.Linear(F, D, rngs=rngs, dtype=dtype)

    def __call__(self, h):
        u = checkpoint_name(self.up(self.norm(h)), "mlp_hidden")
        return h + self.down(nnx.gelu(u)).astype(h.dtype)


def make_stack(dtype=None):
    @nnx.split_rngs(splits=L)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def build(rngs):
        return MLPBlock(rngs, dtype)

    return build(nnx.Rngs(0))


def batch():
    return jax.random.normal(jax.random.key(1), (B, D))


def stack_loss(policy, remat=True):
    def loss(stack, x):
        def layer(block, h):
            return block(h)

        if remat:
            layer = nnx.remat(layer, policy=policy)
        run = nnx.scan(layer, in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        return jnp.mean(run(stack, x) ** 2)

    return loss


def correct():
    return stack_loss(cp.save_only_these_names("mlp_hidden")), (make_stack(), batch())


def correct_bf16():  # bfloat16 compute under remat: the cast weights are recomputed, not stacked
    return stack_loss(None), (make_stack(jnp.bfloat16), batch())


def name_missing():  # the policy names the tag of another model
    return stack_loss(cp.save_only_these_names("mlp_act")), (make_stack(), batch())


def bf16_without_remat():  # bfloat16 compute, no remat: every layer's cast weights saved, stacked
    return stack_loss(None, remat=False), (make_stack(jnp.bfloat16), batch())


def offload_to_device():
    policy = cp.save_and_offload_only_these_names(names_which_can_be_saved=[],
                                                  names_which_can_be_offloaded=["mlp_hidden"],
                                                  offload_src="device", offload_dst="device")
    return stack_loss(policy), (make_stack(), batch())


def train_step():  # an NNX step that updates the model in place: nnx.scan hands a copy of the stack out
    def step(model, x):
        loss, grads = nnx.value_and_grad(stack_loss(cp.save_only_these_names("mlp_hidden")))(model, x)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(model, nnx.Param), grads))
        return loss

    return step, (make_stack(), batch())


EXPECTED = {
    "correct": None, "correct_bf16": None,
    "name_missing": "policy-name-missing", "bf16_without_remat": "stacked-output", "train_step": "stacked-output",
    "offload_to_device": "offload-not-host",
}
