"""parity.cli.budget: the memory estimate of a run, its refusal, and the device check on a GPU."""

import pytest

from jaxremat.models import TransformerConfig
from parity.cli.budget import check_device_fits, check_fits, parameter_count, run_estimate

TINY = TransformerConfig(vocab_size=64, n_layer=2, d_model=16, n_head=2, d_ff=32, max_seq_len=8)


def test_estimate_counts_state_kept_results_weights_and_activations():
    p = parameter_count(TINY) * 4
    total, account = run_estimate(TINY, 2, 8, ("torch",), ("float32",), kept_cases=3)
    assert total > 6 * p + 2 * p * 3 + p  # plus the activations
    assert f"{parameter_count(TINY):,} parameters in float32" in account and "3 kept results" in account
    f64, _ = run_estimate(TINY, 2, 8, ("torch",), ("float32", "float64"), kept_cases=3)
    assert f64 > total  # the largest dtype dominates


def test_estimate_of_a_billion_layers_is_instant_and_refused():
    huge = TINY.replace(n_layer=10**9)
    needed, account = run_estimate(huge, 2, 8, ("jax", "torch"), ("float32",), kept_cases=1)
    with pytest.raises(ValueError, match=r"this run needs at least an estimated .* TiB of memory but 16.0 GiB"):
        check_fits(needed, account, "this run", available=16 << 30)
    check_fits(*run_estimate(TINY, 2, 8, ("torch",), ("float32",), kept_cases=1), "this run", available=16 << 30)


def _jax_gpu() -> bool:
    try:
        import jax

        return jax.default_backend() == "gpu"
    except Exception:
        return False


@pytest.mark.skipif(not _jax_gpu(), reason="the device-memory check reads a GPU's bytes_limit; no GPU here")
def test_device_check_refuses_what_the_gpu_cannot_hold():
    check_device_fits(TINY, 2, 8, ("float32",))
    with pytest.raises(ValueError, match="JAX on the GPU needs an estimated"):
        check_device_fits(TINY.replace(n_layer=10**7, d_model=1024, n_head=8, d_ff=4096), 2, 8, ("float32",))
