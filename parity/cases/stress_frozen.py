"""Frozen parameters under remat: the GPT with its embeddings and first half of the blocks frozen.

This module says what is frozen (:func:`trainable_mask`) and how the results are keyed; each
framework freezes its own way (:meth:`parity.runners.framework.Framework.run_plan` with
``RunOptions(frozen=True)``: PyTorch ``requires_grad_(False)``, JAX ``lax.stop_gradient`` and a
masked update; :mod:`parity.runners.torch_stress`, :mod:`parity.runners.jax_stress`).

With the embeddings frozen no block input requires a gradient: the first checkpointed segment
that holds trainable blocks gets an input that does not require grad, which is where the
reentrant checkpoint would drop the gradients of the parameters inside it (PyTorch docs,
``torch.utils.checkpoint``); the renderer uses the non-reentrant variant.

Gradients are compared per trainable tensor and layer: keys ``name`` for whole tensors and
``name[i]`` for layer i of a stacked ``h.*`` tensor.
"""

from __future__ import annotations

import numpy as np

from jaxremat.models import TransformerConfig, param_shapes


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
