"""The GPT-2-style transformer in PyTorch, the reference for ``jaxremat.model``.

Single-device model code only: no remat schedule lives here. Schedules are applied from outside
by :mod:`torchref.render`, which runs ``GPT.embed`` -> the blocks of ``GPT.blocks`` -> ``GPT.head``.

Layout and names follow karpathy/nanoGPT ``model.py`` (GPT-2 names: ``wte``, ``wpe``, ``ln_1``,
``attn.c_attn``, ``attn.c_proj``, ``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``, ``ln_f``). Attention is
written out op by op by default (no ``scaled_dot_product_attention``) so that every op has a
counterpart in the JAX model and the same tensors are saved for the backward pass on both sides;
``TransformerConfig(attention="fused")`` runs it as one
``torch.nn.functional.scaled_dot_product_attention`` call instead (``jax.nn.dot_product_attention``
in JAX), inside the ``attn_out`` region.

Shape letters: B batch, T sequence length, D ``d_model``, H ``n_head``, hd ``head_dim``,
F ``d_ff``, V ``vocab_size``, N ``n_layer``.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

from jaxremat.models import TransformerConfig, check_params, param_shapes

from .names import activation


def torch_dtype(cfg: TransformerConfig) -> torch.dtype:
    """The torch dtype of ``cfg.dtype`` (``torch.float32`` or ``torch.float64``)."""
    return getattr(torch, cfg.dtype)


def compute_context(cfg: TransformerConfig):
    """The precision context of a forward pass: ``torch.autocast("cpu", dtype=torch.bfloat16)``
    when ``cfg.compute_dtype == "bfloat16"``, else a no-op context.

    Under CPU autocast the matmuls (``addmm``, ``bmm``, ``matmul``) run in bfloat16 and ops fed
    bfloat16 tensors (softmax, GELU, LayerNorm of a bfloat16 input) stay in it; float32
    parameters stay float32 and the residual stream, ``float32 + bfloat16``, is float32
    (PyTorch docs, "Automatic Mixed Precision", CPU op reference). Non-reentrant checkpoint
    records the autocast state of the forward and recomputes under the same state.
    """
    if cfg.compute_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=getattr(torch, cfg.compute_dtype))


def holds_values(t: torch.Tensor) -> bool:
    """False for a fake tensor (``torch._subclasses.fake_tensor.FakeTensorMode``) or a meta tensor:
    shapes and dtypes without data, whose value checks (``int(t.min())``) cannot run."""
    return not (is_fake(t) or t.is_meta)


def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout`` when it can change anything; the identity (no RNG draw, no saved mask) otherwise."""
    return F.dropout(x, p, training=True) if (training and p > 0.0) else x


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, written explicitly (GPT-2 / nanoGPT).

    Args:
        cfg: model configuration; parameters are created in ``cfg.dtype``.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        dtype = torch_dtype(cfg)
        self.n_head = cfg.n_head
        self.head_dim = cfg.head_dim
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model, dtype=dtype)  # weight (3D, D)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model, dtype=dtype)  # weight (D, D)
        self.fused = cfg.attention == "fused"
        if not self.fused:  # the fused call masks by itself (is_causal=True)
            mask = torch.ones(cfg.max_seq_len, cfg.max_seq_len, dtype=torch.bool).tril()
            # A constant, not an activation: memory accounting excludes buffers with parameters.
            self.register_buffer("causal_mask", mask, persistent=False)  # (T_max, T_max) bool

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Attention output before the residual add.

        Args:
            h: ``(B, T, D)`` normalised residual stream, in the parameter dtype.

        Returns:
            ``(B, T, D)``: ``dropout(y @ W_proj + b_proj)``.
        """
        B, T, D = h.shape
        H, hd = self.n_head, self.head_dim
        with activation("qkv_proj"):
            qkv = torch.addmm(self.c_attn.bias, h.reshape(B * T, D), self.c_attn.weight.t())  # (B*T, 3D)
        if self.fused:
            q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in qkv.split(D, dim=-1))  # (B, H, T, hd) views
            with activation("attn_out"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(hd))
            y = y.transpose(1, 2).reshape(B * T, D)  # heads merged
        else:
            y = self._materialized(qkv, B, T)
        with activation("out_proj"):
            a = torch.addmm(self.c_proj.bias, y, self.c_proj.weight.t()).view(B, T, D)
        return _dropout(a, self.dropout, self.training)

    def _materialized(self, qkv: torch.Tensor, B: int, T: int) -> torch.Tensor:
        """``softmax(mask(q @ k^T / sqrt(hd))) @ v`` op by op: ``(B*T, 3D)`` -> ``(B*T, D)``, heads merged."""
        H, hd = self.n_head, self.head_dim
        D = H * hd
        q, k, v = (t.reshape(B, T, H, hd).transpose(1, 2).reshape(B * H, T, hd) for t in qkv.split(D, dim=-1))
        with activation("attn_scores"):
            scores = torch.bmm(q, k.transpose(1, 2)).view(B, H, T, T)  # raw q @ k^T
        scores = scores * (1.0 / math.sqrt(hd))
        scores = scores.masked_fill(~self.causal_mask[:T, :T], float("-inf"))
        with activation("attn_probs"):
            probs = torch.softmax(scores, dim=-1)  # (B, H, T, T)
        probs = _dropout(probs, self.dropout, self.training)
        with activation("attn_out"):
            y = torch.bmm(probs.view(B * H, T, T), v).view(B, H, T, hd)
        return y.transpose(1, 2).reshape(B * T, D)  # heads merged


class MLP(nn.Module):
    """``dropout(gelu_tanh(h @ W_fc + b_fc) @ W_p2 + b_p2)`` (GPT-2's tanh-approximated GELU)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        dtype = torch_dtype(cfg)
        self.dropout = cfg.dropout
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_ff, dtype=dtype)  # weight (F, D)
        self.c_proj = nn.Linear(cfg.d_ff, cfg.d_model, dtype=dtype)  # weight (D, F)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``(B, T, D) -> (B, T, D)``."""
        B, T, D = h.shape
        with activation("mlp_hidden"):
            m = torch.addmm(self.c_fc.bias, h.reshape(B * T, D), self.c_fc.weight.t())  # (B*T, F)
        with activation("mlp_act"):
            m = F.gelu(m, approximate="tanh")
        with activation("mlp_out"):
            out = torch.addmm(self.c_proj.bias, m, self.c_proj.weight.t()).view(B, T, D)
        return _dropout(out, self.dropout, self.training)


class Block(nn.Module):
    """One pre-LayerNorm transformer block: ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        dtype = torch_dtype(cfg)
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, dtype=dtype)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, dtype=dtype)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, D) -> (B, T, D)`` residual stream, same dtype."""
        with activation("attn_norm"):
            h = self.ln_1(x)
        x = x + self.attn(h)
        with activation("mlp_norm"):
            h = self.ln_2(x)
        return x + self.mlp(h)


def split_tokens(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token inputs and targets from a ``(B, T+1)`` integer batch.

    Returns:
        ``(inputs, targets)``, both ``(B, T)`` int64: ``tokens[:, :-1]`` and ``tokens[:, 1:]``.

    Raises:
        ValueError: ``tokens`` is not rank 2, not integer, or has fewer than 2 columns.
    """
    if tokens.dim() != 2:
        raise ValueError(f"tokens must have shape (B, T+1), got rank {tokens.dim()} shape {tuple(tokens.shape)}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must be an integer tensor, got {tokens.dtype}")
    if tokens.shape[1] < 2:
        raise ValueError(f"tokens need at least 2 columns (T+1 >= 2), got shape {tuple(tokens.shape)}")
    tokens = tokens.long()
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: ``(B, T, V)`` logits, ``(B, T)`` int64 targets -> 0-d tensor."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class GPT(nn.Module):
    """GPT-2-style causal language model with tied input/output embeddings.

    ``forward(idx)`` runs ``embed`` -> every block plainly (no remat) -> ``head``. To run under a
    remat schedule use :func:`torchref.render.model_loss`.

    Args:
        cfg: model configuration; all parameters are created in ``cfg.dtype`` with torch's default
            initialisation (load real weights with :meth:`from_params`).
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        dtype = torch_dtype(cfg)
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model, dtype=dtype)  # (V, D)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.d_model, dtype=dtype)  # (T_max, D)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, dtype=dtype)

    def check_inputs(self, idx: torch.Tensor) -> None:
        """Raise ValueError unless ``idx`` is a ``(B, T)`` integer tensor of valid ids, ``T <= max_seq_len``."""
        cfg = self.cfg
        if idx.dim() != 2:
            raise ValueError(f"token ids must have shape (B, T), got rank {idx.dim()} shape {tuple(idx.shape)}")
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise ValueError(f"token ids must be an integer tensor, got {idx.dtype}")
        if idx.shape[1] > cfg.max_seq_len:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds max_seq_len={cfg.max_seq_len}")
        # Under torch.compile the value check is skipped: ``int(idx.min())`` is data-dependent and
        # breaks the graph (dynamo cannot branch on an unbacked value; ``fullgraph=True`` fails).
        # Compiled callers check eagerly first (:func:`torchref.compiled.measure_compiled` does).
        # Fake and meta tensors (a memory estimate, torchref.estimate) hold no values to check either.
        if idx.numel() and not torch.compiler.is_compiling() and holds_values(idx):
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= cfg.vocab_size:
                raise ValueError(f"token ids must lie in [0, vocab_size={cfg.vocab_size}), got min {lo} max {hi}")

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """``x = dropout(wte[idx] + wpe[:T])``: ``(B, T)`` int ids -> ``(B, T, D)`` in ``cfg.dtype``.

        Raises:
            ValueError: see :meth:`check_inputs`.
        """
        self.check_inputs(idx)
        x = self.wte(idx.long()) + self.wpe.weight[: idx.shape[1]]  # (B, T, D)
        return _dropout(x, self.cfg.dropout, self.training)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """``logits = ln_f(x) @ wte.T``: ``(B, T, D) -> (B, T, V)``."""
        return self.ln_f(x) @ self.wte.weight.t()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, V)`` for ``(B, T)`` token ids, every block run plainly (no remat)."""
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (0-d, ``cfg.dtype``) of a ``(B, T+1)`` batch, no remat."""
        inputs, targets = split_tokens(tokens)
        return lm_loss(self(inputs), targets)

    # ----------------------------------------------------------------- canonical layout
    def _canonical_tensors(self, key: str) -> tuple[list[nn.Parameter], bool]:
        """Parameters behind a canonical key (one per layer for ``h.*``) and whether to transpose."""
        if key == "wte":
            return [self.wte.weight], False
        if key == "wpe":
            return [self.wpe.weight], False
        if key.startswith("ln_f."):
            return [getattr(self.ln_f, key.split(".")[1])], False
        path = key.split(".")[1:]  # e.g. ["attn", "c_attn", "weight"]
        owners = []
        for block in self.blocks:
            owner = block
            for name in path[:-1]:
                owner = getattr(owner, name)
            owners.append(owner)
        linear = isinstance(owners[0], nn.Linear) and path[-1] == "weight"
        return [getattr(o, path[-1]) for o in owners], linear

    @classmethod
    def from_params(cls, cfg: TransformerConfig, params: dict[str, np.ndarray]) -> "GPT":
        """Build a model holding exact copies of canonical parameters.

        Args:
            cfg: model configuration.
            params: canonical layout of :func:`jaxremat.models.param_shapes` (per-block tensors stacked
                on a leading layer axis, matrices ``(in, out)``), every array in ``cfg.dtype``.

        Returns:
            A ``GPT`` in training mode whose ``nn.Linear`` weights are the transposed ``(out, in)``
            matrices; the copy is bitwise (:meth:`to_params` gives the inputs back exactly).

        Raises:
            ValueError: a key is missing/unexpected or mis-shaped (``check_params``), or an array's
                dtype is not ``cfg.dtype``.
        """
        check_params(cfg, params)
        for key, arr in params.items():
            if np.asarray(arr).dtype != np.dtype(cfg.dtype):
                raise ValueError(f"parameter {key!r}: expected dtype {cfg.dtype}, got {np.asarray(arr).dtype}")
        with torch.random.fork_rng(devices=[]):  # default init must not advance the global RNG
            model = cls(cfg)
        with torch.no_grad():
            for key in param_shapes(cfg):
                tensors, transpose = model._canonical_tensors(key)
                arr = np.asarray(params[key])
                slices = [arr] if len(tensors) == 1 and not key.startswith("h.") else list(arr)
                for t, a in zip(tensors, slices, strict=True):
                    src = torch.from_numpy(np.array(a, order="C", copy=True))  # writable copy
                    t.copy_(src.t() if transpose else src)
        return model

    def to_params(self, *, grads: bool = False, missing_grad: str = "raise") -> dict[str, np.ndarray]:
        """Parameters (or their ``.grad``) as exact numpy copies in the canonical layout.

        Args:
            grads: if True, convert each parameter's ``.grad`` instead of the parameter.
            missing_grad: with ``grads=True``, what a parameter without ``.grad`` gives:
                ``"raise"`` (ValueError) or ``"zeros"`` (a zero array of its shape: a frozen
                parameter, ``requires_grad_(False)``, gets no gradient).

        Returns:
            name -> C-contiguous array of :func:`jaxremat.models.param_shapes`, in ``cfg.dtype``.

        Raises:
            ValueError: ``grads=True``, ``missing_grad="raise"`` and some parameter has no
                gradient (run a backward first), or an unknown ``missing_grad``.
        """
        if missing_grad not in ("raise", "zeros"):
            raise ValueError(f"missing_grad must be 'raise' or 'zeros', got {missing_grad!r}")
        out: dict[str, np.ndarray] = {}
        for key in param_shapes(self.cfg):
            tensors, transpose = self._canonical_tensors(key)
            arrays = []
            for t in tensors:
                value = t.grad if grads else t
                if value is None and missing_grad == "zeros":
                    value = torch.zeros_like(t)
                if value is None:
                    raise ValueError(f"parameter {key!r} has no gradient; run a backward pass first")
                value = value.detach().cpu()
                arrays.append((value.t() if transpose else value).numpy())
            stacked = np.stack(arrays) if key.startswith("h.") else arrays[0]
            out[key] = np.array(stacked, copy=True, order="C")
        return out
