"""What a runner returns: one typed result per run, with its memory measurement.

:class:`RunResult` is what :meth:`parity.runners.framework.Framework.run_plan` and
:meth:`~parity.runners.framework.Framework.run_user_stack` return in every framework;
:class:`Memory` is what the one measurement path of each framework computes
(:func:`parity.runners.jax_memory.measure_jax`, :func:`parity.runners.torch_memory.measure_torch`).

Canonical dicts map parameter names (:func:`jaxremat.models.param_shapes`) to numpy arrays in the
model's parameter dtype (``cfg.dtype``); all byte counts are ints in bytes, all times floats in
seconds (``time.perf_counter``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import time
from typing import Any, Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class Memory:
    """The memory of one training step, measured one way per framework.

    Attributes:
        saved_bytes: bytes kept in device memory by the forward pass for the backward pass
            (parameters and buffers excluded; PyTorch: saved tensors, checkpoint inputs and the
            policy's cached outputs; JAX: the non-argument saved residuals of the loss).
        offloaded_bytes: saved bytes the policy moved to host memory (0 when none).
        peak_bytes: peak bytes of one forward and backward pass (JAX: ``value_and_grad``; PyTorch:
            ``backward()`` with the AdamW state held, the optimizer's own step left out),
            parameters, gradients (and optimizer state where the step holds one) included.
        peak_activation_bytes: ``peak_bytes`` less parameters, gradients and optimizer state
            (JAX: less parameters (arguments) and gradients (outputs), ``2 x`` parameter bytes;
            PyTorch: less MemTracker's ``PARAM``, ``BUFFER``, ``GRAD`` and ``OPT``, or on CUDA the
            increase over what was allocated before the step); None where the peak's breakdown
            does not say.
        saved_source: how ``saved_bytes`` was counted.
        peak_source: how ``peak_bytes`` was measured.
        peak_activation_source: how ``peak_activation_bytes`` was derived from the peak.
        peak_breakdown: the peak's parts, name -> bytes (JAX: XLA's ``argument_bytes``,
            ``output_bytes``, ``alias_bytes``, ``temp_bytes``, ``generated_code_bytes``,
            ``peak_bytes``; PyTorch CPU: MemTracker categories; CUDA: ``allocated_before``,
            ``step_increase``).
        residuals: the saved tensors behind ``saved_bytes`` (JAX: dicts of
            :class:`jaxremat.memory.ResidualRecord` fields -- shape, dtype, bytes, description,
            is_argument, memory; PyTorch: :class:`torchref.memory.SavedActivationRecorder` records).
        saved_names: sorted activation names the policy cached (PyTorch; None in JAX).
        device_peak: the GPU allocator's peak of one step (``peak_bytes``, ``bytes_in_use_before``,
            ``source``: :func:`jaxremat.memory.device_peak_bytes`), None without a GPU or where
            the caller does not measure it.
    """

    saved_bytes: int
    offloaded_bytes: int
    peak_bytes: int
    peak_activation_bytes: int | None
    saved_source: str
    peak_source: str
    peak_activation_source: str
    peak_breakdown: Mapping[str, int]
    residuals: tuple = ()
    saved_names: tuple[str, ...] | None = None
    device_peak: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One run of one plan: its numbers for the bitwise checks, its memory and its step time.

    Attributes:
        loss: 0-d numpy array of the first step's loss (``cfg.dtype``).
        grads: canonical dict of the first step's gradients (stress variants: their own layout).
        trained: canonical dict of the weights after the optimizer steps; None when not trained
            (JAX op by op skips training: a step costs a second of Python dispatch).
        mode: ``"jit"`` or ``"eager"``.
        reverse_loop_grads: gradients of the hand-written reverse segment loop (canonical dict),
            None when it did not run.
        memory: the step's :class:`Memory`; None where the runner does not measure memory
            (the frozen and user-stack stress runners, a loss-and-gradients-only run).
        step_time_s: median seconds of one timed training step; None when not timed.
        step_times_s: every timed step, seconds, in order; None when not timed.
        dots_compiled: matrix products in the compiled loss+gradient program's text (JAX; shows
            whether XLA kept the recompute), None elsewhere.
        state: non-parameter state after training, name -> numpy array (user-stack stress:
            running statistics and step counters; ``{}`` without any), None elsewhere.
        frozen_grads_none: PyTorch frozen stress: every frozen parameter got no ``.grad``; None
            elsewhere (JAX has no None gradient).
        training_steps: one :class:`TrainingStep` per optimizer step of the training run behind
            ``trained``, in order; None where the runner does not record them. When two runs' trained
            weights differ, they say at which step and in what the runs parted
            (:func:`training_divergence`).
    """

    loss: np.ndarray
    grads: Mapping[str, np.ndarray]
    trained: Mapping[str, np.ndarray] | None
    mode: str
    reverse_loop_grads: Mapping[str, np.ndarray] | None = None
    memory: Memory | None = None
    step_time_s: float | None = None
    step_times_s: tuple[float, ...] | None = None
    dots_compiled: int | None = None
    state: Mapping[str, np.ndarray] | None = None
    frozen_grads_none: bool | None = None
    training_steps: tuple[TrainingStep, ...] | None = None


@dataclasses.dataclass(frozen=True)
class TrainingStep:
    """One optimizer step of a training run, as digests of its raw bytes.

    Attributes:
        grads: :func:`digest` of the step's gradients (the tensors in the model's parameter order).
        weights: :func:`digest` of the weights after the step's update.
        threads: the framework's intra-op thread count during the step (PyTorch:
            ``torch.get_num_threads()``), None where not read (JAX).
    """

    grads: str
    weights: str
    threads: int | None = None


def digest(arrays) -> str:
    """A 16-hex-digit BLAKE2b digest of ``arrays``' raw bytes, shapes and dtypes, in the order given:
    equal digests mean bitwise-equal arrays (up to a 2^-64 chance of a collision)."""
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        a = np.asarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())  # before ascontiguousarray, which makes a 0-d array 1-d
        a = np.ascontiguousarray(a)
        h.update(a.view(np.uint8).reshape(-1).data if a.size else b"")
    return h.hexdigest()


def training_divergence(steps: tuple[TrainingStep, ...] | None,
                        ref_steps: tuple[TrainingStep, ...] | None) -> dict | None:
    """Where two training runs of the same weights and tokens first parted: ``{"step": k (1-based), "first":
    "gradients" or "weights", "threads": [reference's, this run's]}``; None when either run has no record, the
    records differ in length, or every step's digests are equal.

    ``"gradients"``: step k's gradients already differ (the forward or backward pass of step k, on weights
    that were still bitwise equal); ``"weights"``: the gradients are equal and the update made them differ.
    """
    if not steps or not ref_steps or len(steps) != len(ref_steps):
        return None
    for k, (s, r) in enumerate(zip(steps, ref_steps), start=1):
        if s.grads != r.grads or s.weights != r.weights:
            return {"step": k, "first": "gradients" if s.grads != r.grads else "weights",
                    "threads": [r.threads, s.threads]}
    return None


@dataclasses.dataclass(frozen=True)
class TrainRun:
    """A training run of one plan over a sequence of batches (:meth:`parity.runners.framework.Framework.train`).

    Attributes:
        losses: ``(steps,)`` array in the model's dtype: each step's loss, before its update.
        trained: canonical dict of the weights after the last step.
        step_times_s: seconds of each step (loss, gradients and the optimizer update), in order; the
            first includes compiling the update (JAX under ``jit``).
        memory: the :class:`Memory` of one steady-state step (optimizer state held), None when not measured.
        mode: the mode it ran in.
    """

    losses: np.ndarray
    trained: Mapping[str, np.ndarray]
    step_times_s: tuple[float, ...]
    memory: Memory | None
    mode: str


def kept_and_offloaded(tensors: list[dict]) -> dict:
    """``{"kept", "offloaded", "tensors"}`` of one block's kept tensors (``{"name", "shape", "bytes",
    "memory"}`` each, ``memory`` ``"device"`` or ``"host"``): the sorted names kept on the device and
    moved to host memory (:meth:`parity.runners.framework.Framework.kept_names`)."""
    kept = sorted({t["name"] for t in tensors if t["memory"] == "device"}, key=str)
    off = sorted({t["name"] for t in tensors if t["memory"] == "host"}, key=str)
    return {"kept": kept, "offloaded": off, "tensors": tensors}


def timed(fn, repeats: int) -> dict:
    """``step_time_s`` (median) and ``step_times_s`` (every timed call), seconds, after one warm-up."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"step_time_s": float(statistics.median(times)), "step_times_s": [float(t) for t in times]}


def memory_fields(memory) -> dict:
    """A depth-sweep case's memory fields from one :class:`parity.runners.result.Memory`."""
    return {"saved_bytes": memory.saved_bytes, "offloaded_bytes": memory.offloaded_bytes,
            "peak_bytes": memory.peak_bytes, "peak_activation_bytes": memory.peak_activation_bytes,
            "peak_source": memory.peak_source, "peak_activation_source": memory.peak_activation_source}
