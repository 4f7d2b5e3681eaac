"""Does a case's measured memory realize the saving its plan promises? (both frameworks)

A plan *promises* a saving when it keeps fewer activation bytes for the backward pass than
``none`` does (its saved residuals, measured before any compiler runs, at least
:data:`MIN_PROMISED` below ``none``'s). It *realizes* it when the measured peak activation of the
training step, what the device sees (JAX: the compiled program's memory; PyTorch: the allocator's
tracked peak), is at least :data:`MIN_REALIZED` below ``none``'s in the same framework, mode and
dtype. A smaller difference is the size of a change in buffer layout, not a saving: measured on
``gpt-tiny``'s width at N=2, ``every_k(2)`` (one checkpointed segment over the whole stack, which
the chain model says cannot save) came out 1,016 B lower and ``none`` 128 B higher after a
rendering change (loop counters and predicates), turning a peak 1.6% above ``none``'s into one
0.6% below it. A plan that promises and
does not realize gets status ``no_saving``: the run exits non-zero, and the case carries the cause
in one line.

Causes, in the order they are checked:

* the schedule itself predicts no saving at this depth (the chain model's peak of the plan is not
  below ``none``'s: e.g. ``every_k(k)`` with k >= N recomputes the whole stack at once);
* the framework's own (:meth:`parity.runners.framework.Framework.no_saving_cause`): JAX, the
  compiled program holds no more matrix products than ``none``'s, so XLA removed the recompute
  (merged it with the forward pass); PyTorch, at the step's peak no saved activation is live
  (MemTracker's ``ACT`` category under :data:`parity.runners.torch_framework.NO_LIVE_ACTIVATION` of
  ``none``'s saved bytes) in the plan's step nor in ``none``'s: the peak is set after the blocks'
  backward (by a temporary such as the dense gradient of a large embedding), so the activations
  remat removes never reach it; otherwise the recompute is in the program, but the scheduler or
  allocator kept buffers live as long as without remat.
"""

from __future__ import annotations

from jaxremat.models.gpt import activation as am
from jaxremat.spec import parse_schedule

from parity.checks.predictions import measured_peak_activation
from parity.runners.framework import get_framework
from parity.runners.result import RunResult

MIN_PROMISED = 0.01
"""A plan promises a saving when its saved residual bytes are at least this fraction below ``none``'s."""

MIN_REALIZED = 0.01
"""A plan realizes its saving when its measured peak activation is at least this fraction below ``none``'s."""

STATUS = "no_saving"
"""The status of a case whose plan promises a saving that its measured peak does not realize."""


def _predicted_ratio(framework: str, cfg, batch: int, seq: int, plan) -> float | None:
    if not plan.saves_nothing:  # the chain model counts segment boundaries only
        return None
    try:
        pred = am.predict_peak_activation_bytes(framework, cfg, batch, seq, plan.schedule)
        ref = am.predict_peak_activation_bytes(framework, cfg, batch, seq, parse_schedule("none"))
    except (ValueError, KeyError, AttributeError):
        return None
    return pred / ref if ref else None


def _cause(framework: str, res: RunResult, ref: RunResult, ratio: float, predicted_ratio: float | None,
           n_layer: int, batch: int, seq: int) -> str:
    below = (f" (measured peak activation {1 - ratio:.1%} below none's, under the {MIN_REALIZED:.0%} a saving "
             "must reach)") if ratio < 1.0 else ""
    if predicted_ratio is not None and predicted_ratio >= 1.0:
        return (f"the schedule predicts no saving at N={n_layer}: its largest recomputed segment is as large as "
                f"the stack (chain-model peak {predicted_ratio:.2f} x none's); use more, shorter segments{below}")
    return get_framework(framework).no_saving_cause(res, ref, batch, seq) + below


def attach_saving(case: dict, framework: str, cfg, batch: int, seq: int, plan, res: RunResult, ref: RunResult) -> None:
    """Add ``case["saving"]`` and turn a passing case whose promised saving is not realized into ``no_saving``.

    Args:
        case: the suite's case dict (``saved_bytes``, ``peak_bytes``, ``status`` filled in).
        framework: ``"jax"`` or ``"torch"``.
        cfg: the case's model configuration.
        batch, seq: the case's batch size and sequence length (for the chain-model prediction).
        plan: the case's :class:`jaxremat.spec.plan.RematPlan`.
        res, ref: the runner results of this plan and of ``none`` (same framework, mode, dtype).

    ``case["saving"]``: ``promised`` (bool), ``saved_ratio`` (saved bytes over none's),
    ``peak_activation_ratio`` (measured peak activation over none's, None where unmeasured),
    ``predicted_peak_activation_ratio`` (the chain model's, None where it does not apply),
    ``realized`` (bool or None) and ``cause`` (one line, None when realized or not promised).
    """
    saved = res.memory.saved_bytes if res.memory is not None else None
    saved_ref = ref.memory.saved_bytes if ref.memory is not None else None
    promised = bool(saved_ref) and saved is not None and saved <= (1.0 - MIN_PROMISED) * saved_ref
    act, act_ref = measured_peak_activation(res), measured_peak_activation(ref)
    ratio = act / act_ref if act is not None and act_ref else None
    predicted = _predicted_ratio(framework, cfg, batch, seq, plan)
    realized = None if not promised or ratio is None else ratio <= 1.0 - MIN_REALIZED
    cause = None
    if realized is False:
        cause = _cause(framework, res, ref, ratio, predicted, cfg.n_layer, batch, seq)
        if case.get("status") == "pass":
            case["status"] = STATUS
    case["saving"] = {"promised": promised, "saved_ratio": saved / saved_ref if saved_ref else None,
                      "peak_activation_ratio": ratio, "predicted_peak_activation_ratio": predicted,
                      "realized": realized, "cause": cause}
