"""JAX behind the harness's one door: :data:`FRAMEWORK`, the :class:`parity.runners.framework.Framework` of JAX.

Each verb is what a case set, a command or a check asks of JAX (:mod:`parity.runners.framework`
lists them); the work is done by the JAX runner (:mod:`parity.runners.jax_runner`), the one JAX
memory measurement (:mod:`parity.runners.jax_memory`), the stress variants' JAX halves
(:mod:`parity.runners.jax_stress`) and the library (:mod:`jaxremat`).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np

from jaxremat.block_memory import block_residuals
from jaxremat.encoder import encode
from jaxremat.memory import gpu_available
from jaxremat.models import TransformerConfig, init_params
from jaxremat.block_time import timed_chain
from jaxremat.planner import DEFAULT_MENU, model_chain
from jaxremat.spec.option_time import time_rounds
from jaxremat.spec.plan import RematPlan
from jaxremat.spec.policies import Policy
from jaxremat.survival import count_dots

from parity.distributed.launch import run_jax_worker
from parity.inputs.train import AdamWConfig
from parity.runners import jax_estimate, jax_runner, jax_stress, jax_train
from parity.runners.framework import FRAMEWORKS, RunOptions
from parity.runners.jax_memory import measure_jax
from parity.runners.result import RunResult, TrainRun, kept_and_offloaded, memory_fields, timed


class JaxFramework:
    """JAX: ``jit`` and op-by-op modes, XLA's compiled memory analysis, ``jax.checkpoint`` renderings."""

    info = FRAMEWORKS["jax"]

    def run_plan(self, mode: str, cfg: TransformerConfig, params, tokens, plan: RematPlan,
                 options: RunOptions) -> RunResult:
        """See :func:`parity.runners.jax_runner.run_plan`; ``options.frozen`` runs
        :func:`parity.runners.jax_stress.run_frozen` (loss, gradients, trained weights only)."""
        if options.frozen:
            return jax_stress.run_frozen(mode, cfg, params, tokens, plan, options.hparams)
        return jax_runner.run_plan(mode, cfg, params, tokens, plan, options)

    def train(self, mode: str, cfg: TransformerConfig, params, batches, plan: RematPlan, options: RunOptions,
              on_step=None) -> TrainRun:
        """See :func:`parity.runners.jax_train.train_plan`."""
        return jax_train.train_plan(mode, cfg, params, batches, plan, options, on_step)

    def run_user_stack(self, mode: str, stack, plan: RematPlan) -> RunResult:
        """See :func:`parity.runners.jax_stress.run_user_stack`."""
        return jax_stress.run_user_stack(mode, stack, plan)

    def measure_plan(self, cfg: TransformerConfig, tokens: np.ndarray, plan: RematPlan, repeats: int) -> dict:
        """Saved, peak-activation bytes and step time of ``jit(value_and_grad(loss_fn))``.

        The memory is :func:`parity.runners.jax_memory.measure_jax`'s (no device peak: in one sweep
        process the allocator's high-water mark spans every case; device peaks come from
        ``python -m parity.cases.gpu_pass``, a fresh process per case). ``compiled``, ``dots_before``
        and ``dots_after`` (matrix products before and after XLA's passes) let the sweep tell whether
        XLA kept the recompute (:mod:`jaxremat.survival`).
        """
        loss_fn = jax_runner.objective(cfg)
        params = {k: jnp.asarray(v) for k, v in init_params(cfg).items()}
        tok = jnp.asarray(tokens, dtype=jnp.int32)

        def loss(p, t):
            return loss_fn(p, t, cfg, plan)

        lowered = jax.jit(jax.value_and_grad(loss)).lower(params, tok)
        compiled = lowered.compile()
        memory = measure_jax(lambda p: loss(p, tok), params, compiled)
        out = {**memory_fields(memory), "compiled": dict(memory.peak_breakdown),
               **timed(lambda: jax.block_until_ready(compiled(params, tok)), repeats)}
        out["dots_before"] = count_dots(lowered.as_text(), optimized=False)
        out["dots_after"] = count_dots(compiled.as_text(), optimized=True)
        if gpu_available():
            out["peak_activation_source"] += "; device peaks: python -m parity.cases.gpu_pass"
        return out

    def time_steps(self, cfg: TransformerConfig, params, tokens: np.ndarray, plans, rounds: int,
                   min_sample_s: float = 0.1) -> dict:
        """Each plan's ``jit(value_and_grad(loss_fn))`` (:func:`parity.runners.jax_runner.compiled_step`: compiled once
        per model, shape and plan in a process, shared with the cases' runs), without dropout, timed interleaved over
        ``rounds`` (:func:`jaxremat.spec.option_time.time_rounds`: process CPU time, each sample at least
        ``min_sample_s`` seconds of steps): ``{plan name: [seconds per step, one per round]}``."""
        p = {k: jnp.asarray(v) for k, v in params.items()}
        tok = jnp.asarray(tokens, dtype=jnp.int32)
        steps = {plan.name: jax_runner.compiled_step(cfg, plan, tuple(tok.shape), False) for plan in plans}
        calls = {name: (lambda c=c: jax.block_until_ready(c(p, tok, None))) for name, c in steps.items()}
        return time_rounds(calls, rounds, min_sample_s=min_sample_s)

    def kept_names(self, cfg: TransformerConfig, batch: int, seq: int, policy: Policy) -> dict:
        """What one checkpointed block keeps: its non-argument saved residuals, each with its ``checkpoint_name``
        (:func:`jaxremat.block_memory.block_residuals`; an unnamed one is listed as None)."""
        with jax_runner.float64_context(cfg):
            recs = block_residuals(cfg, batch, seq, policy)
        tensors = [{"name": r.name, "shape": list(r.shape), "bytes": r.bytes, "memory": r.memory} for r in recs]
        return kept_and_offloaded(tensors)

    def block_saved(self, cfg: TransformerConfig, batch: int, seq: int) -> list[tuple[tuple, str, int]]:
        """``[(shape, dtype, bytes)]`` of one block's saved residuals without remat."""
        return [(r.shape, r.dtype, r.bytes) for r in block_residuals(cfg, batch, seq)]

    def planner_chain(self, cfg: TransformerConfig, batch: int, seq: int, policies: tuple, cost: str = "flops") -> dict:
        """:func:`jaxremat.planner.model_chain`; with ``cost="time"``, :func:`jaxremat.block_time.timed_chain`."""
        return timed_chain(cfg, batch, seq, policies) if cost == "time" else model_chain(cfg, batch, seq, policies)

    def default_menu(self) -> tuple:
        """:data:`jaxremat.planner.DEFAULT_MENU`."""
        return DEFAULT_MENU

    def no_saving_cause(self, res: RunResult, ref: RunResult, batch: int, seq: int) -> str:
        """XLA removed the recompute (no more matrix products than ``none``'s program), or it kept the
        recompute's buffers live as long as without remat."""
        dots, dots_ref = res.dots_compiled, ref.dots_compiled
        if dots is not None and dots_ref is not None and dots <= dots_ref:
            return (f"XLA removed the recompute: the compiled program has {dots} matrix products, as many as "
                    f"without remat ({dots_ref}); run the stack through jaxremat.render.remat_scan")
        return "the recompute is in the program, but XLA scheduled the recompute's buffers to be live as long as without remat"

    def check_platform(self) -> str:
        """Start JAX's backend now; return its platform name.

        Raises:
            ValueError: the backend cannot start (e.g. ``JAX_PLATFORMS=cuda`` on a machine without a
                GPU, which JAX reports as an empty AssertionError); the message names the setting.
        """
        try:
            return jax.devices()[0].platform
        except Exception as exc:  # RuntimeError, or a bare AssertionError for a missing plugin
            setting = os.environ.get("JAX_PLATFORMS")
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "no such platform on this machine"
            where = f"JAX_PLATFORMS={setting!r}" if setting else "the default platform"
            raise ValueError(f"JAX cannot start on {where}: {reason}; unset JAX_PLATFORMS (or set it to cpu), "
                             "or run --frameworks torch") from None

    def devices(self, on_gpu: bool = False) -> list[str]:
        """``platform: device_kind`` of each ``jax.devices()`` entry (JAX runs on its default backend)."""
        try:
            return [f"{d.platform}: {d.device_kind}" for d in jax.devices()]
        except Exception:  # a backend that cannot start is refused earlier (check_platform)
            return []

    def device_memory_bytes(self) -> int | None:
        """The GPU's memory limit in bytes (``memory_stats()['bytes_limit']``), None off a GPU."""
        if jax.default_backend() != "gpu":
            return None
        return (jax.devices()[0].memory_stats() or {}).get("bytes_limit")

    def gpu_available(self) -> bool:
        """Whether JAX's default backend is a GPU (:func:`jaxremat.memory.gpu_available`)."""
        return gpu_available()

    def device_peak(self, cfg: TransformerConfig, tokens: np.ndarray, plan: RematPlan) -> dict:
        """The allocator's peak of one loss+gradient step on the GPU (the GPU pass's case).

        Measured by :func:`parity.runners.jax_memory.measure_jax`, whose device step runs first, before
        anything else touches the device (the high-water mark cannot be reset: one fresh process per
        case, :attr:`parity.runners.framework.FrameworkInfo.fresh_process_per_device_case`).

        Raises:
            RuntimeError: JAX's default backend is not a GPU.
        """
        params = {k: jnp.asarray(v) for k, v in init_params(cfg).items()}
        tok = jnp.asarray(tokens, dtype=jnp.int32)
        loss_fn = jax_runner.objective(cfg)

        def loss(p):
            return loss_fn(p, tok, cfg, plan)

        step = jax.jit(jax.value_and_grad(loss))
        memory = measure_jax(loss, params, device_step=lambda: step(params))
        if memory.device_peak is None:
            raise RuntimeError(f"JAX runs on {jax.default_backend()!r}, not a GPU: install a CUDA jaxlib")
        peak, before = int(memory.device_peak["peak_bytes"]), int(memory.device_peak["bytes_in_use_before"])
        return {"peak_bytes": peak, "bytes_before": before,
                "step_peak_bytes": peak - before, "saved_bytes": memory.saved_bytes,
                "offloaded_bytes": memory.offloaded_bytes, "source": self.info.device_peak_source}

    def compiled_program(self, cfg: TransformerConfig, tokens_shape: tuple, plan: RematPlan) -> str:
        """The optimized HLO text of the runner's compiled loss+gradient step (no dropout key)."""
        with jax_runner.float64_context(cfg):
            return jax_runner.compiled_value_and_grad(cfg, plan, AdamWConfig(steps=1), tuple(tokens_shape),
                                                      False).as_text()

    def backend_info(self, threads: int | None = None) -> dict:
        """XLA's flags and the vector registers its generated code uses (``xla_vector_registers``, None unless
        the process was started with ``XLA_DUMP_ENV`` naming a dump folder; ``threads`` is not settable
        in-process: XLA:CPU sizes its pool from the CPU affinity at start)."""
        return {"xla_flags": os.environ.get("XLA_FLAGS", ""), "xla_vector_registers": xla_vector_registers()}

    def estimate_plans(self, cfg: TransformerConfig, batch: int, seq: int, plans, *, budget=None) -> list[dict]:
        """XLA's compiled memory of ``jit(value_and_grad(loss))`` from abstract arguments
        (:func:`parity.runners.jax_estimate.estimate_plans`)."""
        return jax_estimate.estimate_plans(cfg, batch, seq, plans, budget=budget)

    def check_estimates(self, cfg: TransformerConfig, batch: int, seq: int, plans) -> list[dict]:
        """The compile from abstract arguments against the compile from arrays: every field of
        ``memory_analysis()`` equal, margin 0 bytes (:func:`parity.runners.jax_estimate.check_plans`)."""
        out = []
        for r in jax_estimate.check_plans(cfg, batch, seq, plans):
            est, real = r["abstract"]["peak_bytes"], r["concrete"]["peak_bytes"]
            out.append({"framework": "jax", "plan": r["plan"], "estimated_peak_bytes": est, "measured_peak_bytes": real,
                        "difference_bytes": est - real, "relative": (est - real) / real, "margin_bytes": 0,
                        "within_margin": r["equal"],
                        "what": "the compiled jit(value_and_grad(loss)) from shapes against from arrays, every field of "
                                "memory_analysis() (AdamW's state is outside that program: the estimate's total "
                                "adds it)",
                        "detail": {"abstract": r["abstract"], "concrete": r["concrete"]}})
        return out

    def compiler_budget_points(self, cfg, params, tokens, fractions, *, backend: str, repeats: int) -> list[dict]:
        """``[]``: JAX's remat is chosen in the program (``jax.checkpoint`` policies), not by a compiler budget."""
        return []

    def encoder_hidden_states(self, cfg: TransformerConfig, params, tokens) -> np.ndarray:
        """:func:`jaxremat.encoder.encode` under ``jax.jit`` (float64 in ``jax.enable_x64``)."""
        with jax_runner.float64_context(cfg):
            run = jax.jit(lambda p, t: encode(p, t, cfg))
            return np.asarray(run({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(tokens, jnp.int32)))

    def peer_step_rows(self, cfg: TransformerConfig, params, tokens, repeats: int) -> list[dict]:
        """``[]``: the peer library with its own checkpointing (Hugging Face ``BertModel``) is PyTorch's."""
        return []

    def run_distributed(self, preset, work_dir, *, devices: int, meshes: tuple[str, ...], plans: tuple[str, ...],
                        seed: int, processes: int, hparams=None) -> list[dict]:
        """The JAX meshes ``meshes`` over ``devices`` devices (simulated host devices on CPU), in the worker
        process of :mod:`parity.distributed.jax_worker` (:func:`parity.distributed.launch.run_jax_worker`);
        ``processes`` > 1 also spreads each mesh over that many processes. ``hparams``: the preset's."""
        return run_jax_worker(preset.name, devices, meshes, plans, work_dir, seed, processes)["meshes"]


XLA_DUMP_ENV = "_PARITY_XLA_DUMP"
"""The folder XLA dumps the vector-register probe's object file into (set with ``--xla_dump_to`` in ``XLA_FLAGS``
before JAX loads: :mod:`parity.experiments.tolerance_worker`)."""


def xla_vector_registers() -> dict | None:
    """Registers used by XLA's generated code for an elementwise probe: proof an instruction-set flag took effect.

    Compiles a small elementwise program dumped to the folder of :data:`XLA_DUMP_ENV` and counts
    ``xmm``/``ymm``/``zmm`` operands in its object file with ``objdump``. None when the folder is not
    set, objdump is missing or nothing was dumped.
    """
    def isa_probe(x):
        for _ in range(4):
            x = jnp.tanh(x) * 1.0001 + jnp.exp(-x * x)
        return x

    dump = os.environ.get(XLA_DUMP_ENV)
    objdump = shutil.which("objdump")
    if not dump or not objdump:
        return None
    jax.jit(isa_probe)(jnp.ones((256, 256), jnp.float32)).block_until_ready()
    objs = glob.glob(os.path.join(dump, "*isa_probe*.o"))
    if not objs:
        return None
    text = subprocess.run([objdump, "-d", objs[0]], capture_output=True, text=True, check=True).stdout
    return {reg: text.count(reg) for reg in ("xmm", "ymm", "zmm")}


FRAMEWORK = JaxFramework()
"""The JAX :class:`parity.runners.framework.Framework` (:func:`parity.runners.framework.get_framework`)."""

__all__ = ["FRAMEWORK", "JaxFramework", "XLA_DUMP_ENV", "xla_vector_registers"]
