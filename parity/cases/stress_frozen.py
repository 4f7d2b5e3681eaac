"""Frozen parameters under remat: the GPT with its embeddings and first half of the blocks frozen.

PyTorch freezes with ``requires_grad_(False)`` (frozen parameters get no ``.grad``; AdamW skips
them). JAX has no flag on an array: the frozen parts pass through ``lax.stop_gradient`` (their
gradient is exactly zero) and the optimizer update is masked (``optax.adamw`` followed by a
per-row mask, so frozen rows of a stacked ``h.*`` tensor do not move, weight decay included).

With the embeddings frozen no block input requires a gradient: the first checkpointed segment
that holds trainable blocks gets an input that does not require grad, which is where the
reentrant checkpoint would drop the gradients of the parameters inside it (PyTorch docs,
``torch.utils.checkpoint``); the renderer uses the non-reentrant variant.

Gradients are compared per trainable tensor and layer: keys ``name`` for whole tensors and
``name[i]`` for layer i of a stacked ``h.*`` tensor.
"""

from __future__ import annotations

# Deferred imports: JAX and PyTorch load only in their own runner function (a one-framework run never loads
# the other).

import numpy as np

from jaxremat.models import TransformerConfig, param_shapes
from jaxremat.spec import Schedule

from parity.inputs.train import AdamWConfig

from parity.runners.result import RunResult
import contextlib


def frozen_layers(cfg: TransformerConfig) -> int:
    """How many leading blocks are frozen: the first half, ``n_layer // 2``."""
    return cfg.n_layer // 2


def trainable_mask(cfg: TransformerConfig) -> dict[str, np.ndarray]:
    """Name -> bool array broadcastable to the parameter: False where frozen (wte, wpe, first half)."""
    n_frozen = frozen_layers(cfg)
    out = {}
    for name, shape in param_shapes(cfg).items():
        if name in ("wte", "wpe"):
            out[name] = np.zeros((1,) * len(shape), bool)
        elif name.startswith("h."):
            out[name] = (np.arange(cfg.n_layer) >= n_frozen).reshape((-1,) + (1,) * (len(shape) - 1))
        else:
            out[name] = np.ones((1,) * len(shape), bool)
    return out


def split_trainable(cfg: TransformerConfig, full: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The trainable entries of a canonical dict: ``name`` or ``name[i]`` per trainable layer."""
    mask, out = trainable_mask(cfg), {}
    for name, arr in full.items():
        if name.startswith("h."):
            for i in np.flatnonzero(mask[name].ravel()):
                out[f"{name}[{i}]"] = np.ascontiguousarray(arr[i])
        elif mask[name].all():
            out[name] = arr
    return out


def frozen_entries(cfg: TransformerConfig, full: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The frozen entries of a canonical dict, keyed like :func:`split_trainable`."""
    mask, out = trainable_mask(cfg), {}
    for name, arr in full.items():
        if name.startswith("h."):
            for i in np.flatnonzero(~mask[name].ravel()):
                out[f"{name}[{i}]"] = np.ascontiguousarray(arr[i])
        elif not mask[name].any():
            out[name] = arr
    return out


def run_jax(cfg, params, tokens, schedule: Schedule, *, mode: str, hparams: AdamWConfig) -> RunResult:
    """Loss, full gradients (zero where frozen) and trained weights of the frozen GPT in JAX.

    Returns:
        :class:`parity.runners.result.RunResult` with ``loss``, ``grads``, ``trained`` and ``mode``
        (``memory`` None: not measured; ``frozen_grads_none`` None: JAX has no None gradient,
        frozen entries are checked for zero).
    """
    import jax
    import jax.numpy as jnp
    import optax

    from jaxremat.model import loss_fn

    mask = {k: jnp.asarray(v) for k, v in trainable_mask(cfg).items()}

    def frozen_loss(p, toks):
        p = {k: v if bool(np.all(trainable_mask(cfg)[k])) else jnp.where(mask[k], v, jax.lax.stop_gradient(v))
             for k, v in p.items()}
        return loss_fn(p, toks, cfg, schedule)

    tx = optax.adamw(hparams.learning_rate, b1=hparams.b1, b2=hparams.b2, eps=hparams.eps,
                     weight_decay=hparams.weight_decay)

    def update(grads, state, p):
        updates, state = tx.update(grads, state, p)
        updates = {k: u * mask[k].astype(u.dtype) for k, u in updates.items()}  # frozen rows: + 0
        return optax.apply_updates(p, updates), state

    vg = jax.value_and_grad(frozen_loss)
    if mode == "jit":
        vg, update = jax.jit(vg), jax.jit(update)
    ctx = jax.disable_jit() if mode == "eager" else _null()
    with ctx:
        p = {k: jnp.asarray(v) for k, v in params.items()}
        toks = jnp.asarray(tokens, jnp.int32)
        loss, grads = vg(p, toks)
        loss, grads = np.asarray(loss), {k: np.asarray(v) for k, v in grads.items()}
        state = tx.init(p)
        for _ in range(hparams.steps):
            _, g = vg(p, toks)
            p, state = update(g, state, p)
        trained = {k: np.asarray(v) for k, v in p.items()}
    return RunResult(loss=loss, grads=grads, trained=trained, mode=mode)


def run_torch(cfg, params, tokens, schedule: Schedule, *, hparams: AdamWConfig) -> RunResult:
    """Loss, gradients and trained weights of the frozen GPT in PyTorch (``requires_grad_(False)``).

    Returns:
        :class:`parity.runners.result.RunResult` with ``loss``, ``grads`` (zeros where frozen),
        ``trained``, ``mode`` (``"eager"``) and ``frozen_grads_none`` (every frozen parameter got
        no ``.grad``); ``memory`` None: not measured.
    """
    import torch

    from torchref.model import GPT
    from torchref.render import model_loss

    def build():
        m = GPT.from_params(cfg, params)
        m.wte.requires_grad_(False), m.wpe.requires_grad_(False)
        for b in list(m.blocks)[:frozen_layers(cfg)]:
            b.requires_grad_(False)
        return m

    toks = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    model = build()
    loss = model_loss(model, toks, schedule)
    loss.backward()
    frozen = [p for p in model.parameters() if not p.requires_grad]
    grads = {}
    for name, shape in param_shapes(cfg).items():
        tensors, transpose = model._canonical_tensors(name)
        rows = [np.zeros(t.shape[::-1] if transpose else t.shape, np.dtype(cfg.dtype)) if t.grad is None
                else (t.grad.t() if transpose else t.grad).numpy() for t in tensors]
        grads[name] = np.stack(rows) if name.startswith("h.") else rows[0]
    loss_np = loss.detach().numpy().copy()
    frozen_grads_none = all(p.grad is None for p in frozen) and bool(frozen)
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=hparams.learning_rate, betas=(hparams.b1, hparams.b2),
                            eps=hparams.eps, weight_decay=hparams.weight_decay)
    for _ in range(hparams.steps):
        opt.zero_grad(set_to_none=True)
        model_loss(model, toks, schedule).backward()
        opt.step()
    return RunResult(loss=loss_np, grads=grads, trained=model.to_params(), mode="eager",
                     frozen_grads_none=frozen_grads_none)


def _null():

    return contextlib.nullcontext()
