import numpy as np
import pytest

from jaxremat.models import TransformerConfig, check_params, init_params, param_shapes


def test_init_params_shapes_dtypes_and_determinism():
    cfg = TransformerConfig(n_layer=3, d_model=16, n_head=2, d_ff=32, max_seq_len=8, dtype="float64")
    p = init_params(cfg, seed=1)
    check_params(cfg, p)
    assert all(a.dtype == np.float64 for a in p.values())
    q = init_params(cfg, seed=1)
    assert all(np.array_equal(p[k], q[k]) for k in p)
    assert p["h.attn.c_attn.weight"].shape == (3, 16, 48)


def test_check_params_names_the_key():
    cfg = TransformerConfig(n_layer=2, d_model=8, n_head=2, d_ff=16, max_seq_len=4)
    p = init_params(cfg)
    bad = dict(p, **{"h.mlp.c_fc.weight": np.zeros((2, 8, 15), np.float32)})
    with pytest.raises(ValueError, match=r"h\.mlp\.c_fc\.weight.*\(2, 8, 16\).*\(2, 8, 15\)"):
        check_params(cfg, bad)
    with pytest.raises(ValueError, match="missing.*wpe"):
        check_params(cfg, {k: v for k, v in p.items() if k != "wpe"})
    assert list(param_shapes(cfg))[0] == "wte"
