"""A real fine-tuning run, every plan against ``none`` step by step: ``python -m parity finetune``.

Each plan trains the same weights for N AdamW steps on N fixed batches (the batch of step ``s`` is
fixed by ``s``: :func:`parity.inputs.pretrained.preset_batches`), with dropout at the preset's rate,
in each framework's measured mode (JAX under ``jit``, PyTorch eager), through the framework's
:meth:`parity.runners.framework.Framework.train`. Each run is a case of the one case loop
(:func:`parity.cases.loop.run_cases`), checked against ``none`` in the same framework:

* ``losses_bitwise_equal``: the loss of every step has the raw bits of ``none``'s (``first_differing_step``
  otherwise);
* ``weights_bitwise_equal``: the weights after the last step have the bytes of ``none``'s (a SHA-256
  digest of the canonical arrays, ``weights_digest``; where both runs are at hand, the ULP distance);
* the peak memory of one steady-state step and the step times (the first step, which compiles the
  optimizer update, left out of the median).

The frameworks draw different dropout masks, so JAX and PyTorch are compared on ``none`` with dropout
off (:func:`cross_rows`): the loss at every step and the trained weights, each against its bound
(:data:`parity.checks.compare.TOLERANCES`; :func:`trained_bound` for the weights, measured).

A run interrupted by Ctrl-C keeps its finished cases in ``finetune.json`` (``complete: false``); the
same command again continues from them (:func:`resumable`), running only the cases not finished.
"""

from __future__ import annotations

# Deferred imports: safetensors (the dev/minilm extra) loads where none's trained weights are written or read.

import dataclasses
import hashlib
from pathlib import Path
from typing import Callable

import numpy as np

from jaxremat.spec.plan import RematPlan, parse_plan

from parity.cases.record import base_case, overhead_range
from parity.checks.compare import compare_bitwise, loss_error, max_rel_err, tolerance_for
from parity.inputs.model_preset import ModelPreset
from parity.inputs.train import AdamWConfig
from parity.runners.framework import FRAMEWORK_NAMES, FRAMEWORKS, RunOptions, get_framework
from parity.runners.result import TrainRun

FINETUNE_PLANS = ("none", "full", "every_k(2)", "sqrt", "segments(3)")
"""The plans of the fine-tuning run (``--schedules`` overrides)."""

SCHEMA_VERSION = 1
"""finetune.json schema (docs/report-schema.md)."""

FINGERPRINT_KEYS = ("model", "config", "batch_size", "seq_len", "steps", "hparams", "seed", "plans", "frameworks")
"""What must match for a new run to continue an interrupted one."""


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """What one fine-tuning run covers.

    Attributes:
        preset: the model preset (a real checkpoint: its weights, tokenizer and batch shape).
        plans: the plans, parsed (``none`` first; added if missing).
        frameworks: names of :data:`parity.runners.framework.FRAMEWORKS`.
        steps: AdamW steps N, one fixed batch each.
        hparams: the AdamW settings (``steps`` is replaced by :attr:`steps`).
        seed: the weights' (random presets) and the dropout seed; batch ``s`` is the data's group ``s``.
    """

    preset: ModelPreset
    plans: tuple[RematPlan, ...]
    frameworks: tuple[str, ...]
    steps: int
    hparams: AdamWConfig
    seed: int = 0

    @property
    def dropout(self) -> float:
        """The rate the plans train at: the preset's highest (the checkpoint's own: 0.1 for MiniLM)."""
        return max(self.preset.dropouts or (self.preset.config.dropout,))

    def plan_list(self) -> list[tuple[str, RematPlan]]:
        """``[(name, plan)]`` with ``none`` first, each resolved at the model's depth (ValueError otherwise)."""
        out = {p.name: p for p in (parse_plan("none"), *self.plans)}
        for p in out.values():
            p.segments_for(self.preset.config.n_layer)
        return list(out.items())


def weights_digest(weights) -> str:
    """SHA-256 (hex) of canonical arrays, names sorted: equal digests, equal bytes."""
    h = hashlib.sha256()
    for name in sorted(weights):
        arr = np.ascontiguousarray(weights[name])
        h.update(name.encode())
        h.update(str(arr.dtype).encode() + str(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def loss_bits(losses: np.ndarray) -> list[str]:
    """Each loss as the hex of its raw bits (report.json keeps them exact)."""
    return [np.asarray(x).tobytes().hex() for x in np.asarray(losses)]


@dataclasses.dataclass(frozen=True)
class Finished:
    """A case finished in an earlier, interrupted run of the same settings: its record, no weights."""

    record: dict


def _median_time(times) -> float | None:
    steady = list(times[1:]) or list(times)  # the first step compiles the update (JAX under jit)
    return float(np.median(steady)) if steady else None


class FinetuneCases:
    """The fine-tuning run at one dropout rate as a case set of :func:`parity.cases.loop.run_cases`.

    ``none`` runs once (no determinism re-run: N steps are costly, and every plan is checked against it
    step by step); a plan whose ``none`` failed is an error. ``finished`` holds the records of cases an
    interrupted run finished (:func:`resumable`); ``on_progress(case)`` sees the running case after
    each step (its ``losses`` so far), so a Ctrl-C keeps them.
    """

    rerun_reference = False

    def __init__(self, config: FinetuneConfig, cfg, params, batches, weights_dir: Path,
                 finished: dict | None = None, on_progress: Callable[[dict], None] | None = None):
        self.config, self.cfg, self.params, self.batches = config, cfg, params, batches
        self.weights_dir, self.finished, self.on_progress = Path(weights_dir), finished or {}, on_progress
        self.running: dict | None = None

    def key(self, framework, mode, name) -> tuple:
        return (framework, mode, name, float(self.cfg.dropout))

    def new_case(self, framework, mode, name, plan):
        case = {**base_case(framework, mode, name, self.config.preset.name, self.cfg), "steps": self.config.steps,
                "losses": [], "loss_bits": [], "losses_bitwise_equal": None, "first_differing_step": None,
                "weights_digest": None, "weights_bitwise_equal": None, "weights_max_ulp": None,
                "saved_bytes": None, "peak_bytes": None, "peak_activation_bytes": None, "peak_activation_ratio": None,
                "peak_source": None, "step_time_s": None, "step_times_s": None, "time_overhead": None,
                "time_overhead_range": None, "resumed": False}
        self.running = case
        return case

    def label(self, framework, mode, name):
        return f"{framework}/{mode} dropout {self.cfg.dropout:g} {name}"

    def run(self, framework, mode, plan, *, again):
        done = self.finished.get(self.key(framework, mode, plan.name))
        if done is not None:
            return Finished(done)
        case = self.running

        def on_step(step, loss, seconds):
            case["losses"].append(loss)
            if self.on_progress is not None:
                self.on_progress(case)

        options = RunOptions(hparams=dataclasses.replace(self.config.hparams, steps=self.config.steps),
                             seed=self.config.seed)
        run = get_framework(framework).train(mode, self.cfg, self.params, self.batches, plan, options, on_step)
        if plan.name == "none":  # kept for the ULP distance of a plan that differs, in this run or the next
            from safetensors.numpy import save_file

            self.weights_dir.mkdir(parents=True, exist_ok=True)
            save_file({k: np.ascontiguousarray(v) for k, v in run.trained.items()}, str(self._none_file(framework, mode)))
        return run

    def _none_file(self, framework, mode) -> Path:
        return none_weights_file(self.weights_dir, framework, mode, self.cfg.dropout)

    def check(self, case, framework, mode, plan, res, ref, again):
        if isinstance(res, Finished):
            case.update(res.record, resumed=True)
            return
        case.update(_run_fields(res))
        ref_bits = ref.record["loss_bits"] if isinstance(ref, Finished) else loss_bits(ref.losses)
        differ = [i for i, (a, b) in enumerate(zip(case["loss_bits"], ref_bits)) if a != b]
        case["losses_bitwise_equal"] = not differ and len(case["loss_bits"]) == len(ref_bits)
        case["first_differing_step"] = differ[0] if differ else None
        ref_digest = ref.record["weights_digest"] if isinstance(ref, Finished) else weights_digest(ref.trained)
        case["weights_bitwise_equal"] = case["weights_digest"] == ref_digest
        if not case["weights_bitwise_equal"]:
            case["weights_max_ulp"] = self._ulp(framework, mode, res.trained, ref)
        ref_act = ref.record["peak_activation_bytes"] if isinstance(ref, Finished) else (
            ref.memory.peak_activation_bytes if ref.memory else None)
        if case["peak_activation_bytes"] and ref_act:
            case["peak_activation_ratio"] = case["peak_activation_bytes"] / ref_act
        ref_times = ref.record["step_times_s"] if isinstance(ref, Finished) else list(ref.step_times_s)
        if case["step_time_s"] and ref_times:
            case["time_overhead"] = case["step_time_s"] / _median_time(ref_times)
            case["time_overhead_range"] = overhead_range(case["step_times_s"][1:], ref_times[1:])
        saves = plan.name == "none" or case["peak_activation_ratio"] is None or case["peak_activation_ratio"] < 1.0
        case["status"] = "pass" if case["losses_bitwise_equal"] and case["weights_bitwise_equal"] and saves else (
            "fail" if not (case["losses_bitwise_equal"] and case["weights_bitwise_equal"]) else "no_saving")

    def _ulp(self, framework, mode, trained, ref) -> int | None:
        if not isinstance(ref, Finished):
            return compare_bitwise(trained, ref.trained).max_ulp
        weights = load_none_weights(self.weights_dir, framework, mode, self.cfg.dropout)
        return None if weights is None else compare_bitwise(trained, weights).max_ulp


def none_weights_file(weights_dir: Path, framework: str, mode: str, dropout: float) -> Path:
    """Where ``none``'s trained weights of one framework, mode and dropout rate are kept (safetensors)."""
    return Path(weights_dir) / f"{framework}_{mode}_dropout-{dropout:g}_none_weights.safetensors"


def load_none_weights(weights_dir: Path, framework: str, mode: str, dropout: float) -> dict | None:
    """``none``'s kept trained weights (:func:`none_weights_file`), None when the file is not there."""
    path = none_weights_file(weights_dir, framework, mode, dropout)
    if not path.is_file():
        return None
    from safetensors.numpy import load_file

    return load_file(str(path))


def _run_fields(run: TrainRun) -> dict:
    mem = run.memory
    return {"losses": [float(x) for x in run.losses], "loss_bits": loss_bits(run.losses),
            "weights_digest": weights_digest(run.trained),
            "saved_bytes": None if mem is None else int(mem.saved_bytes),
            "peak_bytes": None if mem is None else int(mem.peak_bytes),
            "peak_activation_bytes": None if mem is None else mem.peak_activation_bytes,
            "peak_source": None if mem is None else mem.peak_source,
            "step_time_s": _median_time(run.step_times_s), "step_times_s": list(run.step_times_s)}


TRAINED_FIRST_STEP = 256.0
"""The cross-framework bound of the weights after one AdamW step, in eps of the dtype.

Measured on minilm-l6 (B=8, T=128, float32, ``none`` without dropout, lr 2e-5;
``python -m parity.experiments.finetune_growth --steps 1,2,4,16``, docs/finetune.md): the largest
relative error per tensor of the trained weights, JAX against PyTorch, is 5.73e-6 (48 eps) after
1 step, 5.85e-6 (49) after 2, 7.96e-6 (67) after 4 and 1.13e-5 (95) after 16. Most of it comes with
the first step (Adam's first update is about ``lr * sign(g)`` per entry, so a gradient entry near
zero whose sign differs moves its weight by up to ``2 lr``); 256 eps is 5.3x the measured 48, the
margin the gradients' bound keeps over the tolerance sweep (docs/framework-differences.md, section 11).
"""

TRAINED_GROWTH = 16.0
"""The bound's growth per further step, in eps of the dtype: 5.2x the measured (95 - 48) / 15 = 3.1
eps per step from 1 to 16 steps (:data:`TRAINED_FIRST_STEP` gives the measurement)."""


def trained_bound(dtype: str, steps: int) -> float:
    """The bound of the trained weights' largest relative error after ``steps`` steps:
    ``(TRAINED_FIRST_STEP + TRAINED_GROWTH * (steps - 1)) * eps(dtype)``."""
    return (TRAINED_FIRST_STEP + TRAINED_GROWTH * (steps - 1)) * float(np.finfo(np.dtype(dtype)).eps)


def cross_rows(losses: dict, trained: dict, cfg, scale: float, steps: int) -> list[dict]:
    """JAX against PyTorch on ``none`` without dropout: the loss at every step (over the loss's term scale of
    the first batch, :func:`parity.runners.framework.loss_term_scale`) and the trained weights (largest
    relative error per tensor, :func:`parity.checks.compare.max_rel_err`), each against its bound.

    Args:
        losses: ``{framework: (steps,) losses}`` of ``none`` at dropout 0.
        trained: ``{framework: canonical trained weights}`` of the same runs (missing: not compared).
        cfg: the model configuration (its dtype keys the tolerance table).
        scale: the loss's term scale.
        steps: N.

    Returns:
        one row: ``loss_err_per_step`` (list), ``loss_err`` (the largest), ``tolerance_loss``,
        ``trained_max_rel_err``, ``tolerance_trained`` (:func:`trained_bound` of N), ``ok``, ``error``.
    """
    a_fw, b_fw = FRAMEWORK_NAMES
    tol = tolerance_for(cfg.dtype, "loss")
    row = {"plan": "none", "dtype": cfg.dtype, "dropout": 0.0, "steps": steps, "loss_term_scale": scale,
           "tolerance_loss": tol.bound, "tolerance_loss_reason": tol.reason, "loss_err_per_step": None, "loss_err": None,
           "trained_max_rel_err": None, "tolerance_trained": None, "max_rel_err_grads": None, "tolerance": None,
           "ok": False, "error": None}
    if any(losses.get(f) is None or trained.get(f) is None for f in (a_fw, b_fw)):
        row["error"] = "a framework's none without dropout did not complete (or its weights file is gone); nothing to compare"
        return [row]
    errs = [loss_error(float(x), float(y), scale) for x, y in zip(losses[a_fw], losses[b_fw])]
    bound = trained_bound(cfg.dtype, steps)
    err = max_rel_err(trained[a_fw], trained[b_fw])
    row.update(loss_err_per_step=errs, loss_err=max(errs), trained_max_rel_err=err, tolerance_trained=bound,
               max_rel_err_grads=err, tolerance=bound, ok=bool(max(errs) <= tol.bound and err <= bound))
    return [row]


def resumable(previous: dict | None, fingerprint: dict) -> tuple[dict, str | None]:
    """The finished cases of an interrupted run to continue from, or why it cannot be continued.

    Returns:
        ``(finished, why_not)``: ``finished`` maps ``(framework, mode, plan, dropout)`` to a finished case
        record; ``why_not`` is None when ``previous`` is an interrupted run of the same settings (or there
        is none), else one line naming the first setting that differs.
    """
    if not previous or previous.get("complete") is not False:
        return {}, None
    for k in FINGERPRINT_KEYS:
        if previous.get(k) != fingerprint[k]:
            return {}, (f"it holds an interrupted run with another {k} ({previous.get(k)!r}, not {fingerprint[k]!r})")
    done = {(c["framework"], c["mode"], c["plan"], float(c["dropout"])): c for c in previous.get("cases", [])
            if c.get("status") in ("pass", "fail", "no_saving") and c.get("weights_digest")}
    return done, None
