"""Model configuration shared by the JAX and PyTorch transformers of every family (imports neither framework).

``arch`` names the family; it must be registered (:mod:`jaxremat.models.registry`), so a new family
that reuses this config needs no edit here.
"""

from __future__ import annotations

import dataclasses

from .registry import get_model, registered_models

SUPPORTED_DTYPES = ("float32", "float64")
COMPUTE_DTYPES = ("bfloat16",)
"""Lower-precision compute dtypes a float32 model may run in (mixed precision)."""
ATTENTION_KINDS = ("materialized", "fused")
"""How the attention core is computed: op by op with the (B, H, T, T) scores and probabilities as
tensors of their own (the default), or by the framework's fused attention function."""


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A GPT-2-style pre-LayerNorm causal decoder, or a BERT-style post-LayerNorm encoder.

    ``arch="gpt"`` (Radford et al. 2019; nanoGPT's layout): each block is ``x + attn(ln_1(x))``
    then ``x + mlp(ln_2(x))`` with a tanh-approximated GELU in the MLP. Position embeddings are
    learned; the output projection is tied to the token embedding (``logits = ln_f(x) @ wte.T``).

    ``arch="bert"`` (Devlin et al. 2019, arXiv:1810.04805; Hugging Face ``BertModel``): the
    embedding is ``LayerNorm(word + token_type + position)``; each block is
    ``x = ln_1(x + attn(x))`` then ``x = ln_2(x + mlp(x))`` with the exact (erf) GELU and
    bidirectional attention under a padding mask; the output is the last hidden state
    (:mod:`jaxremat.encoder`, :mod:`torchref.encoder`).

    Attributes:
        vocab_size: number of token ids; ids must lie in ``[0, vocab_size)``.
        n_layer: number of transformer blocks N (>= 1).
        d_model: residual-stream width D; divisible by ``n_head``.
        n_head: number of attention heads H; head size is ``d_model // n_head``.
        d_ff: hidden width of the MLP (GPT-2 uses ``4 * d_model``).
        max_seq_len: number of learned positions; inputs may be at most this long.
        layer_norm_eps: epsilon added to the variance in every LayerNorm.
        dropout: dropout rate on embeddings, attention probabilities and residual branches,
            in ``[0, 1)``. Default 0 (deterministic).
        dtype: parameter dtype (and compute dtype unless ``compute_dtype`` is set), one of
            ``SUPPORTED_DTYPES``.
        compute_dtype: None (compute in ``dtype``) or one of ``COMPUTE_DTYPES`` for mixed
            precision: parameters stay in ``dtype`` (float32), the forward pass computes in
            ``compute_dtype``. JAX casts parameters and activations inside the embedding, each
            block and the head, as Flax modules do with ``dtype``/``param_dtype``; PyTorch runs
            the forward pass under ``torch.autocast("cpu", dtype=torch.bfloat16)``. The loss is
            computed from logits in ``dtype`` and gradients come out in ``dtype``.
        arch: the model family, a name registered with :func:`jaxremat.models.register_model`:
            ``"gpt"`` (default) or ``"bert"`` built in, see above.
        type_vocab_size: number of token-type (segment) ids of the BERT embedding (``arch="bert"``).
        pad_token_id: id of the padding token; with ``arch="bert"`` positions holding it are
            masked out of attention and pooling.
        attention: one of ``ATTENTION_KINDS``. ``"materialized"`` (default): ``q @ k^T``, the
            masked softmax and ``probs @ v`` as separate ops, each activation of the attention core
            tagged (:data:`jaxremat.spec.names.ACTIVATION_NAMES`). ``"fused"``: one call of the
            framework's attention function, ``jax.nn.dot_product_attention`` (XLA's implementation
            on a CPU, which still builds the (B, H, T, T) probabilities; cuDNN's on a GPU that has
            it) and ``torch.nn.functional.scaled_dot_product_attention`` (on a CPU its flash
            kernel, which keeps the output and a (B, H, T) log-sum-exp for the backward, no T x T
            tensor); only ``attn_out`` is tagged inside it (docs/real-sizes.md). Families list
            what they implement (``ModelSpec.attentions``); fused needs ``dropout == 0``
            (``jax.nn.dot_product_attention`` draws no dropout) and ``dtype == "float32"`` (its
            softmax runs in float32 whatever the input's dtype: float64 would not be float64).

    Raises:
        ValueError: a field is out of range (message names the field and the valid range).
    """

    vocab_size: int = 256
    n_layer: int = 8
    d_model: int = 64
    n_head: int = 4
    d_ff: int = 256
    max_seq_len: int = 64
    layer_norm_eps: float = 1e-5
    dropout: float = 0.0
    dtype: str = "float32"
    arch: str = "gpt"
    type_vocab_size: int = 2
    pad_token_id: int = 0
    compute_dtype: str | None = None
    attention: str = "materialized"

    def __post_init__(self) -> None:
        if self.arch not in registered_models():
            raise ValueError(f"TransformerConfig.arch must be one of {', '.join(registered_models())}, got {self.arch!r}")
        for name in ("vocab_size", "n_layer", "d_model", "n_head", "d_ff", "max_seq_len", "type_vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TransformerConfig.{name} must be an integer >= 1, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"TransformerConfig.d_model ({self.d_model}) must be divisible by n_head "
                f"({self.n_head}); choose n_head among the divisors of d_model"
            )
        if not (isinstance(self.layer_norm_eps, (int, float)) and self.layer_norm_eps > 0):
            raise ValueError(f"TransformerConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"TransformerConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.pad_token_id, bool) or not isinstance(self.pad_token_id, int) or not (
                0 <= self.pad_token_id < self.vocab_size):
            raise ValueError(
                f"TransformerConfig.pad_token_id must be an integer in [0, vocab_size={self.vocab_size}), "
                f"got {self.pad_token_id!r}"
            )
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"TransformerConfig.dtype must be one of {', '.join(SUPPORTED_DTYPES)}, got {self.dtype!r}"
            )

        self._check_attention()
        if self.compute_dtype is not None:
            if self.compute_dtype not in COMPUTE_DTYPES:
                raise ValueError(
                    f"TransformerConfig.compute_dtype must be None or one of {', '.join(COMPUTE_DTYPES)}, "
                    f"got {self.compute_dtype!r}"
                )
            if self.compute_dtype not in get_model(self.arch).compute_dtypes:
                mixed = [f"arch={a!r}" for a in registered_models() if self.compute_dtype in get_model(a).compute_dtypes]
                raise ValueError(
                    f"TransformerConfig.compute_dtype is implemented for {' and '.join(mixed) or 'no family'} only, "
                    f"got arch={self.arch!r}"
                )
            if self.dtype != "float32":
                raise ValueError(
                    f"TransformerConfig.compute_dtype={self.compute_dtype!r} needs float32 parameters "
                    f"(dtype='float32'), got dtype={self.dtype!r}"
                )

    def _check_attention(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"TransformerConfig.attention must be one of {', '.join(ATTENTION_KINDS)}, "
                             f"got {self.attention!r}")
        if self.attention not in get_model(self.arch).attentions:
            raise ValueError(f"TransformerConfig.attention={self.attention!r} is not implemented for "
                             f"arch={self.arch!r} (it implements {', '.join(get_model(self.arch).attentions)})")
        if self.attention == "fused" and self.dropout:
            raise ValueError(f"TransformerConfig.attention='fused' needs dropout 0 (jax.nn.dot_product_attention "
                             f"draws no dropout), got dropout={self.dropout!r}")
        if self.attention == "fused" and self.dtype == "float64":
            raise ValueError("TransformerConfig.attention='fused' needs dtype='float32' (jax.nn.dot_product_attention "
                             "computes its softmax in float32 whatever the input dtype); use attention='materialized'")

    @property
    def head_dim(self) -> int:
        """Size of one attention head, ``d_model // n_head``."""
        return self.d_model // self.n_head

    def replace(self, **changes) -> "TransformerConfig":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)
