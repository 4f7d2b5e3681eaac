"""Bitwise comparison, ULP distances, and the cross-framework tolerance table.

Inside one framework, remat must not change a single bit: arrays are compared on their raw
bytes, and NaN or inf anywhere is a failure (never "equal"). When bytes differ, the distance is
reported in units in the last place (ULP) and as the maximum absolute difference. Across
frameworks, kernels differ, so agreement is a relative error checked against one dtype-keyed table.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {2: np.int16, 4: np.int32, 8: np.int64}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Largest accepted relative error across frameworks for one dtype, and why."""

    dtype: str
    max_rel_err: float
    reason: str


TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(
        "float32",
        1e-5,
        "XLA:CPU (Eigen) and PyTorch (oneDNN/MKL) block and accumulate matmuls in different orders and "
        "use different exp/tanh kernels: a few float32 ULP (eps 1.2e-7) per op, compounded over the "
        "blocks' forward and backward, stays two orders of magnitude below 1e-5 at the suite's sizes.",
    ),
    "float64": Tolerance(
        "float64",
        1e-10,
        "the same reordering in float64 (eps 2.2e-16): a few ULP per op, far below 1e-10; a larger "
        "error here would mean different math, not different rounding.",
    ),
    "bfloat16": Tolerance(
        "bfloat16",
        6e-2,
        "mixed precision, float32 parameters and bfloat16 compute (eps 2^-7 = 7.8e-3): JAX computes the "
        "whole forward pass in bfloat16 as Flax's dtype= does, residual stream included, while "
        "torch.autocast on CPU runs only the matmuls in bfloat16 and keeps the float32 residual stream and "
        "the ops fed by it in float32. The roundings therefore sit in different places; measured: loss "
        "1.5e-6, gradients 3.0e-2 (about 4 bfloat16 eps) at gpt-small; the bound is 8 eps.",
    ),
}


def tolerance_for(dtype: str) -> Tolerance:
    """The :data:`TOLERANCES` entry for ``dtype``; raises ValueError naming the known dtypes."""
    try:
        return TOLERANCES[str(dtype)]
    except KeyError:
        raise ValueError(f"no cross-framework tolerance for dtype {dtype!r}; known: {sorted(TOLERANCES)}") from None


def _ordered_ints(a: np.ndarray) -> np.ndarray:
    """Map IEEE floats to integers whose order and differences follow the float line (ULP steps)."""
    size = a.dtype.itemsize
    bits = a.view(_INT[size]).astype(np.int64) if size < 8 else a.view(np.int64)
    magnitude = bits & np.int64(np.iinfo(_INT[size]).max)
    return np.where(bits < 0, -magnitude, magnitude)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance between ``a`` and ``b`` in units in the last place (same float dtype and shape).

    +0.0 and -0.0 are 0 ULP apart. Arrays holding NaN have no defined distance (returns -1).
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"cannot compare {a.dtype}{a.shape} with {b.dtype}{b.shape}")
    if a.size == 0:
        return 0
    if np.isnan(a).any() or np.isnan(b).any():
        return -1
    da, db = _ordered_ints(a).ravel(), _ordered_ints(b).ravel()
    differ = da != db
    if not differ.any():
        return 0
    # Python ints: the difference of two int64 values can overflow int64 (float64 of opposite signs).
    return max(abs(int(x) - int(y)) for x, y in zip(da[differ], db[differ]))


@dataclasses.dataclass
class BitwiseResult:
    """Outcome of a byte-for-byte comparison of two sets of named arrays.

    Attributes:
        equal: True when every array has the same dtype, shape and raw bytes, and none holds NaN/inf.
        max_ulp: largest ULP distance over all arrays (0 when equal; -1 when NaN made it undefined).
        max_abs_diff: largest absolute difference (0.0 when equal; inf when non-finite).
        mismatched: names of arrays whose bytes differ.
        nonfinite: names of arrays holding NaN or inf on either side.
    """

    equal: bool
    max_ulp: int
    max_abs_diff: float
    mismatched: list[str]
    nonfinite: list[str]


def compare_bitwise(test: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> BitwiseResult:
    """Compare named arrays byte for byte (``np.array_equal`` on the raw bits).

    Raises:
        ValueError: the two mappings hold different names.
    """
    if set(test) != set(ref):
        raise ValueError(f"name sets differ: only in test {sorted(set(test) - set(ref))}, only in ref {sorted(set(ref) - set(test))}")
    mismatched, nonfinite = [], []
    max_ulp, max_abs = 0, 0.0
    for name in ref:
        a, b = np.asarray(test[name]), np.asarray(ref[name])
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            nonfinite.append(name)
            max_abs = float("inf")
            max_ulp = -1 if max_ulp >= 0 else max_ulp
        if a.dtype != b.dtype or a.shape != b.shape:
            mismatched.append(name)
            max_abs = float("inf")
            continue
        same = np.array_equal(a.view(_UINT[a.dtype.itemsize]), b.view(_UINT[b.dtype.itemsize]))
        if not same:
            mismatched.append(name)
            if name not in nonfinite:
                max_abs = max(max_abs, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
                if max_ulp >= 0:
                    max_ulp = max(max_ulp, ulp_distance(a, b))
    equal = not mismatched and not nonfinite
    return BitwiseResult(equal, max_ulp, max_abs, mismatched, nonfinite)


def max_rel_err(test: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> float:
    """Largest per-array relative error ``max|a - b| / max|b|`` over all names (inf if non-finite)."""
    worst = 0.0
    for name in ref:
        a = np.asarray(test[name], dtype=np.float64)
        b = np.asarray(ref[name], dtype=np.float64)
        if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
            return float("inf")
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        err = float(np.max(np.abs(a - b))) if b.size else 0.0
        worst = max(worst, err / scale if scale > 0 else err)
    return worst
