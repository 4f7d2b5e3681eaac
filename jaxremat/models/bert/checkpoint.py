"""Hugging Face ``BertModel`` checkpoints <-> the encoder layout (the adapter protocol of :mod:`jaxremat.models.hf`).

``nn.Linear`` stores matrices ``(out, in)``: they are transposed, and the separate query, key and
value projections are concatenated on the output axis into ``h.attn.c_attn``
(:mod:`jaxremat.models.bert.layout` gives the meaning of each canonical entry).
"""

from __future__ import annotations

import re

import numpy as np

from ..config import TransformerConfig
from ..hf import one_rate
from ..params import param_shapes

PREFIX = "bert."
LAYER_KEY = re.compile(r"encoder\.layer\.(\d+)\.")
IGNORED_KEYS = (
    (r"embeddings\.position_ids", "a buffer holding arange(max_position_embeddings), not a parameter"),
    (r"pooler\.dense\.(weight|bias)", "the [CLS] pooler head; sentence embeddings here are mean-pooled"),
    (r"cls\..*", "pre-training heads (masked LM / next sentence), not part of the encoder"),
)

_EMBED = {"wte": "embeddings.word_embeddings.weight", "wpe": "embeddings.position_embeddings.weight",
          "wtt": "embeddings.token_type_embeddings.weight", "ln_e.weight": "embeddings.LayerNorm.weight",
          "ln_e.bias": "embeddings.LayerNorm.bias"}


def _layer_keys(i: int) -> dict[str, str]:
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


def config_from_hf(hf: dict, dtype: str) -> TransformerConfig:
    """The config of a ``model_type: "bert"`` ``config.json`` (erf GELU, absolute positions only)."""
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"config.json: hidden_act {hf['hidden_act']!r} is not supported; the encoder uses 'gelu' (erf)")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"config.json: position_embedding_type {hf['position_embedding_type']!r} is not "
                         "supported; only 'absolute'")
    return TransformerConfig(
        arch="bert", vocab_size=hf["vocab_size"], n_layer=hf["num_hidden_layers"], d_model=hf["hidden_size"],
        n_head=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
        max_seq_len=hf["max_position_embeddings"], layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        dropout=one_rate(hf, ("hidden_dropout_prob", "attention_probs_dropout_prob"), "dropout"),
        type_vocab_size=hf.get("type_vocab_size", 2), pad_token_id=hf.get("pad_token_id", 0) or 0, dtype=dtype,
    )


def hf_config(cfg: TransformerConfig) -> dict:
    """A minimal ``config.json`` dict describing ``cfg``."""
    return {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
            "intermediate_size": cfg.d_ff, "hidden_act": "gelu", "max_position_embeddings": cfg.max_seq_len,
            "type_vocab_size": cfg.type_vocab_size, "layer_norm_eps": cfg.layer_norm_eps,
            "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout,
            "pad_token_id": cfg.pad_token_id, "position_embedding_type": "absolute"}


def hf_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every parameter of a ``BertModel`` checkpoint of ``cfg`` (no prefix)."""
    D, F = cfg.d_model, cfg.d_ff
    canon = param_shapes(cfg)
    out = {hf: canon[c] for c, hf in _EMBED.items()}
    lin = {"q": (D, D), "k": (D, D), "v": (D, D), "h.attn.c_proj": (D, D), "h.mlp.c_fc": (F, D), "h.mlp.c_proj": (D, F)}
    for i in range(cfg.n_layer):
        for c, hf in _layer_keys(i).items():
            base, leaf = c.rsplit(".", 1)
            if base in lin:  # nn.Linear: weight (out, in), bias (out,)
                out[hf] = lin[base] if leaf == "weight" else (lin[base][0],)
            else:
                out[hf] = (D,)
    return out


def to_canonical(cfg: TransformerConfig, t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical arrays from checked checkpoint keys (transposes and the q/k/v concatenation)."""
    out = {c: t[hf] for c, hf in _EMBED.items()}
    layers = [{c: t[hf] for c, hf in _layer_keys(i).items()} for i in range(cfg.n_layer)]
    for c in _layer_keys(0):
        if c.startswith("h."):
            out[c] = np.stack([lay[c].T if c.endswith("weight") and lay[c].ndim == 2 else lay[c] for lay in layers])
    out["h.attn.c_attn.weight"] = np.stack([np.concatenate([lay[n].T for n in ("q.weight", "k.weight", "v.weight")],
                                                           axis=1) for lay in layers])
    out["h.attn.c_attn.bias"] = np.stack([np.concatenate([lay[n] for n in ("q.bias", "k.bias", "v.bias")])
                                          for lay in layers])
    return out


def from_canonical(cfg: TransformerConfig, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Checkpoint keys (no prefix) -> arrays, the inverse of :func:`to_canonical`."""
    D = cfg.d_model
    out = {hf: params[c] for c, hf in _EMBED.items()}
    for i in range(cfg.n_layer):
        keys = _layer_keys(i)
        w, b = params["h.attn.c_attn.weight"][i], params["h.attn.c_attn.bias"][i]
        for j, n in enumerate("qkv"):
            out[keys[f"{n}.weight"]] = w[:, j * D:(j + 1) * D].T
            out[keys[f"{n}.bias"]] = b[j * D:(j + 1) * D]
        for c, hf in keys.items():
            if c.startswith("h."):
                a = params[c][i]
                out[hf] = a.T if a.ndim == 2 else a
    return out
