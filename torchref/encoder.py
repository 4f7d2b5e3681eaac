"""The BERT-style post-LayerNorm encoder in PyTorch, the reference for ``jaxremat.encoder``.

Single-device model code only: schedules are applied from outside by
:func:`torchref.render.forward_blocks`, which runs the blocks bound to the batch's padding mask
(:meth:`Encoder.bound_blocks`). Parameters live in the canonical layout of
:func:`jaxremat.models.bert.layout.encoder_param_shapes` (matrices ``(in, out)``), so conversion is
a copy with no transpose.

Every named activation (:data:`jaxremat.spec.names.ACTIVATION_NAMES`) is produced by exactly one
op inside ``with torchref.names.activation(name):``: projections are one ``torch.addmm`` on a
``(B*T, .)`` view, the attention core one ``torch.matmul`` on contiguous per-head tensors,
``attn_norm``/``mlp_norm`` the ``F.layer_norm`` after each residual add.

Shape letters: B batch, T sequence length, D ``d_model``, H ``n_head``, hd ``head_dim``, F ``d_ff``,
V ``vocab_size``, N ``n_layer``. Source: Devlin et al. 2019, arXiv:1810.04805; Hugging Face
``transformers`` ``modeling_bert.py`` (the peer this module is tested against).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from jaxremat.spec import Schedule, none
from jaxremat.models import TransformerConfig, check_params, param_shapes

from .model import holds_values, torch_dtype
from .names import activation
from .render import CheckpointInputHook, forward_blocks

CONTRASTIVE_SCALE = 20.0


def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout`` when it can change anything; the identity (no RNG draw) otherwise."""
    return F.dropout(x, p, training=True) if (training and p > 0.0) else x


class Projection(nn.Module):
    """``x @ weight + bias`` as one ``torch.addmm``; ``weight`` is ``(in, out)`` (canonical layout)."""

    def __init__(self, n_in: int, n_out: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_in, n_out, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(n_out, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., in) -> (..., out)``."""
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class _Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig, dtype: torch.dtype):
        super().__init__()
        self.c_attn = Projection(cfg.d_model, 3 * cfg.d_model, dtype)
        self.c_proj = Projection(cfg.d_model, cfg.d_model, dtype)


class _MLP(nn.Module):
    def __init__(self, cfg: TransformerConfig, dtype: torch.dtype):
        super().__init__()
        self.c_fc = Projection(cfg.d_model, cfg.d_ff, dtype)
        self.c_proj = Projection(cfg.d_ff, cfg.d_model, dtype)


class EncoderBlock(nn.Module):
    """One post-LayerNorm BERT block: ``x = ln_1(x + attn(x))`` then ``x = ln_2(x + mlp(x))``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        dtype = torch_dtype(cfg)
        self.cfg = cfg
        self.attn = _Attention(cfg, dtype)
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, dtype=dtype)
        self.mlp = _MLP(cfg, dtype)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, dtype=dtype)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)`` residual stream and ``(B, T)`` bool key mask (False = padding) -> ``(B, T, D)``."""
        cfg, p, training = self.cfg, self.cfg.dropout, self.training
        B, T, D = x.shape
        H, hd = cfg.n_head, cfg.head_dim
        with activation("qkv_proj"):
            qkv = self.attn.c_attn(x)  # (B, T, 3D)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2).contiguous() for t in qkv.split(D, dim=-1))  # (B, H, T, hd)
        with activation("attn_scores"):
            scores = torch.matmul(q, k.transpose(-2, -1))  # (B, H, T, T)
        scores = (scores * (1.0 / math.sqrt(hd))).masked_fill(~key_mask[:, None, None, :], float("-inf"))
        with activation("attn_probs"):
            probs = torch.softmax(scores, dim=-1)
        probs = _dropout(probs, p, training)
        with activation("attn_out"):
            ctx = torch.matmul(probs, v)  # (B, H, T, hd)
        y = ctx.transpose(1, 2).reshape(B, T, D)
        with activation("out_proj"):
            o = self.attn.c_proj(y)
        h = x + _dropout(o, p, training)
        with activation("attn_norm"):
            x = self.ln_1(h)
        with activation("mlp_hidden"):
            m = self.mlp.c_fc(x)  # (B, T, F)
        with activation("mlp_act"):
            m = F.gelu(m)  # exact erf GELU
        with activation("mlp_out"):
            m = self.mlp.c_proj(m)
        h = x + _dropout(m, p, training)
        with activation("mlp_norm"):
            return self.ln_2(h)


class Encoder(nn.Module):
    """BERT-style encoder: embeddings with their LayerNorm, then N post-LN blocks.

    ``forward(idx)`` gives the last hidden state with the blocks run under a schedule (default
    ``none``). Parameters are created in ``cfg.dtype`` (zeros; load weights with
    :meth:`from_params`).

    Args:
        cfg: configuration with ``arch="bert"``.

    Raises:
        ValueError: ``cfg.arch`` is not ``"bert"``.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        if cfg.arch != "bert":
            raise ValueError(f"Encoder needs TransformerConfig(arch='bert'), got arch={cfg.arch!r}")
        dtype = torch_dtype(cfg)
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model, dtype=dtype)  # (V, D)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.d_model, dtype=dtype)  # (T_max, D)
        self.wtt = nn.Embedding(cfg.type_vocab_size, cfg.d_model, dtype=dtype)  # (types, D)
        self.ln_e = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, dtype=dtype)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layer))

    def check_inputs(self, idx: torch.Tensor) -> None:
        """Raise ValueError unless ``idx`` is ``(B, T)`` integer ids in ``[0, V)`` with ``1 <= T <= max_seq_len``."""
        cfg = self.cfg
        if idx.dim() != 2:
            raise ValueError(f"token ids must have shape (B, T), got shape {tuple(idx.shape)}")
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise ValueError(f"token ids must be an integer tensor, got {idx.dtype}")
        if not 1 <= idx.shape[1] <= cfg.max_seq_len:
            raise ValueError(f"sequence length must be in [1, max_seq_len={cfg.max_seq_len}], got {idx.shape[1]}")
        if idx.numel() and holds_values(idx) and (int(idx.min()) < 0 or int(idx.max()) >= cfg.vocab_size):
            raise ValueError(f"token ids must lie in [0, vocab_size={cfg.vocab_size}), got min {int(idx.min())} "
                             f"max {int(idx.max())}")

    def padding_mask(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx != pad_token_id``: ``(B, T)`` bool, True on real tokens."""
        return idx != self.cfg.pad_token_id

    def embed(self, idx: torch.Tensor, token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``dropout(ln_e((wte[idx] + wtt[types]) + wpe[:T]))``: ``(B, T)`` ids -> ``(B, T, D)``.

        Raises:
            ValueError: see :meth:`check_inputs`.
        """
        self.check_inputs(idx)
        idx = idx.long()
        types = self.wtt.weight[0] if token_type_ids is None else self.wtt(token_type_ids.long())
        x = self.wte(idx) + types + self.wpe.weight[: idx.shape[1]]
        return _dropout(self.ln_e(x), self.cfg.dropout, self.training)

    def bound_blocks(self, key_mask: torch.Tensor) -> list:
        """The N blocks as one-argument callables ``x -> block(x, key_mask)`` for ``forward_blocks``."""
        return [functools.partial(block, key_mask=key_mask) for block in self.blocks]

    def forward(self, idx: torch.Tensor, schedule: Schedule = none, *, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, policy=None,
                on_checkpoint_input: Optional[CheckpointInputHook] = None) -> torch.Tensor:
        """Last hidden state ``(B, T, D)`` of ``(B, T)`` ids, the blocks run under ``schedule``.

        Args:
            idx: ``(B, T)`` integer token ids.
            schedule: remat schedule of the blocks.
            attention_mask: optional ``(B, T)``, nonzero on real tokens; ``idx != pad_token_id`` if None.
            token_type_ids: optional ``(B, T)`` token types; zeros if None.
            policy: what checkpointed segments keep inside (see :func:`torchref.render.forward_blocks`).
            on_checkpoint_input: see :func:`torchref.render.forward_blocks`.

        Raises:
            ValueError: bad ids (see :meth:`check_inputs`) or a schedule invalid for ``n_layer``.
        """
        x = self.embed(idx, token_type_ids)
        mask = self.padding_mask(idx) if attention_mask is None else attention_mask.bool()
        return forward_blocks(self.bound_blocks(mask), x, schedule, policy=policy,
                              on_checkpoint_input=on_checkpoint_input)

    # ----------------------------------------------------------------- canonical layout
    def _canonical_tensors(self, key: str) -> list[nn.Parameter]:
        """Parameters behind a canonical key (one per layer for ``h.*``)."""
        if not key.startswith("h."):
            owner, _, leaf = key.partition(".")
            return [getattr(getattr(self, owner), leaf or "weight")]
        path = key.split(".")[1:]
        out = []
        for block in self.blocks:
            owner = block
            for name in path[:-1]:
                owner = getattr(owner, name)
            out.append(getattr(owner, path[-1]))
        return out

    @classmethod
    def from_params(cls, cfg: TransformerConfig, params: dict[str, np.ndarray]) -> "Encoder":
        """A model (training mode) holding exact copies of canonical parameters.

        Raises:
            ValueError: a key is missing/unexpected or mis-shaped, or a dtype is not ``cfg.dtype``.
        """
        check_params(cfg, params)
        for key, arr in params.items():
            if np.asarray(arr).dtype != np.dtype(cfg.dtype):
                raise ValueError(f"parameter {key!r}: expected dtype {cfg.dtype}, got {np.asarray(arr).dtype}")
        model = cls(cfg)
        with torch.no_grad():
            for key in param_shapes(cfg):
                tensors = model._canonical_tensors(key)
                arr = np.asarray(params[key])
                for t, a in zip(tensors, list(arr) if key.startswith("h.") else [arr], strict=True):
                    t.copy_(torch.from_numpy(np.array(a, order="C", copy=True)))
        return model

    def to_params(self, *, grads: bool = False) -> dict[str, np.ndarray]:
        """Parameters (or their ``.grad``) as exact numpy copies in the canonical layout.

        Raises:
            ValueError: ``grads=True`` and a parameter has no gradient (run a backward first).
        """
        out: dict[str, np.ndarray] = {}
        for key in param_shapes(self.cfg):
            arrays = []
            for t in self._canonical_tensors(key):
                value = t.grad if grads else t
                if value is None:
                    raise ValueError(f"parameter {key!r} has no gradient; run a backward pass first")
                arrays.append(value.detach().cpu().numpy())
            out[key] = np.array(np.stack(arrays) if key.startswith("h.") else arrays[0], copy=True, order="C")
        return out


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` ``(B, T, D)`` over positions where ``mask`` ``(B, T)`` is True -> ``(B, D)``."""
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


def contrastive_loss(embeddings: torch.Tensor, scale: float = CONTRASTIVE_SCALE) -> torch.Tensor:
    """In-batch contrastive loss over pairs ``(embeddings[2i], embeddings[2i+1])`` (see ``jaxremat.encoder``).

    Raises:
        ValueError: the batch size is odd or < 2.
    """
    B = embeddings.shape[0]
    if B < 2 or B % 2:
        raise ValueError(f"the contrastive batch holds pairs: batch size must be even and >= 2, got {B}")
    e = embeddings / embeddings.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    logits = scale * (e[0::2] @ e[1::2].t())  # (B/2, B/2)
    return F.cross_entropy(logits, torch.arange(B // 2))


def encoder_loss(model: Encoder, tokens: torch.Tensor, schedule: Schedule, *, policy=None,
                 on_checkpoint_input: Optional[CheckpointInputHook] = None) -> torch.Tensor:
    """Contrastive sentence-embedding loss of a ``(B, T)`` padded batch of pairs (rows 2i, 2i+1).

    The counterpart of :func:`jaxremat.encoder.loss_fn` and of :func:`torchref.render.model_loss`.

    Returns:
        0-d loss in the model dtype, attached to the autograd graph.

    Raises:
        ValueError: bad ids, an odd batch, or a schedule invalid for ``n_layer``.
    """
    if tokens.dim() == 2 and (tokens.shape[0] < 2 or tokens.shape[0] % 2):
        raise ValueError(f"the contrastive batch holds pairs: batch size must be even and >= 2, got {tokens.shape[0]}")
    mask = model.padding_mask(tokens)
    hidden = model(tokens, schedule, policy=policy, on_checkpoint_input=on_checkpoint_input)
    return contrastive_loss(mean_pool(hidden, mask))
