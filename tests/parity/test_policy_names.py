"""The two frameworks keep the same activations per policy, up to the one documented difference."""

import math

import pytest

from jaxremat.models import TransformerConfig
from jaxremat.spec.policies import POLICIES
from parity.checks.names import NOT_READ_IN_BLOCK, measured_names

CFG = TransformerConfig(vocab_size=64, n_layer=2, d_model=16, n_head=2, d_ff=32, max_seq_len=8)


@pytest.mark.parametrize("name", [n for n in POLICIES if not POLICIES[n].save_everything])
def test_policy_names_and_sizes_match_across_frameworks(name):
    j = measured_names("jax", CFG, 2, 8, POLICIES[name])
    t = measured_names("torch", CFG, 2, 8, POLICIES[name])
    for kind in ("kept", "offloaded"):
        assert j[kind] == sorted(set(t[kind]) - NOT_READ_IN_BLOCK), kind
    jsize = {x["name"]: math.prod(x["shape"]) for x in j["tensors"]}
    tsize = {x["name"]: math.prod(x["shape"]) for x in t["tensors"]}  # first output of the op
    assert all(jsize[n] == tsize[n] for n in jsize), (jsize, tsize)
