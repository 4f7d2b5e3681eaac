"""The one list of activation names, tagged at fixed points of every block in both frameworks.

JAX tags a value with ``jax.ad_checkpoint.checkpoint_name(x, name)``; PyTorch runs the op that
produces it inside ``torchref.names.activation(name)``, and the selective-checkpoint policy keys on
that region (where the op sits in the block), never on tensor shapes. Named policies
(:mod:`jaxremat.spec.policies`) may only use names from this list.

Shapes for the GPT block (B batch, T sequence, D ``d_model``, H heads, hd head size, F ``d_ff``).
PyTorch computes projections as one ``addmm`` on ``(B*T, .)`` views, so its tensors have the same
elements in a flattened shape. Source of the naming scheme: MaxText ``layers/*`` tags
(``query_proj``, ``out_proj``, ``mlpwi``), one list in one place.
"""

from __future__ import annotations

ACTIVATION_NAMES: dict[str, str] = {
    "block_input": "residual stream entering the block, (B, T, D)",
    "attn_norm": "LayerNorm output feeding the attention (ln_1 in GPT-2; the post-attention LN in BERT), (B, T, D)",
    "qkv_proj": "fused query/key/value projection incl. bias, (B, T, 3D)",
    "attn_scores": "raw attention scores q @ k^T before scaling and masking, (B, H, T, T)",
    "attn_probs": "softmax attention probabilities before dropout, (B, H, T, T)",
    "attn_out": "attention context probs @ v per head, before the head merge and out-projection, (B, H, T, hd)",
    "out_proj": "attention out-projection incl. bias, before dropout and the residual add, (B, T, D)",
    "mlp_norm": "LayerNorm output feeding the MLP (ln_2 in GPT-2; the output LN in BERT), (B, T, D)",
    "mlp_hidden": "MLP up-projection incl. bias, before the activation, (B, T, F)",
    "mlp_act": "MLP hidden after the GELU, (B, T, F)",
    "mlp_out": "MLP down-projection incl. bias, before dropout and the residual add, (B, T, D)",
}
"""Name -> what it tags and its shape in the GPT block. Order is the order in the block.

With fused attention (``TransformerConfig(attention="fused")``) the attention core is one call
(``jax.nn.dot_product_attention``; ``torch.nn.functional.scaled_dot_product_attention``): its output
is ``attn_out`` (in JAX laid out (B, T, H, hd)), and ``attn_scores`` and ``attn_probs`` exist in no
tensor of the block. A policy that keeps them keeps nothing there, and both frameworks' plan lint
says so (``RematPolicyWarning``: the block marks no value with that name); ``mlp_only`` then keeps
the attention's inputs and output and recomputes the fused call's interior. In PyTorch the call's
``attn_out`` region holds its output and the kernel's log-sum-exp (the flash kernel's outputs)."""

ATTENTION_NAMES = ("attn_norm", "qkv_proj", "attn_scores", "attn_probs", "attn_out", "out_proj")
MLP_NAMES = ("mlp_norm", "mlp_hidden", "mlp_act", "mlp_out")


def check_names(names, what: str = "policy") -> tuple[str, ...]:
    """Return ``names`` as a tuple, raising ValueError (listing the known names) on an unknown one.

    A typo must not silently save nothing: an unknown name would never match a tag.
    """
    names = tuple(names)
    unknown = [n for n in names if n not in ACTIVATION_NAMES]
    if unknown:
        raise ValueError(
            f"{what}: unknown activation name(s) {', '.join(map(repr, unknown))}; "
            f"known names: {', '.join(ACTIVATION_NAMES)}"
        )
    return names
