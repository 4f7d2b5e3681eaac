"""Shared fixtures of the jaxremat tests: configs, weights, tokens, raw-bit comparison, and a
session cache of (loss, grads) per case so that each program is compiled once per session.

Helpers reach tests as fixtures (``bits``, ``run``), which works under any pytest import mode.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxremat.model import loss_fn
from jaxremat.models import TransformerConfig, init_params
from parity.checks.compare import compare_bitwise, ulp_distance

TINY = TransformerConfig(vocab_size=64, n_layer=5, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
DEFAULT = TransformerConfig()  # n_layer 8, d_model 64, n_head 4, d_ff 256, T 64, float32
CONFIGS = {"tiny": (TINY, 2), "default": (DEFAULT, 4)}  # name -> (config, batch)


def bits_equal(a, b) -> bool:
    """Raw-bit equality; NaN or inf anywhere counts as not equal (the harness's own comparison)."""
    a, b = np.asarray(a), np.asarray(b)
    return compare_bitwise({"x": a}, {"x": b}).equal


def max_ulp(a, b) -> int:
    """Largest distance in units in the last place between two float arrays of one dtype."""
    return ulp_distance(np.asarray(a), np.asarray(b))


def max_rel(a, b) -> float:
    """``max |a - b| / max |b|`` over one tensor, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def assert_tree_bitwise(a: dict, b: dict, what: str = "") -> None:
    """Every entry of two dicts equal bit for bit; the message names the entries and their ULP."""
    bad = {k: max_ulp(a[k], b[k]) for k in a if not bits_equal(a[k], b[k])}
    assert not bad, f"{what} not bitwise equal (max ULP per entry): {bad}"


class _Bits:
    equal = staticmethod(bits_equal)
    max_ulp = staticmethod(max_ulp)
    max_rel = staticmethod(max_rel)
    assert_tree = staticmethod(assert_tree_bitwise)


def case_config(name: str, dropout: float = 0.0, dtype: str = "float32") -> TransformerConfig:
    return CONFIGS[name][0].replace(dropout=dropout, dtype=dtype)


def case_inputs(name: str, dtype: str = "float32"):
    """(params, tokens) of a named case; jnp arrays (call inside enable_x64 for float64)."""
    cfg, batch = CONFIGS[name]
    cfg = cfg.replace(dtype=dtype)
    params = {k: jnp.asarray(v) for k, v in init_params(cfg, seed=1).items()}
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, cfg.max_seq_len + 1))
    return params, jnp.asarray(tokens, jnp.int32)


@functools.lru_cache(maxsize=None)
def value_and_grad_jit(cfg, schedule):
    """One ``jax.jit`` object per (cfg, schedule): its executables are reused session-wide."""
    return jax.jit(jax.value_and_grad(lambda p, t, k: loss_fn(p, t, cfg, schedule, k)))


@functools.lru_cache(maxsize=None)
def run_case(name: str, schedule, mode: str, dropout: float = 0.0, dtype: str = "float32"):
    """(loss, grads) as numpy for a named case, computed once per session."""
    cfg = case_config(name, dropout, dtype)
    with jax.enable_x64(dtype == "float64"):
        params, tokens = case_inputs(name, dtype)
        key = jax.random.key(0) if dropout else None
        if mode == "jit":
            loss, grads = value_and_grad_jit(cfg, schedule)(params, tokens, key)
        else:
            with jax.disable_jit():
                loss, grads = jax.value_and_grad(loss_fn)(params, tokens, cfg, schedule, key)
        return np.asarray(loss), {k: np.asarray(v) for k, v in grads.items()}


@functools.lru_cache(maxsize=None)
def _stack_inputs(n: int, d: int, b: int):
    return jax.random.normal(jax.random.key(0), (n, d, d)) * 0.3, jax.random.normal(jax.random.key(1), (b, d))


@pytest.fixture(scope="session")
def stack_inputs():
    """``(n, d, b) -> (weights (n, d, d) * 0.3, input (b, d))``, float32 normal draws of keys 0 and 1, once per shape.

    A fixture, so a module draws them when its first test runs, not at import: every xdist worker imports
    (collects) every test module, and drawing compiles JAX's normal sampler per shape."""
    return _stack_inputs


@pytest.fixture(scope="session")
def bits():
    return _Bits


@pytest.fixture(scope="session")
def run():
    return run_case


@pytest.fixture(scope="session")
def tiny_cfg():
    return TINY


@pytest.fixture(scope="session")
def tiny():
    params, tokens = case_inputs("tiny")
    return TINY, params, tokens


@pytest.fixture(scope="session")
def default():
    params, tokens = case_inputs("default")
    return DEFAULT, params, tokens


@pytest.fixture(scope="session")
def vg_jit():
    return value_and_grad_jit


@pytest.fixture
def remat3_flag():
    """Set JAX's ``jax_remat3`` flag for one test: ``remat3_flag(True)``; its previous value is restored after it."""
    previous = jax.config.jax_remat3
    yield lambda on: jax.config.update("jax_remat3", on)
    jax.config.update("jax_remat3", previous)
