"""Predicted vs measured memory for every suite case (the per-layer model of the family's
activation account, :mod:`jaxremat.models.gpt.activation`, beside the runners' measurements).

Saved bytes are compared directly (both are counts of the same tensors). Peak *activation* bytes
are the measured step peak less what is not an activation, as the one measurement path of each
framework computes them (:attr:`parity.runners.result.Memory.peak_activation_bytes`): in JAX the
compiled program's arguments and outputs that are parameters and their gradients (2 x parameter
bytes); in PyTorch MemTracker's ``PARAM``, ``BUFFER``, ``GRAD`` and ``OPT`` categories (on CUDA:
the increase over what was allocated before the step). A gap above :data:`GAP_LIMIT` is flagged.

The account covers the block of a family that has one (:attr:`jaxremat.models.ModelSpec.activation_account`:
GPT) without dropout and without a policy (a segment plan whose segments name policies,
``plan(3+save_dots,2)``, has one); other cases get None, shown as ``-`` in the report: the account
lists the tensors of a block without remat, not what a policy keeps.
"""

from __future__ import annotations

from jaxremat.models import get_model

from parity.runners.result import RunResult

GAP_LIMIT = 0.10
"""A prediction farther than this fraction of the measurement from it is flagged (reports mark it ``!``)."""


def gap(predicted: int | None, measured: int | None) -> float | None:
    """``(predicted - measured) / measured`` (a fraction), or None when either is missing or the measurement is 0."""
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


def gap_flags(saved_gap: float | None, peak_gap: float | None) -> list[str]:
    """One line per gap above :data:`GAP_LIMIT`: ``"saved bytes predicted +12% off the measurement"``."""
    return [f"{what} predicted {g:+.0%} off the measurement" for what, g in
            (("saved bytes", saved_gap), ("peak activation bytes", peak_gap)) if g is not None and abs(g) > GAP_LIMIT]


def measured_peak_activation(res: RunResult) -> int | None:
    """The measured step peak less parameters, gradients and optimizer state
    (:attr:`parity.runners.result.Memory.peak_activation_bytes`); None where not measured."""
    return res.memory.peak_activation_bytes if res.memory is not None else None


def attach_predictions(case: dict, framework: str, cfg, batch: int, seq: int, plan, res: RunResult) -> None:
    """Add predicted/measured saved and peak-activation bytes, their gaps and flags to ``case``."""
    case.update(predicted_saved_bytes=None, saved_gap=None, peak_activation_bytes=None,
                predicted_peak_activation_bytes=None, peak_gap=None, prediction_flags=[])
    spec = get_model(cfg.arch)
    if spec.activation_account is None or cfg.dropout > 0 or not plan.saves_nothing:
        return
    am = spec.load("activation_account")
    try:
        saved = am.predict_saved_bytes(framework, cfg, batch, seq, plan.schedule)
        peak = am.predict_peak_activation_bytes(framework, cfg, batch, seq, plan.schedule)
    except ValueError:  # a configuration the per-layer model does not cover
        return
    measured_peak = measured_peak_activation(res)
    case.update(predicted_saved_bytes=saved, saved_gap=gap(saved, res.memory.saved_bytes),
                peak_activation_bytes=measured_peak, predicted_peak_activation_bytes=peak,
                peak_gap=gap(peak, measured_peak))
    case["prediction_flags"] = gap_flags(case["saved_gap"], case["peak_gap"])
