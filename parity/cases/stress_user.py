"""User-style block stacks for the stress cases: state updated in the forward pass, and randomness.

A user's own block, written the way users write them, run under every schedule in both frameworks:

    y = x + drop(W2 gelu(norm(x) W1 + b1) * (1 + sigma * n) + b2)

* ``norm``: BatchNorm over the B*T rows with running statistics (``running_stats``: Flax
  ``linen.BatchNorm`` with its ``batch_stats`` collection carried through
  :func:`jaxremat.render.remat_scan` ``with_outputs=True``; ``torch.nn.BatchNorm1d`` under
  :func:`torchref.render.forward_blocks`), plus a per-layer step counter; or the identity.
* ``drop``: inverted dropout at rate ``p``; ``n``: standard normal noise, a second random op in
  the same checkpointed segment (JAX: per-layer keys as scanned ``xs``; torch: the CPU generator,
  restored by ``preserve_rng_state=True`` for the recompute).

Weights are one canonical numpy dict (matrices ``(in, out)``, layers stacked on axis 0) so both
frameworks start from the same bits. Training is plain SGD (``p - lr * g``), ``steps`` steps on
``steps`` fixed batches; every run reports the first step's loss and gradients, the trained
weights, and the state after training (running statistics and counters).
"""

from __future__ import annotations

# Deferred imports: JAX/Flax and PyTorch load only in their own runner function (a one-framework run never
# loads the other).

import dataclasses
import functools

import numpy as np

from jaxremat.spec import Schedule

from parity.runners.result import RunResult
import contextlib


@dataclasses.dataclass(frozen=True)
class UserStack:
    """Shape and options of a user-style stack.

    Attributes:
        n_layer: blocks N. d_model: width D. d_ff: hidden width F. batch, seq: B and T of a batch.
        running_stats: BatchNorm with running statistics and a step counter (else no norm).
        dropout: dropout rate p in [0, 1). noise: scale sigma of the multiplicative normal noise.
        steps: SGD steps. lr: SGD learning rate. seed: seed of weights, batches and randomness.
    """

    n_layer: int = 4
    d_model: int = 64
    d_ff: int = 256
    batch: int = 4
    seq: int = 32
    running_stats: bool = False
    dropout: float = 0.0
    noise: float = 0.0
    steps: int = 3
    lr: float = 0.1
    seed: int = 0

    @property
    def random(self) -> bool:
        return self.dropout > 0 or self.noise > 0

    def params(self) -> dict[str, np.ndarray]:
        """Canonical float32 weights: ``bn.scale``/``bn.bias`` (N, D, with running stats), ``w1`` (N, D, F), ``b1`` (N, F),
        ``w2`` (N, F, D), ``b2`` (N, D)."""
        rng = np.random.default_rng(self.seed)
        N, D, F = self.n_layer, self.d_model, self.d_ff
        f = lambda s, std: rng.normal(0.0, std, s).astype(np.float32)  # noqa: E731
        out = {"bn.scale": 1 + f((N, D), 0.1), "bn.bias": f((N, D), 0.1), "w1": f((N, D, F), D ** -0.5),
               "b1": f((N, F), 0.1), "w2": f((N, F, D), F ** -0.5), "b2": f((N, D), 0.1)}
        return out if self.running_stats else {k: v for k, v in out.items() if not k.startswith("bn.")}

    def batches(self) -> np.ndarray:
        """(steps, B, T, D) float32 inputs, one batch per step."""
        rng = np.random.default_rng(self.seed + 1)
        return rng.normal(size=(self.steps, self.batch, self.seq, self.d_model)).astype(np.float32)


# --------------------------------------------------------------------------------------------- JAX
def run_jax(stack: UserStack, schedule: Schedule, *, jit: bool) -> RunResult:
    """Train the stack in JAX under ``schedule`` (``jit`` or op by op); see the module docstring.

    Returns:
        :class:`parity.runners.result.RunResult`: the first step's ``loss`` and ``grads``, the
        ``trained`` weights, ``mode`` and ``state`` (``running_mean``, ``running_var``, ``count``:
        (N, D), (N, D), (N,) float32; ``{}`` without running statistics); ``memory`` None.
    """
    import jax
    import jax.numpy as jnp

    grad_fn, sgd = _jax_programs(stack, schedule, jit)
    N, D = stack.n_layer, stack.d_model
    params = {k: jnp.asarray(v) for k, v in stack.params().items()}
    stats = {"batch_stats": {"mean": jnp.zeros((N, D)), "var": jnp.ones((N, D))}, "count": jnp.zeros((N,))} \
        if stack.running_stats else None
    base_key = jax.random.key(stack.seed) if stack.random else None
    out = {}
    with (jax.disable_jit() if not jit else _null()):
        for i, x in enumerate(stack.batches()):
            key = jax.random.fold_in(base_key, i) if base_key is not None else None
            (loss_val, stats), grads = grad_fn(params, stats, jnp.asarray(x), key)
            if i == 0:
                out["loss"], out["grads"] = np.asarray(loss_val), {k: np.asarray(v) for k, v in grads.items()}
            params = sgd(params, grads)
    state = {} if stats is None else {
        "running_mean": np.asarray(stats["batch_stats"]["mean"]), "running_var": np.asarray(stats["batch_stats"]["var"]),
        "count": np.asarray(stats["count"])}
    return RunResult(loss=out["loss"], grads=out["grads"], trained={k: np.asarray(v) for k, v in params.items()},
                     mode="jit" if jit else "eager", state=state)


@functools.lru_cache(maxsize=32)
def _jax_programs(stack: UserStack, schedule: Schedule, jit: bool):
    """``(value_and_grad, sgd)`` of the stack, built (and jitted) once per key."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from jaxremat.render import remat_scan

    bn = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)
    N, D = stack.n_layer, stack.d_model

    def block_fn(p, x, xs):
        stats, key = xs
        B, T, _ = x.shape
        h, new_stats = x, stats
        if stack.running_stats:
            h, upd = bn.apply({"params": {"scale": p["bn.scale"], "bias": p["bn.bias"]},
                               "batch_stats": stats["batch_stats"]}, x.reshape(B * T, D), mutable=["batch_stats"])
            h = h.reshape(B, T, D)
            new_stats = {"batch_stats": upd["batch_stats"], "count": stats["count"] + 1}
        m = jax.nn.gelu(h @ p["w1"] + p["b1"]) @ p["w2"]
        if key is not None:
            k_noise, k_drop = jax.random.split(key)
            if stack.noise:
                m = m * (1.0 + stack.noise * jax.random.normal(k_noise, m.shape, m.dtype))
        m = m + p["b2"]
        if key is not None and stack.dropout:
            keep = jax.random.bernoulli(k_drop, 1.0 - stack.dropout, m.shape)
            m = jnp.where(keep, m / (1.0 - stack.dropout), jnp.zeros_like(m))
        return x + m, new_stats

    def loss(params, stats, x, key):
        keys = jax.random.split(key, N) if key is not None else None
        y, new_stats = remat_scan(block_fn, params, x, schedule, xs=(stats, keys), with_outputs=True)
        return jnp.mean(jnp.square(y)), new_stats

    grad_fn = jax.value_and_grad(loss, has_aux=True)
    sgd = lambda p, g: jax.tree_util.tree_map(lambda a, b: a - stack.lr * b, p, g)  # noqa: E731
    return (jax.jit(grad_fn), jax.jit(sgd)) if jit else (grad_fn, sgd)


def _null():

    return contextlib.nullcontext()


# ------------------------------------------------------------------------------------------- torch
def _torch_block_class():
    import torch
    import torch.nn as tnn
    import torch.nn.functional as F

    class UserBlock(tnn.Module):
        """The torch mirror of the JAX block (``nn.BatchNorm1d``, momentum 0.1 = Flax's 0.9)."""

        def __init__(self, stack: UserStack):
            super().__init__()
            self.stack = stack
            self.bn = tnn.BatchNorm1d(stack.d_model, eps=1e-5, momentum=0.1) if stack.running_stats else None
            self.fc1 = tnn.Linear(stack.d_model, stack.d_ff)
            self.fc2 = tnn.Linear(stack.d_ff, stack.d_model)
            if stack.running_stats:
                self.register_buffer("count", torch.zeros((), dtype=torch.float32))

        def forward(self, x):  # (B, T, D) -> (B, T, D)
            B, T, D = x.shape
            h = x
            if self.bn is not None:
                h = self.bn(x.reshape(B * T, D)).reshape(B, T, D)
                self.count.add_(1.0)
            m = F.gelu(F.linear(h, self.fc1.weight, self.fc1.bias), approximate="tanh") @ self.fc2.weight.t()
            if self.stack.noise:
                m = m * (1.0 + self.stack.noise * torch.randn_like(m))
            m = m + self.fc2.bias
            if self.stack.dropout:
                m = F.dropout(m, self.stack.dropout, training=True)
            return x + m

    return UserBlock


def run_torch(stack: UserStack, schedule: Schedule) -> RunResult:
    """Train the stack in PyTorch under ``schedule``; see the module docstring.

    Returns:
        :class:`parity.runners.result.RunResult` as :func:`run_jax`'s, ``mode`` ``"eager"``; its
        ``state`` adds ``num_batches_tracked`` (N,) int64 (BatchNorm's own counter).
    """
    import torch

    from torchref.render import forward_blocks

    block_cls = _torch_block_class()
    with torch.random.fork_rng(devices=[]):
        blocks = torch.nn.ModuleList(block_cls(stack) for _ in range(stack.n_layer))
    p = stack.params()
    with torch.no_grad():
        for i, b in enumerate(blocks):
            if b.bn is not None:
                b.bn.weight.copy_(torch.from_numpy(p["bn.scale"][i])), b.bn.bias.copy_(torch.from_numpy(p["bn.bias"][i]))
            b.fc1.weight.copy_(torch.from_numpy(p["w1"][i].T.copy())), b.fc1.bias.copy_(torch.from_numpy(p["b1"][i]))
            b.fc2.weight.copy_(torch.from_numpy(p["w2"][i].T.copy())), b.fc2.bias.copy_(torch.from_numpy(p["b2"][i]))
    opt = torch.optim.SGD(blocks.parameters(), lr=stack.lr)
    out = {}
    for i, x in enumerate(stack.batches()):
        torch.manual_seed(stack.seed * 1000 + i)
        opt.zero_grad(set_to_none=True)
        loss = forward_blocks(blocks, torch.from_numpy(x), schedule).square().mean()
        loss.backward()
        if i == 0:
            out["loss"], out["grads"] = loss.detach().numpy().copy(), _canonical(blocks, stack, grads=True)
        opt.step()
    state = {} if not stack.running_stats else {
        "running_mean": np.stack([b.bn.running_mean.numpy() for b in blocks]),
        "running_var": np.stack([b.bn.running_var.numpy() for b in blocks]),
        "count": np.stack([b.count.numpy() for b in blocks]),
        "num_batches_tracked": np.stack([b.bn.num_batches_tracked.numpy() for b in blocks])}
    return RunResult(loss=out["loss"], grads=out["grads"], trained=_canonical(blocks, stack, grads=False),
                     mode="eager", state=state)


def _canonical(blocks, stack: UserStack, *, grads: bool) -> dict[str, np.ndarray]:
    """The torch weights (or gradients) in the canonical layout of :meth:`UserStack.params`."""
    def get(t, transpose=False):
        v = (t.grad if grads else t).detach().numpy()
        return np.ascontiguousarray(v.T if transpose else v).copy()

    out = {"w1": np.stack([get(b.fc1.weight, True) for b in blocks]), "b1": np.stack([get(b.fc1.bias) for b in blocks]),
           "w2": np.stack([get(b.fc2.weight, True) for b in blocks]), "b2": np.stack([get(b.fc2.bias) for b in blocks])}
    if stack.running_stats:
        out["bn.scale"] = np.stack([get(b.bn.weight) for b in blocks])
        out["bn.bias"] = np.stack([get(b.bn.bias) for b in blocks])
    return out
