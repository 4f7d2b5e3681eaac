"""The canonical parameter layout both frameworks convert to and from, for every family (numpy only).

Names follow GPT-2 / nanoGPT. Per-block tensors are stacked on a leading layer axis of size N
(``h.*``, :mod:`jaxremat.models.block`). Matrices are stored ``(in_features, out_features)`` as
GPT-2's ``Conv1D`` does, so a projection is ``x @ W + b``; the PyTorch side transposes to
``nn.Linear``'s ``(out, in)``. Transposes and copies are exact, so conversion round trips are
bitwise. Each family's layout is its :attr:`ModelSpec.param_shapes`
(:func:`jaxremat.models.gpt.layout.gpt_param_shapes`,
:func:`jaxremat.models.bert.layout.encoder_param_shapes`); the functions here look it up by ``cfg.arch``.
"""

from __future__ import annotations

import numpy as np

from .registry import get_model


def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of ``cfg``'s family, in the family's fixed order.

    Args:
        cfg: a :class:`jaxremat.models.TransformerConfig` (or any config with a registered ``arch``).

    Raises:
        ValueError: ``cfg.arch`` is not a registered family.
    """
    return get_model(cfg.arch).param_shapes(cfg)


def init_params(cfg, seed: int = 0, perturb: bool = True) -> dict[str, np.ndarray]:
    """Initial parameters of ``cfg``'s family (:attr:`ModelSpec.init_params`; built in: :func:`gpt2_init`).

    Raises:
        ValueError: ``cfg.arch`` is not a registered family.
    """
    return get_model(cfg.arch).init_params(cfg, seed=seed, perturb=perturb)


def gpt2_init(cfg, seed: int = 0, perturb: bool = True) -> dict[str, np.ndarray]:
    """GPT-2 initialisation in numpy: N(0, 0.02) weights, residual projections scaled by 1/sqrt(2N).

    Args:
        cfg: model configuration; arrays come out in ``cfg.dtype``.
        seed: seed of ``numpy.random.default_rng``.
        perturb: if True, biases get N(0, 0.02) and LayerNorm gains ``1 + N(0, 0.02)`` instead of
            GPT-2's zeros and ones, so that every parameter carries a distinct, checkable gradient.

    Returns:
        name -> array with the shapes of :func:`param_shapes`.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    resid_std = 0.02 / np.sqrt(2 * cfg.n_layer)
    for name, shape in param_shapes(cfg).items():
        if name.endswith("bias"):
            arr = rng.normal(0.0, 0.02, shape) if perturb else np.zeros(shape)
        elif ".ln_" in name or name.startswith("ln_"):
            arr = 1.0 + rng.normal(0.0, 0.02, shape) if perturb else np.ones(shape)
        elif name.endswith("c_proj.weight"):
            arr = rng.normal(0.0, resid_std, shape)
        else:
            arr = rng.normal(0.0, 0.02, shape)
        out[name] = np.ascontiguousarray(arr.astype(cfg.dtype))
    return out


def check_params(cfg, params: dict[str, np.ndarray]) -> None:
    """Raise ValueError naming the key when a parameter is missing, unexpected or mis-shaped."""
    shapes = param_shapes(cfg)
    missing = [k for k in shapes if k not in params]
    unexpected = [k for k in params if k not in shapes]
    if missing or unexpected:
        raise ValueError(f"parameter keys differ from the layout: missing {missing}, unexpected {unexpected}")
    for k, shape in shapes.items():
        got = tuple(np.shape(params[k]))
        if got != shape:
            raise ValueError(f"parameter {k!r}: expected shape {shape}, got {got}")
