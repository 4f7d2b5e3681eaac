"""The model side: configs, parameter layouts, initialisation and the registry of model families.

Imports neither JAX nor PyTorch (the PyTorch reference imports it). One folder per family,
:mod:`jaxremat.models.gpt` and :mod:`jaxremat.models.bert`, each registering one
:class:`ModelSpec` on import (here); :func:`get_model` looks a family up by ``cfg.arch``. The remat
language the models are rendered with is :mod:`jaxremat.spec`. Adding a family:
``docs/extending.md``.
"""

from .registry import LAZY_PARTS, ModelSpec, get_model, register_model, registered_models, unregister_model
from .config import COMPUTE_DTYPES, SUPPORTED_DTYPES, TransformerConfig
from .block import BLOCK_PARAM_NAMES
from .params import check_params, gpt2_init, init_params, param_shapes
# Each family registers itself on import; gpt first (the default arch, listed first in messages).
from . import gpt  # noqa: E402,F401
from . import bert  # noqa: E402,F401

__all__ = [
    "BLOCK_PARAM_NAMES", "COMPUTE_DTYPES", "LAZY_PARTS", "ModelSpec", "SUPPORTED_DTYPES", "TransformerConfig",
    "check_params", "get_model", "gpt2_init", "init_params", "param_shapes", "register_model", "registered_models",
    "unregister_model",
]
