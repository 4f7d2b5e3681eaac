"""Hugging Face ``GPT2Model`` checkpoints <-> the GPT layout (the adapter protocol of :mod:`jaxremat.models.hf`).

GPT-2's ``Conv1D`` stores matrices ``(in, out)`` as the canonical layout does, so conversion is
stacking the per-layer keys ``h.{i}.*`` on a leading layer axis, and back.
"""

from __future__ import annotations

import re

import numpy as np

from ..config import TransformerConfig
from ..hf import one_rate
from ..params import param_shapes

PREFIX = "transformer."
LAYER_KEY = re.compile(r"h\.(\d+)\.")
IGNORED_KEYS = (
    (r"h\.\d+\.attn\.(bias|masked_bias)", "causal-mask buffers of old GPT-2 exports, not parameters"),
    (r"lm_head\.weight", "the output head, tied to wte (checked equal)"),
)


def config_from_hf(hf: dict, dtype: str) -> TransformerConfig:
    """The config of a ``model_type: "gpt2"`` ``config.json`` (tanh GELU only)."""
    act = hf.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"config.json: activation_function {act!r} is not supported; the GPT block uses the "
                         "tanh GELU ('gelu_new')")
    d = hf["n_embd"]
    return TransformerConfig(
        arch="gpt", vocab_size=hf["vocab_size"], n_layer=hf["n_layer"], d_model=d, n_head=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d, max_seq_len=hf["n_positions"],
        layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        dropout=one_rate(hf, ("resid_pdrop", "embd_pdrop", "attn_pdrop"), "dropout"), dtype=dtype,
    )


def hf_config(cfg: TransformerConfig) -> dict:
    """A minimal ``config.json`` dict describing ``cfg``."""
    return {"model_type": "gpt2", "architectures": ["GPT2Model"], "vocab_size": cfg.vocab_size, "n_embd": cfg.d_model,
            "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.d_ff, "n_positions": cfg.max_seq_len,
            "layer_norm_epsilon": cfg.layer_norm_eps, "activation_function": "gelu_new",
            "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout}


def hf_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every parameter of a ``GPT2Model`` checkpoint of ``cfg`` (no prefix)."""
    D = cfg.d_model
    canon = param_shapes(cfg)
    out = {"wte.weight": canon["wte"], "wpe.weight": canon["wpe"]}
    for i in range(cfg.n_layer):
        out.update({f"h.{i}.{k[2:]}": s[1:] for k, s in canon.items() if k.startswith("h.")})
    out.update({"ln_f.weight": (D,), "ln_f.bias": (D,)})
    return out


def to_canonical(cfg: TransformerConfig, t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical arrays from checked checkpoint keys.

    Raises:
        ValueError: ``lm_head.weight`` differs from ``wte.weight`` (untied heads are not modelled).
    """
    if "lm_head.weight" in t and not np.array_equal(t["lm_head.weight"], t["wte.weight"]):
        raise ValueError("checkpoint key 'lm_head.weight' differs from 'wte.weight'; only tied output heads are supported")
    out = {"wte": t["wte.weight"], "wpe": t["wpe.weight"], "ln_f.weight": t["ln_f.weight"], "ln_f.bias": t["ln_f.bias"]}
    for k in param_shapes(cfg):
        if k.startswith("h."):
            out[k] = np.stack([t[f"h.{i}.{k[2:]}"] for i in range(cfg.n_layer)])  # Conv1D is (in, out) already
    return out


def from_canonical(cfg: TransformerConfig, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Checkpoint keys (no prefix) -> arrays, the inverse of :func:`to_canonical`."""
    out = {"wte.weight": params["wte"], "wpe.weight": params["wpe"],
           "ln_f.weight": params["ln_f.weight"], "ln_f.bias": params["ln_f.bias"]}
    for k in params:
        if k.startswith("h."):
            out.update({f"h.{i}.{k[2:]}": params[k][i] for i in range(cfg.n_layer)})
    return out
