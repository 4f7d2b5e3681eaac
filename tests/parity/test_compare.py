import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.compare import TOLERANCES, compare_bitwise, max_rel_err, tolerance_for, ulp_distance


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


def test_max_rel_err_and_tolerance_table():
    ref = {"g": np.array([1.0, -2.0])}
    assert max_rel_err({"g": np.array([1.0, -2.0 + 2e-6])}, ref) == pytest.approx(1e-6)
    assert max_rel_err({"g": np.array([np.nan, 0.0])}, ref) == float("inf")
    assert tolerance_for("float32").max_rel_err == 1e-5
    assert tolerance_for("float64").max_rel_err == 1e-10
    assert all(t.reason for t in TOLERANCES.values())
    with pytest.raises(ValueError, match="known"):
        tolerance_for("int8")
