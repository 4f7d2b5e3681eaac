"""User-like Flax Linen losses: a block stack under ``nn.remat_scan`` (the doctor's corpus).

Each function returns ``(fn, args)``: the loss of the variables and a batch; ``EXPECTED`` maps it to
the one problem kind the doctor must report (None: no problem).
"""

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

B, D, F = 16, 64, 128
cp = jax.checkpoint_policies


class Block(nn.Module):
    @nn.compact
    def __call__(self, h):
        u = checkpoint_name(nn.Dense(F, name="up")(nn.LayerNorm()(h)), "mlp_hidden")
        return h + nn.Dense(D, name="down")(nn.gelu(u))


class Stack(nn.Module):
    lengths: tuple = (2, 2)  # 2 checkpointed segments of 2 layers each
    policy: object = None

    @nn.compact
    def __call__(self, h):
        return nn.remat_scan(Block, lengths=self.lengths, policy=self.policy)()(h)


class Ensemble(nn.Module):  # two stacks side by side, vmapped over their parameters
    policy: object = None

    @nn.compact
    def __call__(self, h):
        members = nn.vmap(Stack, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None,
                          axis_size=2)
        return members(policy=self.policy)(h).mean(0)


def batch():
    return jax.random.normal(jax.random.key(1), (B, D))


def loss_of(model):  # the variables' shapes only (jax.eval_shape): the doctor allocates nothing
    variables = jax.eval_shape(model.init, jax.random.key(0), batch())

    def loss(variables, x):
        return jnp.mean(model.apply(variables, x) ** 2)

    return loss, (variables, batch())


def correct():
    return loss_of(Stack(policy=cp.save_only_these_names("mlp_hidden")))


def correct_ensemble():  # under the vmap, dots_saveable keeps the batched products
    return loss_of(Ensemble(policy=cp.dots_saveable))


def name_missing():
    return loss_of(Stack(policy=cp.save_only_these_names("hidden")))


def dropped_under_vmap():
    return loss_of(Ensemble(policy=cp.dots_with_no_batch_dims_saveable))


EXPECTED = {
    "correct": None, "correct_ensemble": None,
    "name_missing": "policy-name-missing", "dropped_under_vmap": "policy-dropped",
}
