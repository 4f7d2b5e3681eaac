"""Real checkpoints: a local Hugging Face-format directory (config.json + model.safetensors) in and out.

Two architectures are understood, BERT (``model_type: "bert"``, Hugging Face ``BertModel`` keys,
optionally under a ``bert.`` prefix) and GPT-2 (``model_type: "gpt2"``, ``GPT2Model`` keys,
optionally under ``transformer.``). Weights are read with ``safetensors`` only, never with pickle:
a directory holding only ``pytorch_model.bin`` is refused with a message saying how to convert it.

Every key of the file must map onto the canonical layout (:func:`jaxremat.spec.param_shapes`) and
every canonical entry must be found: a missing or unexpected key, or a shape that differs from the
one ``config.json`` implies, is a ValueError naming the key and both shapes. A short list of keys
that hold no parameter of the model is dropped on purpose, each with its reason
(:data:`IGNORED_KEYS`). Conversion is exact: transposes, concatenation and upcasts only.

:func:`check_weights_file` checks ``model.safetensors`` against ``config.json`` from its header
alone (no tensor is read): a file that is empty, truncated, corrupt or pickle bytes under that
name, a layer count that differs from ``n_layer``, missing or unexpected keys, other shapes, and
dtypes that do not load exactly are each one ValueError naming the file, before any work starts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from jaxremat.spec import TransformerConfig, param_shapes

ARCHITECTURES = ("bert", "gpt2")

IGNORED_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "bert": (
        (r"embeddings\.position_ids", "a buffer holding arange(max_position_embeddings), not a parameter"),
        (r"pooler\.dense\.(weight|bias)", "the [CLS] pooler head; sentence embeddings here are mean-pooled"),
        (r"cls\..*", "pre-training heads (masked LM / next sentence), not part of the encoder"),
    ),
    "gpt2": (
        (r"h\.\d+\.attn\.(bias|masked_bias)", "causal-mask buffers of old GPT-2 exports, not parameters"),
        (r"lm_head\.weight", "the output head, tied to wte (checked equal)"),
    ),
}
"""Per architecture: (regex, reason) of checkpoint keys that are not model parameters."""

_PREFIXES = {"bert": "bert.", "gpt2": "transformer."}
_LAYER_KEY = {"bert": re.compile(r"encoder\.layer\.(\d+)\."), "gpt2": re.compile(r"h\.(\d+)\.")}
_FLOAT_BYTES = {"F16": 2, "F32": 4, "F64": 8}
"""safetensors dtype codes numpy reads as floats, with their sizes (BF16 has no numpy dtype)."""
_SHOWN = 5
"""Keys listed in one message at most (a config with the wrong depth would list thousands)."""


def _listed(items: list[str]) -> list[str]:
    return items[:_SHOWN] + ([f"and {len(items) - _SHOWN} more"] if len(items) > _SHOWN else [])


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(f"{path} not found: a Hugging Face checkpoint directory needs config.json") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None


def _same(hf: dict, names: tuple[str, ...], what: str) -> float:
    values = {n: hf[n] for n in names if n in hf}
    if len(set(values.values())) > 1:
        raise ValueError(f"config.json: {what} rates differ ({values}); this model has one dropout rate")
    return float(next(iter(values.values()), 0.0))


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
    try:
        return _config_from_hf(hf, dtype)
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


def _config_from_hf(hf: dict, dtype: str) -> TransformerConfig:
    kind = hf.get("model_type")
    if kind == "bert":
        if hf.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"config.json: hidden_act {hf['hidden_act']!r} is not supported; the encoder uses 'gelu' (erf)")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"config.json: position_embedding_type {hf['position_embedding_type']!r} is not "
                             "supported; only 'absolute'")
        return TransformerConfig(
            arch="bert", vocab_size=hf["vocab_size"], n_layer=hf["num_hidden_layers"], d_model=hf["hidden_size"],
            n_head=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
            max_seq_len=hf["max_position_embeddings"], layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            dropout=_same(hf, ("hidden_dropout_prob", "attention_probs_dropout_prob"), "dropout"),
            type_vocab_size=hf.get("type_vocab_size", 2), pad_token_id=hf.get("pad_token_id", 0) or 0, dtype=dtype,
        )
    if kind == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"config.json: activation_function {act!r} is not supported; the GPT block uses the "
                             "tanh GELU ('gelu_new')")
        d = hf["n_embd"]
        return TransformerConfig(
            arch="gpt", vocab_size=hf["vocab_size"], n_layer=hf["n_layer"], d_model=d, n_head=hf["n_head"],
            d_ff=hf.get("n_inner") or 4 * d, max_seq_len=hf["n_positions"],
            layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            dropout=_same(hf, ("resid_pdrop", "embd_pdrop", "attn_pdrop"), "dropout"), dtype=dtype,
        )
    raise ValueError(f"config.json: model_type {kind!r} is not supported; supported: {', '.join(ARCHITECTURES)}")


def _bert_layer_keys(i: int) -> dict[str, str]:
    p = f"encoder.layer.{i}."
    return {
        "q.weight": p + "attention.self.query.weight", "q.bias": p + "attention.self.query.bias",
        "k.weight": p + "attention.self.key.weight", "k.bias": p + "attention.self.key.bias",
        "v.weight": p + "attention.self.value.weight", "v.bias": p + "attention.self.value.bias",
        "h.attn.c_proj.weight": p + "attention.output.dense.weight",
        "h.attn.c_proj.bias": p + "attention.output.dense.bias",
        "h.ln_1.weight": p + "attention.output.LayerNorm.weight", "h.ln_1.bias": p + "attention.output.LayerNorm.bias",
        "h.mlp.c_fc.weight": p + "intermediate.dense.weight", "h.mlp.c_fc.bias": p + "intermediate.dense.bias",
        "h.mlp.c_proj.weight": p + "output.dense.weight", "h.mlp.c_proj.bias": p + "output.dense.bias",
        "h.ln_2.weight": p + "output.LayerNorm.weight", "h.ln_2.bias": p + "output.LayerNorm.bias",
    }


_BERT_EMBED = {"wte": "embeddings.word_embeddings.weight", "wpe": "embeddings.position_embeddings.weight",
               "wtt": "embeddings.token_type_embeddings.weight", "ln_e.weight": "embeddings.LayerNorm.weight",
               "ln_e.bias": "embeddings.LayerNorm.bias"}


def hf_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every parameter a Hugging Face checkpoint of ``cfg`` holds (no prefix)."""
    D, F = cfg.d_model, cfg.d_ff
    canon = param_shapes(cfg)
    if cfg.arch == "gpt":
        out = {"wte.weight": canon["wte"], "wpe.weight": canon["wpe"]}
        for i in range(cfg.n_layer):
            out.update({f"h.{i}.{k[2:]}": s[1:] for k, s in canon.items() if k.startswith("h.")})
        out.update({"ln_f.weight": (D,), "ln_f.bias": (D,)})
        return out
    out = {hf: canon[c] for c, hf in _BERT_EMBED.items()}
    lin = {"q": (D, D), "k": (D, D), "v": (D, D), "h.attn.c_proj": (D, D), "h.mlp.c_fc": (F, D), "h.mlp.c_proj": (D, F)}
    for i in range(cfg.n_layer):
        for c, hf in _bert_layer_keys(i).items():
            base, leaf = c.rsplit(".", 1)
            if base in lin:  # nn.Linear: weight (out, in), bias (out,)
                out[hf] = lin[base] if leaf == "weight" else (lin[base][0],)
            else:
                out[hf] = (D,)
    return out


def _ignored(arch: str, key: str) -> bool:
    return any(re.fullmatch(pattern, key) for pattern, _ in IGNORED_KEYS[arch])


def hf_to_canonical(cfg: TransformerConfig, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Map Hugging Face tensors onto the canonical layout of ``cfg`` (exact; cast to ``cfg.dtype``).

    Args:
        cfg: the model configuration (from :func:`config_from_hf`).
        tensors: key -> array as stored in ``model.safetensors``.

    Returns:
        canonical dict (:func:`jaxremat.spec.param_shapes`), C-contiguous arrays in ``cfg.dtype``.

    Raises:
        ValueError: a missing or unexpected key, or a shape mismatch (the message names the key,
            the checkpoint's shape and the shape ``config.json`` implies); GPT-2's ``lm_head.weight``
            differing from ``wte`` (untied heads are not modelled).
    """
    hf_arch = "gpt2" if cfg.arch == "gpt" else "bert"
    prefix = _PREFIXES[hf_arch]
    t = {k[len(prefix):] if k.startswith(prefix) else k: np.asarray(v) for k, v in tensors.items()}
    expected = hf_shapes(cfg)
    missing = [k for k in expected if k not in t]
    unexpected = [k for k in t if k not in expected and not _ignored(hf_arch, k)]
    if missing or unexpected:
        raise ValueError(
            "checkpoint keys do not match the model of config.json: "
            + "; ".join(_listed([f"missing key {k!r} (expected shape {expected[k]})" for k in missing])
                        + _listed([f"unexpected key {k!r} (shape {t[k].shape})" for k in unexpected]))
        )
    for k, shape in expected.items():
        if t[k].shape != shape:
            raise ValueError(f"checkpoint key {k!r}: shape {t[k].shape} in the checkpoint, expected {shape} from config.json")
    if "lm_head.weight" in t and not np.array_equal(t["lm_head.weight"], t["wte.weight"]):
        raise ValueError("checkpoint key 'lm_head.weight' differs from 'wte.weight'; only tied output heads are supported")
    dt = np.dtype(cfg.dtype)
    if cfg.arch == "gpt":
        out = {"wte": t["wte.weight"], "wpe": t["wpe.weight"], "ln_f.weight": t["ln_f.weight"], "ln_f.bias": t["ln_f.bias"]}
        for k in param_shapes(cfg):
            if k.startswith("h."):
                out[k] = np.stack([t[f"h.{i}.{k[2:]}"] for i in range(cfg.n_layer)])  # Conv1D is (in, out) already
    else:
        out = {c: t[hf] for c, hf in _BERT_EMBED.items()}
        layers = [{c: t[hf] for c, hf in _bert_layer_keys(i).items()} for i in range(cfg.n_layer)]
        for c in _bert_layer_keys(0):
            if c.startswith("h."):
                out[c] = np.stack([lay[c].T if c.endswith("weight") and lay[c].ndim == 2 else lay[c] for lay in layers])
        out["h.attn.c_attn.weight"] = np.stack([np.concatenate([lay[n].T for n in ("q.weight", "k.weight", "v.weight")],
                                                               axis=1) for lay in layers])
        out["h.attn.c_attn.bias"] = np.stack([np.concatenate([lay[n] for n in ("q.bias", "k.bias", "v.bias")])
                                              for lay in layers])
    for k, v in out.items():
        if v.dtype.kind != "f" or v.dtype.itemsize > dt.itemsize:
            raise ValueError(f"checkpoint key for {k!r} holds {v.dtype}; only float arrays up to {dt} load exactly")
    return {k: np.ascontiguousarray(out[k].astype(dt)) for k in param_shapes(cfg)}


def canonical_to_hf(cfg: TransformerConfig, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of :func:`hf_to_canonical`: Hugging Face keys (no prefix) -> C-contiguous arrays."""
    if cfg.arch == "gpt":
        out = {"wte.weight": params["wte"], "wpe.weight": params["wpe"],
               "ln_f.weight": params["ln_f.weight"], "ln_f.bias": params["ln_f.bias"]}
        for k in params:
            if k.startswith("h."):
                out.update({f"h.{i}.{k[2:]}": params[k][i] for i in range(cfg.n_layer)})
    else:
        D = cfg.d_model
        out = {hf: params[c] for c, hf in _BERT_EMBED.items()}
        for i in range(cfg.n_layer):
            keys = _bert_layer_keys(i)
            w, b = params["h.attn.c_attn.weight"][i], params["h.attn.c_attn.bias"][i]
            for j, n in enumerate("qkv"):
                out[keys[f"{n}.weight"]] = w[:, j * D:(j + 1) * D].T
                out[keys[f"{n}.bias"]] = b[j * D:(j + 1) * D]
            for c, hf in keys.items():
                if c.startswith("h."):
                    a = params[c][i]
                    out[hf] = a.T if a.ndim == 2 else a
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def hf_config_dict(cfg: TransformerConfig) -> dict:
    """A minimal Hugging Face ``config.json`` dict describing ``cfg`` (BERT or GPT-2)."""
    if cfg.arch == "bert":
        return {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": cfg.vocab_size,
                "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
                "intermediate_size": cfg.d_ff, "hidden_act": "gelu", "max_position_embeddings": cfg.max_seq_len,
                "type_vocab_size": cfg.type_vocab_size, "layer_norm_eps": cfg.layer_norm_eps,
                "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout,
                "pad_token_id": cfg.pad_token_id, "position_embedding_type": "absolute"}
    return {"model_type": "gpt2", "architectures": ["GPT2Model"], "vocab_size": cfg.vocab_size, "n_embd": cfg.d_model,
            "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.d_ff, "n_positions": cfg.max_seq_len,
            "layer_norm_epsilon": cfg.layer_norm_eps, "activation_function": "gelu_new",
            "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout}


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
    """``{key: (shape, safetensors dtype code)}`` from the file's header; no tensor is read."""
    with open(weights, "rb") as fh:
        head = fh.read(4)
    if head[:1] == b"\x80" or head == b"PK\x03\x04":
        kind = "pickle" if head[:1] == b"\x80" else "zip (torch.save)"
        raise ValueError(f"{weights} holds {kind} bytes, not "
                         "safetensors; pickle is never loaded: convert it with `save_pretrained(..., "
                         "safe_serialization=True)`")
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="numpy") as fh:
            return {k: (tuple(fh.get_slice(k).get_shape()), fh.get_slice(k).get_dtype()) for k in fh.keys()}
    except Exception as exc:  # safetensors raises its own SafetensorError (an Exception)
        raise ValueError(f"{weights} is not a valid safetensors file ({_first_line(exc)}); "
                         "it is empty, truncated or corrupt: save or download it again") from None


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
    hf_arch = "gpt2" if cfg.arch == "gpt" else "bert"
    prefix = _PREFIXES[hf_arch]
    header = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in _header(weights).items()}
    layers = {int(m.group(1)) for k in header if (m := _LAYER_KEY[hf_arch].match(k))}
    if len(layers) != cfg.n_layer or (layers and (min(layers), max(layers)) != (0, cfg.n_layer - 1)):  # not O(n_layer)
        held = f"layers {min(layers)}..{max(layers)} ({len(layers)} in all)" if layers else "no layers"
        raise ValueError(f"{path / 'config.json'} says {cfg.n_layer} layers but {weights} holds {held}; "
                         "the two files do not belong together")
    expected = hf_shapes(cfg)
    missing = [k for k in expected if k not in header]
    unexpected = [k for k in header if k not in expected and not _ignored(hf_arch, k)]
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
        dict of numpy arrays (:func:`jaxremat.spec.param_shapes`).

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
