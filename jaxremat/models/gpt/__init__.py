"""The GPT-2-style causal decoder family (``TransformerConfig(arch="gpt")``), registered as ``"gpt"``.

Layout :mod:`.layout`, Hugging Face ``GPT2Model`` adapter :mod:`.checkpoint`, per-tensor
activation account :mod:`.activation`; the models themselves are :mod:`jaxremat.model` (JAX) and
:mod:`torchref.model` (PyTorch), named here by import path so that nothing loads a framework.
"""

from __future__ import annotations

import functools

from ..config import TransformerConfig
from ..params import gpt2_init
from ..registry import ModelSpec, register_model
from .layout import gpt_param_shapes

SPEC = register_model(ModelSpec(
    name="gpt",
    description="GPT-2-style pre-LayerNorm causal decoder, next-token cross-entropy",
    config=functools.partial(TransformerConfig, arch="gpt"),
    param_shapes=gpt_param_shapes,
    init_params=gpt2_init,
    jax_loss="jaxremat.model:loss_fn",
    jax_reverse_loop="jaxremat.reverse_loop:reverse_loop_value_and_grad",
    jax_check_batch="jaxremat.model:check_loss_tokens",
    torch_model="torchref.model:GPT",
    torch_loss="torchref.render:model_loss",
    torch_reverse_loop="torchref.reverse_loop:reverse_segment_loop",
    checkpoint="jaxremat.models.gpt.checkpoint",
    hf_model_type="gpt2",
    activation_account="jaxremat.models.gpt.activation",
    jax_planner_chain="jaxremat.planner:gpt_chain",
    torch_planner_chain="torchref.planner:gpt_chain",
    batch="windows",
    block_names_measurable=True,
    compute_dtypes=("bfloat16",),
    attentions=("materialized", "fused"),
    stress_suite=True,
))
