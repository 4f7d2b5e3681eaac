"""The BERT-style post-LayerNorm encoder family (``TransformerConfig(arch="bert")``), registered as ``"bert"``.

Layout :mod:`.layout`, Hugging Face ``BertModel`` adapter :mod:`.checkpoint`; the models are
:mod:`jaxremat.encoder` (JAX) and :mod:`torchref.encoder` (PyTorch), trained on a contrastive
sentence-embedding loss over paraphrase pairs, named here by import path. The family has no
per-tensor activation account and the per-block kept-names measurement builds the GPT block only,
so predictions and the names check are left out for it.
"""

from __future__ import annotations

import functools

from ..config import TransformerConfig
from ..params import gpt2_init
from ..registry import ModelSpec, register_model
from .layout import encoder_param_shapes

SPEC = register_model(ModelSpec(
    name="bert",
    description="BERT-style post-LayerNorm encoder, contrastive sentence-embedding loss",
    config=functools.partial(TransformerConfig, arch="bert"),
    param_shapes=encoder_param_shapes,
    init_params=gpt2_init,
    jax_loss="jaxremat.encoder:loss_fn",
    jax_reverse_loop="jaxremat.encoder_reverse_loop:reverse_loop_value_and_grad",
    torch_model="torchref.encoder:Encoder",
    torch_loss="torchref.encoder:encoder_loss",
    torch_reverse_loop="torchref.encoder_reverse_loop:reverse_segment_loop",
    checkpoint="jaxremat.models.bert.checkpoint",
    hf_model_type="bert",
    peer_checks="parity.checks.peer:peer_checks",
    jax_planner_chain="jaxremat.planner:encoder_chain",
    torch_planner_chain="torchref.planner:encoder_chain",
    batch="sentence_pairs",
))
