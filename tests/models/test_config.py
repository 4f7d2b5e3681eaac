"""compute_dtype: validated, float32 parameters only."""

import pytest

from jaxremat.spec import TransformerConfig
from jaxremat.spec.config import COMPUTE_DTYPES


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
