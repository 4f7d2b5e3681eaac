"""The one door from the harness into JAX and PyTorch: the :class:`Framework` protocol and its registry.

Every case set, command and check of the harness reaches a framework through
:func:`get_framework` and the verbs of the object it returns; none tests a framework's name or
imports a framework itself. Each framework has one module under ``parity/runners/``
(:mod:`parity.runners.jax_framework`, :mod:`parity.runners.torch_framework`) that imports it at the
top and defines ``FRAMEWORK``, an object satisfying :class:`Framework`; the registry imports that
module on first use, so a one-framework run never loads the other (as the model registry,
:mod:`jaxremat.models.registry`, loads a family's parts on first use).

What is known about a framework without loading it -- its name, label and modes -- is its
:class:`FrameworkInfo`, in :data:`FRAMEWORKS`. Adding a framework is one module with a
``FRAMEWORK`` object and one :data:`FRAMEWORKS` entry (docs/extending.md).

Canonical dicts map parameter names (:func:`jaxremat.models.param_shapes`) to numpy arrays; byte
counts are ints in bytes, times floats in seconds.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any, Mapping, Protocol

import numpy as np

from parity.runners.result import RunResult, TrainRun

if TYPE_CHECKING:  # annotations only: this module loads no framework
    from jaxremat.models import TransformerConfig
    from jaxremat.spec.plan import RematPlan
    from jaxremat.spec.policies import Policy
    from parity.cases.stress_user import UserStack
    from parity.inputs.train import AdamWConfig


@dataclasses.dataclass(frozen=True)
class FrameworkInfo:
    """What the harness knows of a framework before loading it.

    Attributes:
        name: the name the command line and the reports use (``"jax"``, ``"torch"``).
        label: the name in prose (``"JAX"``, ``"PyTorch"``).
        modes: the modes a case runs in, the compiled one first (``("jit", "eager")``: JAX under
            ``jax.jit`` and op by op; ``("eager",)``: PyTorch).
        module: the module defining ``FRAMEWORK``, imported on first use.
        cpu_peak_source: where a step's peak comes from without a GPU.
        device_peak_source: where it comes from on a GPU (the device's own counters).
        fresh_process_per_device_case: the GPU pass runs each case in a fresh process (the
            device's high-water mark cannot be reset in-process).
        reference: the framework the other is checked against where one is needed (the loss's
            term scale of the cross-framework rows is computed by its loss function).
        cannot_keep: activation names a policy of this framework cannot keep (PyTorch replays a
            checkpointed segment from its start, so ``block_input`` is never a cached output).
        multi_process_meshes: the distributed suite can spread this framework's meshes over several
            processes (``--processes``: JAX, ``jax.distributed``).
        not_read_in_block: activation names a checkpointed GPT block never keeps in this framework,
            whatever its policy declares: JAX keeps a tagged value only when the backward pass reads
            it, and inside a block nothing reads ``mlp_out`` (the block's output is the next
            segment's boundary); PyTorch's selective checkpoint caches every output a policy names.
    """

    name: str
    label: str
    modes: tuple[str, ...]
    module: str
    cpu_peak_source: str
    device_peak_source: str
    fresh_process_per_device_case: bool
    reference: bool = False
    cannot_keep: frozenset = frozenset()
    not_read_in_block: frozenset = frozenset()
    multi_process_meshes: bool = False

    def check_policies(self, plan: "RematPlan") -> None:
        """Refuse a plan whose policies keep (or offload) a name this framework cannot keep.

        Raises:
            ValueError: the message names the plan, the name and the fix.
        """
        for p in plan.policies:
            bad = sorted(self.cannot_keep & (p.kept_names | p.offloaded_names))
            if bad and not p.save_everything:
                others = ",".join(f for f in FRAMEWORKS if f != self.name)
                raise ValueError(f"plan {plan.name!r}: {self.label} cannot keep {bad[0]!r} (a checkpointed segment "
                                 f"is replayed from its start); drop it or run --frameworks {others}")

    @property
    def measured_mode(self) -> str:
        """The mode whose program is measured and timed (the first of :attr:`modes`)."""
        return self.modes[0]


FRAMEWORKS: dict[str, FrameworkInfo] = {
    "jax": FrameworkInfo("jax", "JAX", ("jit", "eager"), "parity.runners.jax_framework",
                         cpu_peak_source="XLA compiled memory_analysis (cpu)",
                         device_peak_source="jax.Device.memory_stats()['peak_bytes_in_use'] (fresh process per case)",
                         fresh_process_per_device_case=True, not_read_in_block=frozenset({"mlp_out"}),
                         multi_process_meshes=True),
    "torch": FrameworkInfo("torch", "PyTorch", ("eager",), "parity.runners.torch_framework",
                           cpu_peak_source="torchref.live_bytes / MemTracker (cpu)",
                           device_peak_source="torch.cuda.max_memory_allocated (peak reset between cases)",
                           fresh_process_per_device_case=False, reference=True,
                           cannot_keep=frozenset({"block_input"})),
}
"""Every framework the harness runs, in report order."""

FRAMEWORK_NAMES = tuple(FRAMEWORKS)


def framework_modes(frameworks=FRAMEWORK_NAMES) -> list[tuple[str, str]]:
    """Every ``(framework, mode)`` of ``frameworks``, in report order: ``[("jax", "jit"), ("jax", "eager"), ("torch", "eager")]``."""
    return [(f, m) for f in FRAMEWORK_NAMES if f in frameworks for m in FRAMEWORKS[f].modes]


def reference_framework() -> str:
    """The name of the reference framework (:attr:`FrameworkInfo.reference`): PyTorch, ``torchref``."""
    return next(f.name for f in FRAMEWORKS.values() if f.reference)


def loss_term_scale(cfg: "TransformerConfig", params: Mapping[str, np.ndarray], tokens: np.ndarray) -> float:
    """The loss's term scale of the cross-framework loss check, computed by the reference framework's own loss
    function (:func:`parity.runners.torch_loss_terms.loss_term_scale`, reached through the reference's
    ``FRAMEWORK``: a verb of the reference alone, not of the protocol)."""
    return get_framework(reference_framework()).loss_term_scale(cfg, params, tokens)


def check_frameworks(option: str, names) -> tuple[str, ...]:
    """``names`` (each given once) if every one is a registered framework.

    Raises:
        ValueError: an unknown name; the message lists the valid ones.
    """
    bad = [f for f in names if f not in FRAMEWORKS]
    if bad:
        raise ValueError(f"{option}: unknown framework {bad[0]!r}; valid: {', '.join(FRAMEWORK_NAMES)}")
    return tuple(names)


_LOADED: dict[str, "Framework"] = {}


def get_framework(name: str) -> "Framework":
    """The :class:`Framework` of ``name``, its module imported on first use.

    Raises:
        ValueError: ``name`` is not registered.
    """
    if name not in FRAMEWORKS:
        raise ValueError(f"unknown framework {name!r}; valid: {', '.join(FRAMEWORK_NAMES)}")
    if name not in _LOADED:
        _LOADED[name] = importlib.import_module(FRAMEWORKS[name].module).FRAMEWORK
    return _LOADED[name]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How :meth:`Framework.run_plan` runs a plan.

    Attributes:
        hparams: the AdamW settings and the number of training steps.
        timing_repeats: timed training steps after one warm-up step (>= 1).
        seed: the dropout seed (JAX: ``jax.random.key(seed)``; PyTorch: ``torch.manual_seed(seed)``
            before every forward pass).
        with_reverse_loop: also run the hand-written reverse segment loop (plans with a
            checkpointed segment and no policy).
        with_training: run the optimizer steps and the timed steps (False: ``trained`` and the
            times are None).
        with_memory: measure the step's memory (False: ``memory`` is None).
        frozen: freeze the embeddings and the first half of the blocks
            (:mod:`parity.cases.stress_frozen`): trainable gradients compared, frozen weights
            unchanged; neither memory nor time is measured.
    """

    hparams: "AdamWConfig"
    timing_repeats: int = 5
    seed: int = 0
    with_reverse_loop: bool = True
    with_training: bool = True
    with_memory: bool = True
    frozen: bool = False


class Framework(Protocol):
    """The verbs the harness asks of a framework (``parity/runners/<name>_framework.py``'s ``FRAMEWORK``).

    Attributes:
        info: the framework's :class:`FrameworkInfo`.
    """

    info: FrameworkInfo

    def run_plan(self, mode: str, cfg: "TransformerConfig", params: Mapping[str, np.ndarray], tokens: np.ndarray,
                 plan: "RematPlan", options: RunOptions) -> RunResult:
        """Loss, gradients, trained weights, memory and step time of ``plan`` on ``tokens``.

        ``tokens`` is ``(B, T+1)`` integer ids (inputs ``[:, :-1]``, targets ``[:, 1:]``);
        ``cfg.compute_dtype`` selects mixed precision. Raises ValueError on bad input.
        """

    def train(self, mode: str, cfg: "TransformerConfig", params: Mapping[str, np.ndarray], batches,
              plan: "RematPlan", options: RunOptions, on_step=None) -> "TrainRun":
        """``len(batches)`` AdamW steps of ``plan``, one batch per step: each step's loss, the trained
        weights, each step's time, one steady-state step's memory (:class:`parity.runners.result.TrainRun`);
        ``on_step(step, loss, step_time_s)`` after each step."""

    def run_user_stack(self, mode: str, stack: "UserStack", plan: "RematPlan") -> RunResult:
        """Train the user-style block stack (:mod:`parity.cases.stress_user`) under ``plan``."""

    def measure_plan(self, cfg: "TransformerConfig", tokens: np.ndarray, plan: "RematPlan", repeats: int) -> dict:
        """Saved and peak-activation bytes and step time of one forward+backward step (the depth sweep's case)."""

    def kept_names(self, cfg: "TransformerConfig", batch: int, seq: int, policy: "Policy") -> dict:
        """``{"kept", "offloaded", "tensors"}``: the activation names one checkpointed block keeps under ``policy``."""

    def block_saved(self, cfg: "TransformerConfig", batch: int, seq: int) -> list[tuple[tuple, str, int]]:
        """``[(shape, dtype, bytes)]`` of what one block saves without remat, in order."""

    def planner_chain(self, cfg: "TransformerConfig", batch: int, seq: int, policies: tuple, cost: str = "flops") -> dict:
        """The per-block option chain of the planner (:func:`jaxremat.spec.planner.plan_chain`'s input); with
        ``cost="time"`` every option's measured time set and ``option_times`` added (the GPT family only:
        ValueError for another), measured once per model, shape and option in a process."""

    def default_menu(self) -> tuple:
        """The planner's default checkpoint options in this framework."""

    def estimate_plans(self, cfg: "TransformerConfig", batch: int, seq: int, plans, *, budget=None) -> list[dict]:
        """One row per plan of a training step at ``cfg`` and ``(batch, seq)``, nothing allocated at any size
        (JAX: a compile from abstract arguments; PyTorch: the step under fake tensors): keys
        :data:`parity.runners.estimate_budget.ROW_KEYS`, ``none`` first, the planner's plan for ``budget``
        (bytes, ``"24GiB"`` or ``"50%"``) last. Raises ValueError (one line) on bad input, a budget below
        anything a plan reaches, or a compile that needs more host memory than the machine has."""

    def check_estimates(self, cfg: "TransformerConfig", batch: int, seq: int, plans) -> list[dict]:
        """The estimate against the step run for real at a shape that runs here, one row per plan:
        ``{"framework", "plan", "estimated_peak_bytes", "measured_peak_bytes", "difference_bytes", "relative",
        "margin_bytes", "within_margin", "what", "detail"}`` (``what``: what was compared; ``detail``: the
        framework's own breakdown)."""

    def no_saving_cause(self, res: RunResult, ref: RunResult, batch: int, seq: int) -> str:
        """Why a plan that keeps fewer activations than ``none`` did not lower the measured peak (one line), at
        batch ``batch`` and length ``seq`` (so the line can say at which shape remat would matter)."""

    def device_peak(self, cfg: "TransformerConfig", tokens: np.ndarray, plan: "RematPlan") -> dict:
        """The GPU pass's case: the device's own peak counters of one loss+gradient step (fresh weights),
        ``{"peak_bytes", "bytes_before", "step_peak_bytes", "saved_bytes", "offloaded_bytes", "source"}``
        (raises RuntimeError without a GPU)."""

    def check_platform(self) -> str:
        """Start the framework's backend now and return its platform; ValueError (one line, the setting named) when it cannot."""

    def devices(self, on_gpu: bool = False) -> list[str]:
        """The devices a run computes on, for the report's ``environment`` (``on_gpu``: the run uses the GPU)."""

    def device_memory_bytes(self) -> int | None:
        """The device memory a run of this framework may use, in bytes; None where it computes on the CPU."""

    def gpu_available(self) -> bool:
        """Whether this framework sees a GPU."""

    def compiled_program(self, cfg: "TransformerConfig", tokens_shape: tuple, plan: "RematPlan") -> str | None:
        """The compiled loss+gradient program's text, or None where the framework compiles none."""

    def backend_info(self, threads: int | None = None) -> dict[str, Any]:
        """The kernels this process runs (set ``threads`` first when given): instruction set, threads."""

    def compiler_budget_points(self, cfg: "TransformerConfig", params: Mapping[str, np.ndarray], tokens: np.ndarray,
                               fractions: tuple[float, ...], *, backend: str, repeats: int) -> list[dict]:
        """The framework compiler's own remat at each memory-budget fraction, measured like the eager plans
        (PyTorch: ``torch.compile`` with ``activation_memory_budget``); ``[]`` where the framework has none."""

    def run_distributed(self, preset, work_dir, *, devices: int, meshes: tuple[str, ...], plans: tuple[str, ...],
                        seed: int, processes: int, hparams: "AdamWConfig | None") -> list[dict]:
        """This framework's meshes of the distributed suite: ``[{"mesh", "layout", "rows", ...}]``, rows as JSON
        dicts (:class:`parity.distributed.result.DistributedRow`), files under ``work_dir``."""

    def encoder_hidden_states(self, cfg: "TransformerConfig", params: Mapping[str, np.ndarray],
                              tokens: np.ndarray) -> np.ndarray:
        """The encoder family's last hidden state ``(B, T, D)`` of ``(B, T)`` ids, dropout off, in ``cfg.dtype``
        (the peer checks, :mod:`parity.checks.peer`)."""

    def peer_step_rows(self, cfg: "TransformerConfig", params: Mapping[str, np.ndarray], tokens: np.ndarray,
                       repeats: int) -> list[dict]:
        """A training step of a peer library's own checkpointing beside this framework's ``full`` on the same
        weights and ``(B, T)`` batch: peak and step-time ratios with their spread, loss and gradients against
        the tolerances (PyTorch: :func:`parity.runners.torch_peer.hf_checkpointing_peer`); ``[]`` where the
        framework has no such peer or the architecture is not the peer's."""

