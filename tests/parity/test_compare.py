import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.checks.compare import (EPS, TOLERANCES, compare_bitwise, cross_check, loss_error, max_rel_err, tolerance_for,
                            ulp_distance, worst_tensor)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ulp_distance_counts_steps(dtype):
    a = np.array([1.0, -3.0, 0.0], dtype)
    b = a.copy()
    for _ in range(5):
        b = np.nextafter(b, dtype(np.inf))
    assert ulp_distance(a, b) == 5
    assert ulp_distance(np.array([0.0], dtype), np.array([-0.0], dtype)) == 0


@settings(max_examples=200, deadline=None)
@given(x=st.floats(min_value=-2.0**126, max_value=2.0**126, width=32), k=st.integers(0, 50))
def test_ulp_distance_matches_nextafter_walk_across_zero(x, k):
    a = np.array([x], np.float32)
    b = a.copy()
    for _ in range(k):
        b = np.nextafter(b, np.float32(-np.inf))
    d = ulp_distance(a, b)
    # walking across zero passes +0 and -0, which are the same point here
    assert d == k or (d == k - 1 and np.sign(a[0]) != np.sign(b[0]) and a[0] != 0)


def test_compare_bitwise_equal_and_not():
    a = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert compare_bitwise(a, {"w": a["w"].copy()}).equal
    b = {"w": a["w"].copy()}
    b["w"][1, 2] = np.nextafter(b["w"][1, 2], np.float32(100))
    r = compare_bitwise(b, a)
    assert not r.equal and r.max_ulp == 1 and r.mismatched == ["w"] and r.max_abs_diff > 0


def test_compare_bitwise_nan_and_inf_are_failures():
    nan = {"w": np.array([np.nan], np.float32)}
    r = compare_bitwise(nan, {"w": nan["w"].copy()})  # identical bytes, still a failure
    assert not r.equal and r.nonfinite == ["w"]
    inf = {"w": np.array([np.inf], np.float32)}
    assert not compare_bitwise(inf, {"w": inf["w"].copy()}).equal


def test_compare_bitwise_sign_of_zero_is_a_difference():
    r = compare_bitwise({"w": np.array([-0.0], np.float32)}, {"w": np.array([0.0], np.float32)})
    assert not r.equal and r.max_ulp == 0  # bits differ though the values compare equal


def test_compare_bitwise_name_and_dtype_mismatch():
    with pytest.raises(ValueError, match="only in test"):
        compare_bitwise({"a": np.zeros(1)}, {"b": np.zeros(1)})
    assert not compare_bitwise({"a": np.zeros(1, np.float32)}, {"a": np.zeros(1, np.float64)}).equal


def test_max_rel_err_is_relative_to_the_tensors_largest_entry():
    ref = {"g": np.array([1.0, -2.0])}
    assert max_rel_err({"g": np.array([1.0, -2.0 + 2e-6])}, ref) == pytest.approx(1e-6)
    # a tiny entry's own relative error (here 1.0) does not count: the tensor's scale does
    assert max_rel_err({"g": np.array([2e-9, -2.0])}, {"g": np.array([1e-9, -2.0])}) == pytest.approx(5e-10)
    assert max_rel_err({"g": np.array([np.nan, 0.0])}, ref) == float("inf")
    assert worst_tensor({"a": np.ones(2), "b": np.full(2, 1.5)}, {"a": np.ones(2), "b": np.ones(2)}) == ("b", 0.5)


def test_tolerance_table_has_one_entry_per_dtype_and_quantity():
    assert set(TOLERANCES) == {(d, q) for d in ("float32", "float64", "bfloat16") for q in ("loss", "grads")}
    assert EPS == {"float32": 2.0**-23, "float64": 2.0**-52, "bfloat16": 2.0**-7}
    for (dtype, quantity), t in TOLERANCES.items():
        assert (t.dtype, t.quantity) == (dtype, quantity)
        assert t.bound == t.eps_multiple * EPS[dtype] == t.max_rel_err
        assert "eps" in t.reason and ("terms" in t.reason if quantity == "loss" else "largest entry" in t.reason)
        assert "measured" in t.reason and "section 11" in t.reason  # each bound says what it was set from
    assert tolerance_for("float32") is TOLERANCES["float32", "grads"]  # the tensor tolerance by default
    assert tolerance_for("float32").bound == 2.0**-23 * 512 and tolerance_for("float32", "loss").bound == 2.0**-18
    with pytest.raises(ValueError, match="known"):
        tolerance_for("int8")
    with pytest.raises(ValueError, match="quantity"):
        tolerance_for("float32", "weights")


def test_loss_error_is_relative_to_the_loss_terms():
    # the AVX-512 report on all-MiniLM-L6-v2: JAX jit 0.019935131, PyTorch 0.019935384, whose terms
    # (logsumexp and target logit per row) sum to S = 33.1 here: 7.6e-9 of S, under one float32 eps
    a, b = np.float32(0.019935131), np.float32(0.019935384)
    err = loss_error(a, b, 33.10197)
    assert err == pytest.approx(abs(float(a) - float(b)) / 33.10197)
    assert err < tolerance_for("float32", "loss").bound < max_rel_err({"l": a}, {"l": b})
    assert loss_error(np.float32(np.nan), b, 1.0) == float("inf")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="term_scale"):
            loss_error(a, b, bad)


def _grads(rng):
    return {"w": rng.standard_normal((8, 16)).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)}


def test_cross_check_passes_rounding_and_reports_its_fields():
    rng = np.random.default_rng(0)
    ref = _grads(rng)
    test = {k: (v * (1 + rng.uniform(-8, 8, v.shape) * EPS["float32"])).astype(np.float32) for k, v in ref.items()}
    one_ulp = np.nextafter(np.float32(5.5), np.float32(6))  # 5.5 + 4.8e-7: a 1-ULP loss difference
    r = cross_check(np.float32(5.5), one_ulp, test, ref, 5.6, "float32")
    assert r["ok"] and r["loss_ok"] and r["grads_ok"]
    assert set(r) == {"loss_abs_diff", "loss_term_scale", "loss_err", "max_rel_err_loss", "max_rel_err_grads",
                      "worst_grad", "tolerance_loss", "tolerance", "loss_ok", "grads_ok", "ok"}
    assert r["loss_abs_diff"] == float(one_ulp) - 5.5 and r["loss_term_scale"] == 5.6
    assert 0 < r["max_rel_err_grads"] <= 9 * EPS["float32"] and r["worst_grad"] in ref
    with pytest.raises(ValueError, match="names differ"):
        cross_check(1.0, 1.0, {"w": ref["w"]}, ref, 1.0, "float32")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cross_check_catches_a_gradient_off_by_one_part_in_a_thousand(dtype):
    rng = np.random.default_rng(1)
    ref = {k: v.astype(dtype) for k, v in _grads(rng).items()}
    wrong = dict(ref, b=ref["b"] * (1 + 1e-3))
    r = cross_check(1.0, 1.0, wrong, ref, 1.0, dtype)
    assert not r["ok"] and not r["grads_ok"] and r["loss_ok"] and r["worst_grad"] == "b"
    assert r["max_rel_err_grads"] == pytest.approx(1e-3, rel=1e-4)
    missing = dict(ref, w=ref["w"] - ref["w"][:, :1])  # a term missing from every entry of w
    assert not cross_check(1.0, 1.0, missing, ref, 1.0, dtype)["grads_ok"]
    # a loss off by 1e-4 of its terms fails
    assert not cross_check(1.0 + 1e-4, 1.0, ref, ref, 1.0, dtype)["loss_ok"]
