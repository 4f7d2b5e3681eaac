"""Real checkpoints: a local Hugging Face-format directory (config.json + model.safetensors) in and out.

Two architectures are understood, BERT (``model_type: "bert"``, Hugging Face ``BertModel`` keys,
optionally under a ``bert.`` prefix) and GPT-2 (``model_type: "gpt2"``, ``GPT2Model`` keys,
optionally under ``transformer.``). Weights are read with ``safetensors`` only, never with pickle:
a directory holding only ``pytorch_model.bin`` is refused with a message saying how to convert it.

Every key of the file must map onto the canonical layout (:func:`jaxremat.models.param_shapes`) and
every canonical entry must be found: a missing or unexpected key, or a shape that differs from the
one ``config.json`` implies, is a ValueError naming the key and both shapes. A short list of keys
that hold no parameter of the model is dropped on purpose, each with its reason (the family
adapter's ``IGNORED_KEYS``). Conversion is exact: transposes, concatenation and upcasts only.

The family-specific part, key names and how tensors map onto the layout, is each family's
checkpoint adapter (:attr:`jaxremat.models.ModelSpec.checkpoint`:
:mod:`jaxremat.models.gpt.checkpoint`, :mod:`jaxremat.models.bert.checkpoint`, protocol in
:mod:`jaxremat.models.hf`); this module reads and checks the files.

:func:`check_weights_file` checks ``model.safetensors`` against ``config.json`` from its header
alone (no tensor is read): a file that is empty, truncated, corrupt or pickle bytes under that
name, a layer count that differs from ``n_layer``, missing or unexpected keys, other shapes, and
dtypes that do not load exactly are each one ValueError naming the file, before any work starts.
"""

from __future__ import annotations

# Deferred imports: safetensors (the optional minilm/dev extra) loads only when a checkpoint is read or
# written.

import json
import re
from pathlib import Path

import numpy as np

from jaxremat.models import TransformerConfig, get_model, param_shapes, registered_models

_FLOAT_BYTES = {"F16": 2, "F32": 4, "F64": 8}
"""safetensors dtype codes numpy reads as floats, with their sizes (BF16 has no numpy dtype)."""
_SHOWN = 5
"""Keys listed in one message at most (a config with the wrong depth would list thousands)."""


def architectures() -> tuple[str, ...]:
    """The ``model_type`` values of ``config.json`` that a registered family reads, sorted (``bert``, ``gpt2``)."""
    return tuple(sorted(t for a in registered_models() if (t := get_model(a).hf_model_type) is not None))


def _adapter_for_type(kind):
    """The checkpoint adapter module of the family that reads ``model_type`` ``kind``, or None."""
    for arch in registered_models():
        spec = get_model(arch)
        if spec.hf_model_type is not None and spec.hf_model_type == kind:
            return spec.load("checkpoint")
    return None


def _adapter(cfg: TransformerConfig):
    """The checkpoint adapter of ``cfg``'s family (:mod:`jaxremat.models.hf` gives its protocol).

    Raises:
        ValueError: the family reads no Hugging Face checkpoints.
    """
    spec = get_model(cfg.arch)
    if spec.checkpoint is None:
        raise ValueError(f"model family {cfg.arch!r} has no Hugging Face checkpoint mapping")
    return spec.load("checkpoint")


def _listed(items: list[str]) -> list[str]:
    return items[:_SHOWN] + ([f"and {len(items) - _SHOWN} more"] if len(items) > _SHOWN else [])


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(f"{path} not found: a Hugging Face checkpoint directory needs config.json") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None


def config_from_hf(hf: dict, dtype: str = "float32") -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face ``config.json`` (BERT or GPT-2).

    Args:
        hf: the parsed ``config.json``.
        dtype: compute dtype of the returned config.

    Raises:
        ValueError: an unsupported ``model_type``, activation, position embedding type, or
            different dropout rates (the message names the field and the supported values).
    """
    if not isinstance(hf, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(hf).__name__}")
    adapter = _adapter_for_type(hf.get("model_type"))
    if adapter is None:
        raise ValueError(f"config.json: model_type {hf.get('model_type')!r} is not supported; "
                         f"supported: {', '.join(architectures())}")
    try:
        return adapter.config_from_hf(hf, dtype)
    except KeyError as exc:
        raise ValueError(f"config.json: missing field {exc.args[0]!r} for model_type {hf.get('model_type')!r}") from None


def read_config(path, dtype: str = "float32") -> TransformerConfig:
    """The :class:`TransformerConfig` of ``path/config.json``; every error names that file.

    Raises:
        ValueError: the file is missing or not JSON, or :func:`config_from_hf` refuses it (the
            message starts with the file's path, e.g. ``ckpt/config.json: TransformerConfig.n_layer
            must be an integer >= 1, got 0``).
    """
    file = Path(path) / "config.json"
    hf = _read_json(file)
    try:
        return config_from_hf(hf, dtype=dtype)
    except ValueError as exc:
        text = str(exc)
        raise ValueError(f"{file}: {text.removeprefix('config.json: ')}") from None


def hf_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every parameter a Hugging Face checkpoint of ``cfg`` holds (no prefix)."""
    return _adapter(cfg).hf_shapes(cfg)


def _ignored(adapter, key: str) -> bool:
    return any(re.fullmatch(pattern, key) for pattern, _ in adapter.IGNORED_KEYS)


def hf_to_canonical(cfg: TransformerConfig, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Map Hugging Face tensors onto the canonical layout of ``cfg`` (exact; cast to ``cfg.dtype``).

    Args:
        cfg: the model configuration (from :func:`config_from_hf`).
        tensors: key -> array as stored in ``model.safetensors``.

    Returns:
        canonical dict (:func:`jaxremat.models.param_shapes`), C-contiguous arrays in ``cfg.dtype``.

    Raises:
        ValueError: a missing or unexpected key, or a shape mismatch (the message names the key,
            the checkpoint's shape and the shape ``config.json`` implies); GPT-2's ``lm_head.weight``
            differing from ``wte`` (untied heads are not modelled).
    """
    adapter = _adapter(cfg)
    prefix = adapter.PREFIX
    t = {k[len(prefix):] if k.startswith(prefix) else k: np.asarray(v) for k, v in tensors.items()}
    expected = adapter.hf_shapes(cfg)
    missing = [k for k in expected if k not in t]
    unexpected = [k for k in t if k not in expected and not _ignored(adapter, k)]
    if missing or unexpected:
        raise ValueError(
            "checkpoint keys do not match the model of config.json: "
            + "; ".join(_listed([f"missing key {k!r} (expected shape {expected[k]})" for k in missing])
                        + _listed([f"unexpected key {k!r} (shape {t[k].shape})" for k in unexpected]))
        )
    for k, shape in expected.items():
        if t[k].shape != shape:
            raise ValueError(f"checkpoint key {k!r}: shape {t[k].shape} in the checkpoint, expected {shape} from config.json")
    dt = np.dtype(cfg.dtype)
    out = adapter.to_canonical(cfg, t)
    for k, v in out.items():
        if v.dtype.kind != "f" or v.dtype.itemsize > dt.itemsize:
            raise ValueError(f"checkpoint key for {k!r} holds {v.dtype}; only float arrays up to {dt} load exactly")
    return {k: np.ascontiguousarray(out[k].astype(dt)) for k in param_shapes(cfg)}


def canonical_to_hf(cfg: TransformerConfig, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of :func:`hf_to_canonical`: Hugging Face keys (no prefix) -> C-contiguous arrays."""
    return {k: np.ascontiguousarray(v) for k, v in _adapter(cfg).from_canonical(cfg, params).items()}


def hf_config_dict(cfg: TransformerConfig) -> dict:
    """A minimal Hugging Face ``config.json`` dict describing ``cfg`` (BERT or GPT-2)."""
    return _adapter(cfg).hf_config(cfg)


def save_hf_checkpoint(path, cfg: TransformerConfig, params: dict[str, np.ndarray]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` of ``params`` into directory ``path``; return it."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config_dict(cfg), indent=2) + "\n", encoding="utf-8")
    save_file(canonical_to_hf(cfg, params), str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _weights_path(path: Path) -> Path:
    weights = path / "model.safetensors"
    if not weights.is_file():
        hint = (" (found pytorch_model.bin: pickle files are never loaded; convert it to model.safetensors with "
                "`safetensors`' conversion or `save_pretrained(..., safe_serialization=True)`)"
                if (path / "pytorch_model.bin").exists() else "")
        raise ValueError(f"{weights} not found{hint}; sharded checkpoints are not supported")
    return weights


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _header(weights: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{key: (shape, safetensors dtype code)}`` from the file's header; no tensor is read.

    The file is read as safetensors first (which never unpickles); only a file it refuses is looked at
    for pickle or zip magic bytes, to name what it holds. A valid file's first byte is the low byte of
    its header length, which can be pickle's 0x80 (a 128-byte header)."""
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="numpy") as fh:
            return {k: (tuple(fh.get_slice(k).get_shape()), fh.get_slice(k).get_dtype()) for k in fh.keys()}
    except Exception as exc:  # safetensors raises its own SafetensorError (an Exception)
        reason = _first_line(exc)
    with open(weights, "rb") as fh:
        head = fh.read(4)
    if head[:1] == b"\x80" or head == b"PK\x03\x04":
        kind = "pickle" if head[:1] == b"\x80" else "zip (torch.save)"
        raise ValueError(f"{weights} holds {kind} bytes, not "
                         "safetensors; pickle is never loaded: convert it with `save_pretrained(..., "
                         "safe_serialization=True)`")
    raise ValueError(f"{weights} is not a valid safetensors file ({reason}); "
                     "it is empty, truncated or corrupt: save or download it again")


def check_weights_file(path, cfg: TransformerConfig, dtypes=("float32",)) -> int:
    """Check ``path/model.safetensors`` against ``cfg`` from its header; return its size in bytes.

    Args:
        path: the checkpoint directory.
        cfg: the config of its ``config.json`` (:func:`config_from_hf`).
        dtypes: the dtypes the weights will be loaded in.

    Raises:
        ValueError: the file is missing, holds pickle bytes, is empty, truncated or corrupt; its
            layers are not ``0 .. n_layer-1``; a key is missing or unexpected; a shape differs from
            what ``config.json`` implies; or a tensor is not a float that loads exactly in every one
            of ``dtypes``. Each message names the file and the problem.
    """
    path = Path(path)
    weights = _weights_path(path)
    adapter = _adapter(cfg)
    prefix = adapter.PREFIX
    header = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in _header(weights).items()}
    layers = {int(m.group(1)) for k in header if (m := adapter.LAYER_KEY.match(k))}
    if len(layers) != cfg.n_layer or (layers and (min(layers), max(layers)) != (0, cfg.n_layer - 1)):  # not O(n_layer)
        held = f"layers {min(layers)}..{max(layers)} ({len(layers)} in all)" if layers else "no layers"
        raise ValueError(f"{path / 'config.json'} says {cfg.n_layer} layers but {weights} holds {held}; "
                         "the two files do not belong together")
    expected = hf_shapes(cfg)
    missing = [k for k in expected if k not in header]
    unexpected = [k for k in header if k not in expected and not _ignored(adapter, k)]
    if missing or unexpected:
        raise ValueError(f"{weights}: keys do not match the model of config.json: " + "; ".join(
            _listed([f"missing key {k!r} (expected shape {expected[k]})" for k in missing])
            + _listed([f"unexpected key {k!r} (shape {header[k][0]})" for k in unexpected])))
    for k, shape in expected.items():
        if header[k][0] != shape:
            raise ValueError(f"{weights}: key {k!r}: shape {header[k][0]} in the checkpoint, expected {shape} "
                             "from config.json")
    smallest = min(np.dtype(d).itemsize for d in dtypes)
    for k in expected:
        code = header[k][1]
        if code == "BF16":
            raise ValueError(f"{weights}: key {k!r} holds BF16, which numpy (and so this loader) cannot read; "
                             "save the weights as F32 (e.g. `model.float().save_pretrained(...)`)")
        if code not in _FLOAT_BYTES:
            raise ValueError(f"{weights}: key {k!r} holds {code}; weights must be floats (F16, F32 or F64)")
        if _FLOAT_BYTES[code] > smallest:
            raise ValueError(f"{weights}: key {k!r} holds {code}, which does not load exactly as "
                             f"{min(dtypes, key=lambda d: np.dtype(d).itemsize)}; run with --dtype float64")
    return weights.stat().st_size


def load_hf_checkpoint(path, dtype: str = "float32") -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Read a local Hugging Face checkpoint directory into ``(config, canonical params)``.

    Args:
        path: directory holding ``config.json`` and ``model.safetensors``.
        dtype: ``float32`` or ``float64``; weights are cast exactly (upcasts only).

    Returns:
        ``(cfg, params)``: the config (its ``dropout`` is the checkpoint's rate) and the canonical
        dict of numpy arrays (:func:`jaxremat.models.param_shapes`).

    Raises:
        ValueError: the directory or a file is missing, only a pickle checkpoint is present,
            ``config.json`` is unsupported, or the weights do not match it (see
            :func:`check_weights_file` and :func:`hf_to_canonical`).

    Source: the ``safetensors`` format (https://huggingface.co/docs/safetensors); key names of
    Hugging Face ``BertModel`` / ``GPT2Model``.
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint directory {path} does not exist (or is not a directory)")
    cfg = read_config(path, dtype=dtype)
    check_weights_file(path, cfg, (dtype,))
    weights = _weights_path(path)
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(weights))
    except Exception as exc:  # the header was valid; the data is not (or the file changed)
        raise ValueError(f"{weights} cannot be read: {_first_line(exc)}") from None
    return cfg, hf_to_canonical(cfg, tensors)
