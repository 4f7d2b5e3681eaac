"""The model registry: one :class:`ModelSpec` per model family, looked up by ``cfg.arch``.

In the manner of torchtitan's train specs (``torchtitan/protocols/train_spec.py``:
``register_train_spec`` / ``get_train_spec``, formerly ``ModelSpec``): each family registers one
frozen record naming its parts, and the renderers' callers and the parity harness look the family
up instead of branching on its name. Adding a family is one folder ``jaxremat/models/<family>/``
plus one :func:`register_model` call (``docs/extending.md``).

The framework-neutral parts (parameter layout, initialisation) are plain callables. The JAX and
PyTorch parts are import paths ``"module:attr"`` (or ``"module"`` for a whole module), resolved by
:meth:`ModelSpec.load` on first use, so this module, and every spec, imports neither JAX nor
PyTorch: the PyTorch reference reads the registry without loading JAX, and the reverse.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any, Callable, Optional

__all__ = ["LAZY_PARTS", "ModelSpec", "get_model", "register_model", "registered_models", "unregister_model"]

LAZY_PARTS = ("jax_loss", "jax_reverse_loop", "jax_check_batch", "torch_model", "torch_loss", "torch_reverse_loop",
              "checkpoint", "activation_account", "peer_checks", "jax_planner_chain", "torch_planner_chain")
"""The fields of :class:`ModelSpec` that hold import paths, resolved by :meth:`ModelSpec.load`."""

_PATH = re.compile(r"[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?")
_MODELS: dict[str, "ModelSpec"] = {}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What the library and the harness need to know of one model family.

    Attributes:
        name: the family, the value of ``TransformerConfig.arch`` (``"gpt"``, ``"bert"``).
        description: one line for messages and docs.
        config: constructor of a config of this family from keyword fields
            (``functools.partial(TransformerConfig, arch="gpt")``).
        param_shapes: ``cfg -> {name: shape}``, the canonical parameter layout in a fixed order
            (matrices ``(in, out)``, per-block tensors stacked on a leading layer axis N).
        init_params: ``(cfg, seed=0, perturb=True) -> {name: numpy array}`` in ``cfg.dtype``.
        jax_loss: path of the JAX loss ``(params, tokens, cfg, schedule, dropout_key=None, *, policy=None)
            -> 0-d loss``, its block stack run by :func:`jaxremat.render.remat_scan`.
        jax_reverse_loop: path of the JAX reverse segment loop ``(params, tokens, cfg, schedule, key)
            -> (loss, grads)`` (:mod:`jaxremat.reverse_loop`).
        torch_model: path of the PyTorch ``nn.Module`` class: ``.from_params(cfg, params)`` builds it
            from the canonical dict, ``.to_params(grads=False)`` reads parameters (or gradients) back.
        torch_loss: path of the PyTorch loss ``(model, tokens, schedule, *, policy=None,
            on_checkpoint_input=None) -> 0-d tensor`` (:func:`torchref.render.model_loss`).
        torch_reverse_loop: path of the PyTorch reverse segment loop ``(model, tokens, schedule)
            -> (loss, grads)`` (:mod:`torchref.reverse_loop`).
        jax_check_batch: path of an eager ``(tokens, cfg) -> None`` check of a loss batch, run before
            ``jax.jit`` traces the ids (None: the loss checks what it can under tracing).
        checkpoint: path of the Hugging Face checkpoint adapter module (``config_from_hf``,
            ``hf_config``, ``hf_shapes``, ``to_canonical``, ``from_canonical``, ``PREFIX``,
            ``LAYER_KEY``, ``IGNORED_KEYS``; see :mod:`jaxremat.models.gpt.checkpoint`), or None.
        hf_model_type: the ``model_type`` of a Hugging Face ``config.json`` this family reads, or None.
        activation_account: path of the per-tensor activation account module
            (:mod:`jaxremat.models.gpt.activation`'s functions), or None when the family has none.
        peer_checks: path of the harness's checks against a peer implementation
            (``(cfg, params, tokens, checkpoint_dir) -> list of dicts``), or None.
        jax_planner_chain: path of the planner's chain builder in JAX, ``(cfg, batch, seq, policies)
            -> {"options_per_block", "boundary_bytes", "invariant_bytes", "fixed_bytes"}``
            (:func:`jaxremat.planner.gpt_chain`), or None when the family cannot be planned.
        torch_planner_chain: the same in PyTorch (:func:`torchref.planner.gpt_chain`), or None.
        batch: what a loss batch holds: ``"windows"`` (``(B, T+1)`` token windows, next-token
            targets) or ``"sentence_pairs"`` (``(B, T)`` padded ids of B/2 paraphrase pairs).
        block_names_measurable: whether the per-block kept-names measurement
            (:mod:`jaxremat.block_memory`, :mod:`torchref.block_memory`) builds this family's block.
        compute_dtypes: the mixed-precision ``TransformerConfig.compute_dtype`` values implemented.
        attentions: the ``TransformerConfig.attention`` values implemented (``"materialized"`` at least).
        stress_suite: whether ``python -m parity run --suite stress`` runs this family's presets.

    Raises:
        ValueError: a name that is not a lower-case identifier, an import path that is not
            ``"module"`` or ``"module:attr"``, or an unknown ``batch`` kind.
    """

    name: str
    description: str
    config: Callable[..., Any]
    param_shapes: Callable[[Any], dict[str, tuple[int, ...]]]
    init_params: Callable[..., dict[str, Any]]
    jax_loss: str
    jax_reverse_loop: str
    torch_model: str
    torch_loss: str
    torch_reverse_loop: str
    jax_check_batch: Optional[str] = None
    checkpoint: Optional[str] = None
    hf_model_type: Optional[str] = None
    activation_account: Optional[str] = None
    peer_checks: Optional[str] = None
    jax_planner_chain: Optional[str] = None
    torch_planner_chain: Optional[str] = None
    batch: str = "windows"
    block_names_measurable: bool = False
    compute_dtypes: tuple[str, ...] = ()
    attentions: tuple[str, ...] = ("materialized",)
    stress_suite: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"ModelSpec.name must be a lower-case identifier such as 'gpt', got {self.name!r}")
        for part in LAZY_PARTS:
            path = getattr(self, part)
            if path is not None and not (isinstance(path, str) and _PATH.fullmatch(path)):
                raise ValueError(f"ModelSpec {self.name!r}: {part} must be an import path 'module:attr' or "
                                 f"'module', got {path!r}")
        if self.batch not in ("windows", "sentence_pairs"):
            raise ValueError(f"ModelSpec {self.name!r}: batch must be 'windows' or 'sentence_pairs', got {self.batch!r}")

    def load(self, part: str) -> Any:
        """The object a lazy part names, imported now (modules are cached by Python after the first import).

        Args:
            part: one of :data:`LAZY_PARTS` (``"jax_loss"``, ``"torch_model"``, ...).

        Returns:
            The attribute (``"module:attr"``) or the module (``"module"``).

        Raises:
            ValueError: ``part`` is not a lazy part, or this family leaves it None.
            ImportError: the module cannot be imported (e.g. its framework is not installed).
            AttributeError: the module has no such attribute.
        """
        if part not in LAZY_PARTS:
            raise ValueError(f"{part!r} is not a lazy part of a ModelSpec; lazy parts: {', '.join(LAZY_PARTS)}")
        path = getattr(self, part)
        if path is None:
            raise ValueError(f"model family {self.name!r} has no {part}")
        module_name, _, attr = path.partition(":")
        module = importlib.import_module(module_name)
        return getattr(module, attr) if attr else module


def register_model(spec: ModelSpec) -> ModelSpec:
    """Add a family to the registry and return its spec.

    Raises:
        TypeError: ``spec`` is not a :class:`ModelSpec`.
        ValueError: a family of that name is registered already (:func:`unregister_model` it first).
    """
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"register_model takes a ModelSpec, got {type(spec).__name__}")
    if spec.name in _MODELS:
        raise ValueError(f"model family {spec.name!r} is registered already")
    _MODELS[spec.name] = spec
    return spec


def unregister_model(name: str) -> ModelSpec:
    """Remove a family from the registry and return its spec (for plug-ins and tests).

    Raises:
        ValueError: no family of that name is registered (the message lists the registered ones).
    """
    spec = get_model(name)
    del _MODELS[name]
    return spec


def get_model(arch: str) -> ModelSpec:
    """The spec of family ``arch`` (the value of ``TransformerConfig.arch``).

    Raises:
        ValueError: no such family; the message lists the registered families.
    """
    try:
        return _MODELS[arch]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model family {arch!r}; registered families: {', '.join(_MODELS)}") from None


def registered_models() -> tuple[str, ...]:
    """The registered family names, in registration order (``("gpt", "bert")`` built in)."""
    return tuple(_MODELS)
