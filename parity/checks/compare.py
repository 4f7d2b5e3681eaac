"""Bitwise comparison, ULP distances, and the cross-framework tolerance table.

Inside one framework, remat must not change a single bit: arrays are compared on their raw
bytes, and NaN or inf anywhere is a failure (never "equal"). When bytes differ, the distance is
reported in units in the last place (ULP) and as the maximum absolute difference. Across
frameworks, kernels differ, so agreement is an error measured on the scale the computation rounds
on and checked against one table keyed by dtype and quantity (:data:`TOLERANCES`): the loss
relative to the terms it is the difference of (:func:`loss_error`), each gradient tensor relative
to its largest entry (:func:`max_rel_err`); :func:`cross_check` applies both.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {2: np.int16, 4: np.int32, 8: np.int64}


EPS: dict[str, float] = {"float32": 2.0**-23, "float64": 2.0**-52, "bfloat16": 2.0**-7}
"""Machine epsilon (the spacing of floats at 1) per dtype: 1.19e-7, 2.22e-16, 7.8e-3."""

QUANTITIES = ("loss", "grads")


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Largest accepted cross-framework error of one quantity in one dtype, and why.

    Attributes:
        dtype: ``float32``, ``float64`` or ``bfloat16`` (float32 parameters, bfloat16 compute).
        quantity: ``loss`` (measured by :func:`loss_error`) or ``grads`` (by :func:`max_rel_err`).
        eps_multiple: the bound in units of the dtype's epsilon (:data:`EPS`).
        reason: what the measure scales with, the epsilon it derives from, and the measured
            distribution it was set from (docs/framework-differences.md, section 11).
    """

    dtype: str
    quantity: str
    eps_multiple: float
    reason: str

    @property
    def bound(self) -> float:
        """The accepted error, ``eps_multiple * EPS[dtype]`` (dimensionless: a relative error)."""
        return self.eps_multiple * EPS[self.dtype]

    @property
    def max_rel_err(self) -> float:
        """Alias of :attr:`bound`, the name the tensor comparisons read (hidden states, gradients)."""
        return self.bound


_LOSS = ("error |a - b| / S, where S is the mean over the loss's rows of |logsumexp(z_i)| + |z_i[t_i]|, "
         "the terms each row's cross-entropy is the difference of (parity/runners/torch_loss_terms.py): a loss can "
         "only be rounded relative to its terms, not to itself (all-MiniLM-L6-v2's contrastive loss is "
         "0.02 from terms near 16.5, S = 33.1; a GPT at initialisation has S close to its loss). ")
_GRADS = ("error max|a - b| / max|b| per parameter tensor (each stacked over the layers), the largest "
          "over tensors: an entry is rounded relative to the sums it came from, whose size the tensor's "
          "largest entry stands for, not relative to its own (possibly tiny) value. ")
_SWEEP = ("Set from the errors measured on two CPUs (AVX2 only; AVX-512) over XLA's instruction sets "
          "SSE4.2/AVX/AVX2/AVX-512 and dot kernels (YNNPACK, Eigen), ATen's default/AVX2/AVX-512 kernels, "
          "MKL's default and COMPATIBLE paths, 1 and 2 threads (python -m parity.experiments.tolerance_sweep; "
          "docs/framework-differences.md, section 11): ")

TOLERANCES: dict[tuple[str, str], Tolerance] = {
    (t.dtype, t.quantity): t
    for t in (
        Tolerance("float32", "loss", 32.0, _LOSS + "Bound: 32 float32 eps (2^-23 = 1.19e-7; 32 eps = 3.8e-6) of "
                  "S: the roundings of the terms and of the mean over the B*T rows, whose summation order is the "
                  "compiler's (XLA's AVX-512 code sums gpt-small's 256 row losses, the same bits, in another order "
                  "than its AVX2 code: 1415.047485 against 1415.047852, 3 float32 ULP of the sum apart). " + _SWEEP +
                  "gpt-small at most 2.1 eps under AVX-512 code (0.70 eps, one float32 ULP of its loss of 5.5, "
                  "without), minilm-l6 at most 0.14 eps (the AVX-512 report, 2.5e-7 of a loss of 0.02, is "
                  "0.064 eps of S = 33.1): margin 15x."),
        Tolerance("float32", "grads", 512.0, _GRADS + "Bound: 512 float32 eps (2^-23 * 2^9 = 6.1e-5). "
                  + _SWEEP + "gpt-small at most 5.5 eps; minilm-l6 up to 51 eps under jit on the AVX2 CPU and 96 eps on "
                  "the AVX-512 one (95 op by op), larger because its loss of 0.02 makes the cross-entropy "
                  "gradient p - y a difference of nearly equal numbers: margin 5.3x over the largest measured (96 eps); the "
                  "AVX-512 report, 7.45e-6, is 62.5 eps (8.2x). A gradient off by 1e-3 is 16x over the bound."),
        Tolerance("float64", "loss", 32.0, _LOSS + "Bound: 32 float64 eps (2^-52 = 2.2e-16; 7.1e-15) of S: the "
                  "float32 multiple, since the same operations in another order round in proportion to eps. "
                  + _SWEEP + "gpt-small at most 0.70 eps (one float64 ULP of its loss): margin 45x."),
        Tolerance("float64", "grads", 512.0, _GRADS + "Bound: 512 float64 eps (1.1e-13), the float32 multiple: "
                  "the same reorderings round in proportion to eps, and a larger error would mean different "
                  "math, not different rounding. " + _SWEEP + "gpt-small at most 5.3 eps, as in float32: margin 97x."),
        Tolerance("bfloat16", "loss", 2.0**-4, _LOSS + "Mixed precision (float32 parameters, bfloat16 compute, "
                  "eps 2^-7 = 7.8e-3): the cross-entropy runs in float32 in both frameworks (logits cast back), "
                  "and the bfloat16 roundings reach the loss through the logits, small next to S at "
                  "initialisation (S is about log V there), averaged over the B*T rows. Bound: 2^-4 bfloat16 "
                  "eps (2^-11 = 4.9e-4) of S. " + _SWEEP + "gpt-small (256 rows) at most 1.6e-6; gpt-tiny (32 "
                  "rows, one run at the default setting) 3.9e-5: margin 12.6x."),
        Tolerance("bfloat16", "grads", 8.0, _GRADS + "Mixed precision (eps 2^-7 = 7.8e-3): JAX computes the "
                  "whole forward pass in bfloat16 as Flax's dtype= does, residual stream included, while "
                  "torch.autocast on CPU runs only the matmuls in bfloat16 and keeps the float32 residual "
                  "stream, so the roundings sit in different places: a difference of the two programs, the "
                  "same under every setting, not rounding noise. Bound: 8 bfloat16 eps (6.25e-2). " + _SWEEP
                  + "gpt-small 2.99e-2 to 3.00e-2 (3.8 eps): margin 2.1x."),
    )
}
"""The cross-framework tolerance table, one entry per (dtype, quantity)."""


def tolerance_for(dtype: str, quantity: str = "grads") -> Tolerance:
    """The :data:`TOLERANCES` entry of ``(dtype, quantity)``; ``grads`` is the tensor tolerance.

    Raises:
        ValueError: an unknown dtype or quantity (the message names the known ones).
    """
    if quantity not in QUANTITIES:
        raise ValueError(f"no cross-framework tolerance for quantity {quantity!r}; known: {list(QUANTITIES)}")
    try:
        return TOLERANCES[(str(dtype), quantity)]
    except KeyError:
        raise ValueError(f"no cross-framework tolerance for dtype {dtype!r}; known: {sorted(EPS)}") from None


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


def loss_error(test, ref, term_scale: float) -> float:
    """``|test - ref| / term_scale``: a loss difference on the scale of the terms it was summed from.

    Args:
        test, ref: 0-d losses (any float dtype; compared in float64).
        term_scale: :func:`parity.runners.torch_loss_terms.loss_term_scale` of the batch (> 0, finite).

    Returns:
        The error (inf when either loss is NaN or inf).

    Raises:
        ValueError: ``term_scale`` is not a positive finite number.
    """
    if not (np.isfinite(term_scale) and term_scale > 0):
        raise ValueError(f"term_scale must be a positive finite number, got {term_scale!r}")
    a, b = float(np.asarray(test, np.float64)), float(np.asarray(ref, np.float64))
    if not (np.isfinite(a) and np.isfinite(b)):
        return float("inf")
    return abs(a - b) / term_scale


def worst_tensor(test: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> tuple[str | None, float]:
    """``(name, error)`` of the tensor with the largest :func:`max_rel_err` (``(None, 0.0)`` when empty)."""
    errors = {name: max_rel_err({name: test[name]}, {name: ref[name]}) for name in ref}
    if not errors:
        return None, 0.0
    name = max(errors, key=errors.get)
    return name, errors[name]


def cross_check(loss_test, loss_ref, grads_test: Mapping[str, np.ndarray], grads_ref: Mapping[str, np.ndarray],
                term_scale: float, dtype: str) -> dict:
    """Compare one framework's loss and gradients with another's against :data:`TOLERANCES`.

    Args:
        loss_test, loss_ref: 0-d losses (JAX, PyTorch).
        grads_test, grads_ref: gradients by canonical name, same names and shapes.
        term_scale: the loss's term scale (:func:`parity.runners.torch_loss_terms.loss_term_scale`).
        dtype: key of the tolerance table.

    Returns:
        dict with ``loss_abs_diff`` (float), ``loss_term_scale``, ``loss_err`` (:func:`loss_error`),
        ``max_rel_err_loss`` (``|a - b| / |b|``, shown for reference, not checked),
        ``max_rel_err_grads`` (:func:`max_rel_err`), ``worst_grad`` (the tensor it comes from),
        ``tolerance_loss`` and ``tolerance`` (the loss and gradient bounds), ``loss_ok``,
        ``grads_ok`` and ``ok`` (both within their bound).

    Raises:
        ValueError: unknown dtype, a bad ``term_scale``, or different gradient names.
    """
    tol_loss, tol_grads = tolerance_for(dtype, "loss"), tolerance_for(dtype, "grads")
    if set(grads_test) != set(grads_ref):
        raise ValueError(f"gradient names differ: {sorted(set(grads_test) ^ set(grads_ref))}")
    a, b = float(np.asarray(loss_test, np.float64)), float(np.asarray(loss_ref, np.float64))
    loss_err = loss_error(a, b, term_scale)
    worst, grads_err = worst_tensor(grads_test, grads_ref)
    out = {"loss_abs_diff": abs(a - b) if np.isfinite(loss_err) else float("inf"),
           "loss_term_scale": float(term_scale), "loss_err": loss_err,
           "max_rel_err_loss": max_rel_err({"loss": np.asarray(a)}, {"loss": np.asarray(b)}),
           "max_rel_err_grads": grads_err, "worst_grad": worst,
           "tolerance_loss": tol_loss.bound, "tolerance": tol_grads.bound}
    out["loss_ok"] = bool(loss_err <= tol_loss.bound)
    out["grads_ok"] = bool(grads_err <= tol_grads.bound)
    out["ok"] = out["loss_ok"] and out["grads_ok"]
    return out


def cross_row(plan: str, dtype: str, a, b, term_scale: float | None, *, failure: str | None = None,
              grads_a: Mapping[str, np.ndarray] | None = None, grads_b: Mapping[str, np.ndarray] | None = None,
              **extra) -> dict:
    """One cross-framework row of a report: JAX's run ``a`` against PyTorch's ``b`` on one plan, by :func:`cross_check`.

    The one builder of every suite's cross-framework rows (quick, full, stress, distributed): the
    loss checked relative to ``term_scale`` (:func:`parity.runners.torch_loss_terms.loss_term_scale`), each
    gradient tensor relative to its largest entry, each against :data:`TOLERANCES` with its reason.

    Args:
        plan: the plan's name.
        dtype: key of the tolerance table.
        a, b: the two runs (anything with ``loss`` and ``grads``), or None when a case did not complete.
        term_scale: the loss's term scale; None when it could not be computed (``failure`` says why).
        failure: why the row could not be computed, recorded as its ``error``.
        grads_a, grads_b: the gradients to compare, when not ``a.grads`` / ``b.grads`` (e.g. the
            trainable entries only).
        extra: fields the row carries besides (``variant``, the meshes...), placed after ``plan``.

    Returns:
        ``{"plan", **extra, "dtype", "tolerance", "tolerance_reason", "tolerance_loss",
        "tolerance_loss_reason", ..., "ok", "error"}`` with :func:`cross_check`'s fields when both
        runs and the scale are there; ``ok`` False and ``error`` set otherwise.
    """
    tol, tol_loss = tolerance_for(dtype, "grads"), tolerance_for(dtype, "loss")
    out = {"plan": plan, **extra, "dtype": dtype, "tolerance": tol.bound, "tolerance_reason": tol.reason,
           "tolerance_loss": tol_loss.bound, "tolerance_loss_reason": tol_loss.reason,
           "loss_err": None, "loss_abs_diff": None, "loss_term_scale": term_scale,
           "max_rel_err_loss": None, "max_rel_err_grads": None, "worst_grad": None, "ok": False, "error": None}
    if a is None or b is None:
        out["error"] = failure or "a framework's case did not complete; nothing to compare"
        return out
    if term_scale is None:
        out["error"] = failure or "the loss's term scale could not be computed; nothing to compare"
        return out
    out.update(cross_check(a.loss, b.loss, a.grads if grads_a is None else grads_a,
                           b.grads if grads_b is None else grads_b, term_scale, dtype))
    return out
