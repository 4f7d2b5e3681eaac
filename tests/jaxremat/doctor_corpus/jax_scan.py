"""User-like losses and train steps written with ``jax.checkpoint`` and ``lax.scan`` (the doctor's corpus).

Each function returns ``(fn, args)`` for ``jaxremat.doctor(fn, *args)`` and
``python -m jaxremat.doctor tests/jaxremat/doctor_corpus/jax_scan.py:FUNCTION``; ``EXPECTED`` maps
it to the one problem kind the doctor must report (None: no problem).
"""

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.ad_checkpoint import checkpoint_name

L, B, D = 4, 16, 64  # layers, batch, width
cp = jax.checkpoint_policies


def init_params(seed=0, n_layer=L):
    k_in, k_out = jax.random.split(jax.random.key(seed))
    return {"w_in": jax.random.normal(k_in, (n_layer, D, D)) / D ** 0.5,
            "b_in": jnp.zeros((n_layer, D)),
            "w_out": jax.random.normal(k_out, (n_layer, D, D)) / D ** 0.5}


def batch():
    return jax.random.normal(jax.random.key(1), (B, D))


def block(p, h):  # one residual MLP layer; its two products are tagged
    u = checkpoint_name(h @ p["w_in"] + p["b_in"], "mlp_in")
    return h + checkpoint_name(jnp.tanh(u) @ p["w_out"], "mlp_out")


def scan_loss(policy):
    def loss(params, x):
        def body(h, p):
            return block(p, h), None

        h, _ = lax.scan(jax.checkpoint(body, policy=policy), x, params)
        return jnp.mean(h ** 2)

    return loss


def correct():
    return scan_loss(cp.save_only_these_names("mlp_in")), (init_params(), batch())


def correct_dots():
    return scan_loss(cp.dots_with_no_batch_dims_saveable), (init_params(), batch())


def name_missing():  # MaxText's tag name; this block tags its product "mlp_in"
    return scan_loss(cp.save_only_these_names("mlpwi")), (init_params(), batch())


def dropped_under_vmap():  # an ensemble of stacks: the vmap inside the loss batches every product
    def loss(params, x):
        return jax.vmap(scan_loss(cp.dots_with_no_batch_dims_saveable), in_axes=(0, None))(params, x).mean()

    ensemble = jax.tree.map(lambda a: jnp.stack([a, a]), init_params())
    return loss, (ensemble, batch())


def offload_to_unpinned_host():
    policy = cp.save_and_offload_only_these_names(names_which_can_be_saved=[], names_which_can_be_offloaded=["mlp_in"],
                                                  offload_src="device", offload_dst="unpinned_host")
    return scan_loss(policy), (init_params(), batch())


def correct_offload():
    policy = cp.save_and_offload_only_these_names(names_which_can_be_saved=[], names_which_can_be_offloaded=["mlp_in"],
                                                  offload_src="device", offload_dst="pinned_host")
    return scan_loss(policy), (init_params(), batch())


# XLA:CPU of jaxlib 0.10.2 merges a Python loop's per-layer checkpoints into the forward pass (27 matrix
# products before optimization, fewer after; compiled saving below 40% of the promised 32 KiB); jaxlib
# 0.12.0.1 keeps them (27 / 27 products, 23.2 of 32 KiB realized), and the doctor then reports nothing.
PYTHON_LOOP_MERGED = jax.__version_info__ < (0, 12)


def python_loop():  # one checkpoint per layer of a Python loop: XLA:CPU (jaxlib 0.10) merges the recompute away
    def loss(params, x):
        h = x
        for i in range(L):
            h = jax.checkpoint(block)(jax.tree.map(lambda a: a[i], params), h)
        return jnp.mean(h ** 2)

    return loss, (init_params(), batch())


def whole_stack():  # one checkpoint around the whole scan: its recompute is live all at once
    def loss(params, x):
        def stack(params, x):
            return lax.scan(lambda h, p: (block(p, h), None), x, params)[0]

        return jnp.mean(jax.checkpoint(stack)(params, x) ** 2)

    return loss, (init_params(), batch())


def every_layer_output():  # every layer's output stacked as ys, to take the last one
    def loss(params, x):
        body = jax.checkpoint(lambda h, p: (block(p, h),) * 2)
        _, hs = lax.scan(body, x, params)
        return jnp.mean(hs[-1] ** 2)

    return loss, (init_params(), batch())


def train_step(policy=cp.save_only_these_names("mlp_in")):
    opt = optax.sgd(0.1)
    loss = scan_loss(policy)

    @jax.jit
    def step(params, opt_state, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    params = init_params()
    return step, (params, opt.init(params), batch())


def correct_train_step():
    return train_step()


def train_step_name_missing():
    return train_step(cp.save_only_these_names("mlp_hidden"))


EXPECTED = {
    "correct": None, "correct_dots": None, "correct_offload": None, "correct_train_step": None,
    "name_missing": "policy-name-missing", "train_step_name_missing": "policy-name-missing",
    "dropped_under_vmap": "policy-dropped", "offload_to_unpinned_host": "offload-not-host",
    "python_loop": "remat-not-surviving" if PYTHON_LOOP_MERGED else None, "whole_stack": "remat-not-surviving",
    "every_layer_output": "stacked-output",
}
