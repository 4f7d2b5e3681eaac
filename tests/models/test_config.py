"""jaxremat.models.config: TransformerConfig validates every field; compute_dtype needs float32 parameters."""

import pytest

from jaxremat.models import TransformerConfig
from jaxremat.models.config import ATTENTION_KINDS, COMPUTE_DTYPES


def test_compute_dtype_accepts_bfloat16_and_none():
    assert TransformerConfig(compute_dtype="bfloat16").compute_dtype == "bfloat16" and "bfloat16" in COMPUTE_DTYPES
    assert TransformerConfig().compute_dtype is None


@pytest.mark.parametrize("changes, message", [
    ({"compute_dtype": "float16"}, "bfloat16"),
    ({"compute_dtype": "bf16"}, "compute_dtype"),
    ({"compute_dtype": "bfloat16", "dtype": "float64"}, "float32 parameters"),
    ({"compute_dtype": "bfloat16", "arch": "bert"}, "arch='gpt' only"),
])
def test_compute_dtype_rejects_bad_values(changes, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**changes)


@pytest.mark.parametrize("kwargs, field", [
    ({"d_model": 10, "n_head": 3}, "divisible"), ({"n_layer": 0}, "n_layer"), ({"dtype": "int8"}, "dtype"),
    ({"dropout": 1.0}, "dropout"), ({"vocab_size": 2.0}, "vocab_size"),
])
def test_config_rejects_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TransformerConfig(**kwargs)


def test_config_rejects_an_unregistered_arch_listing_the_families():
    with pytest.raises(ValueError, match="arch must be one of gpt, bert, got 'llama'"):
        TransformerConfig(arch="llama")


def test_attention_defaults_to_materialized_and_the_gpt_implements_fused():
    assert TransformerConfig().attention == "materialized" and ATTENTION_KINDS == ("materialized", "fused")
    assert TransformerConfig(attention="fused").attention == "fused"


@pytest.mark.parametrize("changes, message", [
    ({"attention": "flash"}, "attention must be one of materialized, fused, got 'flash'"),
    ({"attention": "fused", "arch": "bert"}, "not implemented for arch='bert'"),
    ({"attention": "fused", "dropout": 0.1}, "needs dropout 0"),
    ({"attention": "fused", "dtype": "float64"}, "needs dtype='float32'"),
])
def test_attention_rejects_what_is_not_implemented(changes, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**changes)
