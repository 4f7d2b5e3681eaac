"""PyTorch behind the harness's one door: :data:`FRAMEWORK`, the :class:`parity.runners.framework.Framework` of PyTorch.

Each verb is what a case set, a command or a check asks of PyTorch (:mod:`parity.runners.framework`
lists them); the work is done by the PyTorch runner (:mod:`parity.runners.torch_runner`), the one
PyTorch memory measurement (:mod:`parity.runners.torch_memory`), the stress variants' PyTorch
halves (:mod:`parity.runners.torch_stress`) and the reference (:mod:`torchref`).
"""

from __future__ import annotations

# Deferred imports: torchref.compiled loads torch._dynamo and torch._inductor (~1.3 s); only the compiler-budget
# points (`python -m parity plan --frontier`) use it, so every other PyTorch run starts without them.

import dataclasses
import os

import numpy as np
import torch

from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.option_time import time_rounds
from jaxremat.spec.plan import RematPlan
from jaxremat.spec.policies import Policy
from torchref.block_memory import block_saved
from torchref.encoder import Encoder
from torchref.model import GPT
from torchref.block_time import timed_chain
from torchref.planner import DEFAULT_MENU, model_chain
from torchref.render import model_loss

from parity.distributed.launch import run_torch_ranks
from parity.runners import torch_estimate, torch_peer, torch_runner, torch_stress, torch_train
from parity.runners.framework import FRAMEWORKS, RunOptions
from parity.runners.result import RunResult, TrainRun, kept_and_offloaded, memory_fields, timed
from parity.runners.torch_loss_terms import loss_term_scale
from parity.runners.torch_memory import measure_torch

NO_LIVE_ACTIVATION = 0.01
"""A peak with MemTracker ``ACT`` bytes below this fraction of ``none``'s saved bytes holds no activation."""


class TorchFramework:
    """PyTorch: eager mode, MemTracker / the CUDA allocator, ``torch.utils.checkpoint`` renderings."""

    info = FRAMEWORKS["torch"]

    def run_plan(self, mode: str, cfg: TransformerConfig, params, tokens, plan: RematPlan,
                 options: RunOptions) -> RunResult:
        """See :func:`parity.runners.torch_runner.run_plan`; ``options.frozen`` runs
        :func:`parity.runners.torch_stress.run_frozen` (loss, gradients, trained weights only)."""
        if options.frozen:
            if mode not in self.info.modes:
                raise ValueError(f"the PyTorch reference runs eagerly: mode must be 'eager', got {mode!r}")
            return torch_stress.run_frozen(cfg, params, tokens, plan, options.hparams)
        return torch_runner.run_plan(mode, cfg, params, tokens, plan, options)

    def train(self, mode: str, cfg: TransformerConfig, params, batches, plan: RematPlan, options: RunOptions,
              on_step=None) -> TrainRun:
        """See :func:`parity.runners.torch_train.train_plan`."""
        return torch_train.train_plan(mode, cfg, params, batches, plan, options, on_step)

    def run_user_stack(self, mode: str, stack, plan: RematPlan) -> RunResult:
        """See :func:`parity.runners.torch_stress.run_user_stack`."""
        return torch_stress.run_user_stack(stack, plan)

    def measure_plan(self, cfg: TransformerConfig, tokens: np.ndarray, plan: RematPlan, repeats: int) -> dict:
        """Saved, peak-activation bytes and step time of one forward+backward step.

        The memory is :func:`parity.runners.torch_memory.measure_torch`'s with the ``live_bytes``
        counter on CPU (MemTracker's cost grows with depth; the counts agree).
        """
        model = GPT.from_params(cfg, init_params(cfg))
        tok = torch.from_numpy(np.asarray(tokens, dtype=np.int64))

        def step():
            model.zero_grad(set_to_none=False)  # gradients stay allocated: constant, subtracted below
            model_loss(model, tok, plan).backward()

        step()  # allocates the gradients
        fixed = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters())]
        memory = measure_torch(
            lambda sac, on_input: model_loss(model, tok, plan.schedule, policy=sac, on_checkpoint_input=on_input),
            step, exclude=[*model.parameters(), *model.buffers()], tracked=(model,), policy=plan.policy,
            counter="live_bytes", fixed=fixed)
        return {**memory_fields(memory), **timed(step, repeats)}

    def time_steps(self, cfg: TransformerConfig, params, tokens: np.ndarray, plans, rounds: int,
                   min_sample_s: float = 0.1) -> dict:
        """Each plan's eager step (forward and ``backward``), timed interleaved over ``rounds`` on one intra-op thread
        (as :mod:`torchref.block_time`; restored after) by :func:`jaxremat.spec.option_time.time_rounds` (process
        CPU time, each sample at least ``min_sample_s`` seconds of steps): ``{plan name: [seconds per step, one per
        round]}``."""
        model = GPT.from_params(cfg, params)
        tok = torch.from_numpy(np.asarray(tokens, dtype=np.int64))

        def step(plan):
            model.zero_grad(set_to_none=True)
            model_loss(model, tok, plan).backward()

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return time_rounds({p.name: (lambda p=p: step(p)) for p in plans}, rounds, min_sample_s=min_sample_s)
        finally:
            torch.set_num_threads(threads)

    def kept_names(self, cfg: TransformerConfig, batch: int, seq: int, policy: Policy) -> dict:
        """What one checkpointed block keeps: the op outputs the selective checkpoint caches
        (:func:`torchref.block_memory.block_saved`), by activation region."""
        rows = block_saved(cfg, batch, seq, policy)
        tensors = [{"name": r["name"], "shape": list(r["shapes"][0]), "bytes": r["bytes"],
                    "memory": "host" if r["kind"] == "offloaded" else "device"}
                   for r in rows if r["kind"] != "saved"]
        return kept_and_offloaded(tensors)

    def block_saved(self, cfg: TransformerConfig, batch: int, seq: int) -> list[tuple[tuple, str, int]]:
        """``[(shape, dtype, bytes)]`` of what one block saves without remat (saved-tensor hooks)."""
        return [(tuple(r["shapes"][0]), r["dtype"], r["bytes"]) for r in block_saved(cfg, batch, seq)]

    def planner_chain(self, cfg: TransformerConfig, batch: int, seq: int, policies: tuple, cost: str = "flops") -> dict:
        """:func:`torchref.planner.model_chain`; with ``cost="time"``, :func:`torchref.block_time.timed_chain`."""
        return timed_chain(cfg, batch, seq, policies) if cost == "time" else model_chain(cfg, batch, seq, policies)

    def default_menu(self) -> tuple:
        """:data:`torchref.planner.DEFAULT_MENU`."""
        return DEFAULT_MENU

    def no_saving_cause(self, res: RunResult, ref: RunResult, batch: int, seq: int) -> str:
        """The step's peak lies where no saved activation is live (MemTracker's ``ACT`` category below
        :data:`NO_LIVE_ACTIVATION` of ``none``'s saved bytes in both steps), or the allocator kept the
        activations some other way.

        In the first case the line also says what share of the step's peak ``none``'s saved activations
        are, and from about which batch or length they would set the peak: the step frees its gradients
        before the forward pass (``zero_grad(set_to_none=True)``), so the forward pass's end holds the
        saved activations where the peak after the backward pass holds the gradients and the temporary
        (MemTracker's ``GRAD`` and ``TEMP`` at the peak); saved activations grow about in proportion to B
        and to T (a lower bound on the shape at which remat matters; attention's T x T scores make it
        come sooner in T)."""
        lines = [(r.memory.peak_breakdown or {}) if r.memory is not None else {} for r in (res, ref)]
        saved_ref = ref.memory.saved_bytes if ref.memory is not None else None
        if saved_ref and all("ACT" in b for b in lines) and \
                max(int(b["ACT"]) for b in lines) < NO_LIVE_ACTIVATION * saved_ref:
            b = lines[0]
            temp, peak = int(b.get("TEMP", 0)), (ref.memory.peak_bytes if ref.memory is not None else 0)
            after = temp + int(b.get("GRAD", 0))  # what the peak after the backward pass holds that the forward's end does not
            scale = max(1.0, after / saved_ref)
            share = f"{100 * saved_ref / peak:.0f}% of the step's peak" if peak else "a part of the step's peak"
            return (f"the step's peak lies after the blocks' backward, where no saved activation is live (MemTracker "
                    f"at the peak: ACT {int(b['ACT'])} B, TEMP {temp / 2**20:.1f} MiB, e.g. a dense "
                    f"embedding gradient; none's {saved_ref / 2**20:.1f} MiB of saved activations, {share}, are freed "
                    f"by then, in its step as in this one): remat cannot lower this step's peak at B={batch}, T={seq}; "
                    f"the activations would set the peak once they exceed the gradients and that temporary "
                    f"({after / 2**20:.1f} MiB), from about {scale:.1f}x this batch or length "
                    f"(B={int(batch * scale + 0.999)} or T={int(seq * scale + 0.999)})")
        return ("the recompute is in the program, but the allocator's peak did not drop (activations kept by "
                "something else)")

    def check_platform(self) -> str:
        """PyTorch's device for the reference: ``"cuda"`` when it sees a GPU, else ``"cpu"`` (it always starts)."""
        return "cuda" if torch.cuda.is_available() else "cpu"

    def devices(self, on_gpu: bool = False) -> list[str]:
        """``["cpu"]`` (the runners compute on the CPU), or the CUDA devices' names for a run on the GPU."""
        if on_gpu:
            return [f"cuda: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
        return ["cpu"]

    def device_memory_bytes(self) -> None:
        """None: the PyTorch runners compute on the CPU (the GPU pass is the one that uses CUDA)."""
        return None

    def gpu_available(self) -> bool:
        """Whether PyTorch sees a CUDA GPU."""
        return torch.cuda.is_available()

    def device_peak(self, cfg: TransformerConfig, tokens: np.ndarray, plan: RematPlan) -> dict:
        """``torch.cuda.max_memory_allocated`` of one loss+gradient step after a reset (the GPU pass's case),
        measured by :func:`parity.runners.torch_memory.measure_torch` (a CUDA model selects the device counters).

        Raises:
            RuntimeError: no CUDA GPU.
        """
        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch sees no CUDA GPU")
        tok = torch.from_numpy(np.asarray(tokens, dtype=np.int64)).cuda()
        model = GPT.from_params(cfg, init_params(cfg)).cuda()
        memory = measure_torch(
            lambda sac, on_input: model_loss(model, tok, plan.schedule, policy=sac, on_checkpoint_input=on_input),
            lambda: model_loss(model, tok, plan).backward(),
            exclude=[*model.parameters(), *model.buffers()], tracked=(model,))
        return {"peak_bytes": memory.peak_bytes,
                "bytes_before": int(memory.peak_breakdown["allocated_before"]),
                "step_peak_bytes": memory.peak_activation_bytes, "saved_bytes": memory.saved_bytes,
                "offloaded_bytes": memory.offloaded_bytes, "source": self.info.device_peak_source}

    def compiled_program(self, cfg: TransformerConfig, tokens_shape: tuple, plan: RematPlan) -> None:
        """None: the reference runs eagerly, no program is compiled."""
        return None

    def backend_info(self, threads: int | None = None) -> dict:
        """ATen's CPU instruction set and intra-op threads (``threads`` set first when given)."""
        if threads is not None:
            torch.set_num_threads(int(threads))
        return {"aten_capability": torch.backends.cpu.get_cpu_capability(), "torch_threads": torch.get_num_threads(),
                "mkl_cbwr": os.environ.get("MKL_CBWR")}

    def estimate_plans(self, cfg: TransformerConfig, batch: int, seq: int, plans, *, budget=None) -> list[dict]:
        """The step under fake tensors, its live storages counted (:func:`parity.runners.torch_estimate.estimate_plans`)."""
        return torch_estimate.estimate_plans(cfg, batch, seq, plans, budget=budget)

    def check_estimates(self, cfg: TransformerConfig, batch: int, seq: int, plans) -> list[dict]:
        """The fake-tensor peak against the real step's MemTracker peak, within
        :data:`parity.runners.torch_estimate.CHECK_MARGIN_BYTES` (:func:`parity.runners.torch_estimate.check_plans`)."""
        margin = torch_estimate.CHECK_MARGIN_BYTES
        return [{"framework": "torch", "plan": r["plan"], "estimated_peak_bytes": r["fake"]["Total"],
                 "measured_peak_bytes": r["real"]["Total"], "difference_bytes": r["difference_bytes"],
                 "relative": r["relative"], "margin_bytes": margin, "within_margin": abs(r["difference_bytes"]) <= margin,
                 "what": "the step's peak (AdamW's state held) under fake tensors against the real step's MemTracker peak",
                 "detail": {"fake": r["fake"], "real": r["real"]}}
                for r in torch_estimate.check_plans(cfg, batch, seq, plans)]

    def compiler_budget_points(self, cfg, params, tokens, fractions, *, backend: str, repeats: int) -> list[dict]:
        """``torch.compile`` with ``torch._functorch.config.activation_memory_budget`` at each fraction
        (:func:`torchref.compiled.measure_compiled`, ``backend`` ``aot_eager_decomp_partition`` or
        ``inductor``; random ops saved, :mod:`torchref.compiled_random`), its step time against eager ``none``
        timed in the same call; a point whose gradients (on the model and on it with dropout) are not within
        their bound of eager ``none`` gets the reason as its ``error``
        (:func:`torchref.compiled_random.compiled_problem`), and a point that raises is recorded with its
        ``error``; the others still run."""
        from torchref.compiled import measure_compiled
        from torchref.compiled_random import compiled_problem

        points = []
        for frac in fractions:
            try:
                r = dataclasses.asdict(measure_compiled(cfg, params, tokens, frac, backend=backend, repeats=repeats))
                r["time_overhead"] = (r["step_time_s"] / r["eager_step_time_s"]
                                      if r.get("eager_step_time_s") and r.get("step_time_s") else None)
                points.append({**r, "activation_memory_budget": frac, "error": compiled_problem(r)})
            except Exception as exc:  # recorded, and the other fractions still run
                points.append({"activation_memory_budget": frac, "backend": backend,
                               "error": f"{type(exc).__name__}: {exc}"})
        return points

    def encoder_hidden_states(self, cfg: TransformerConfig, params, tokens) -> np.ndarray:
        """:class:`torchref.encoder.Encoder` in eval mode under ``torch.no_grad``."""
        model = Encoder.from_params(cfg, params).eval()
        with torch.no_grad():
            return model(torch.from_numpy(np.asarray(tokens, dtype=np.int64))).numpy()

    def peer_step_rows(self, cfg: TransformerConfig, params, tokens, repeats: int) -> list[dict]:
        """:func:`parity.runners.torch_peer.peer_step_rows`: Hugging Face ``BertModel`` with
        ``gradient_checkpointing_enable()`` (non-reentrant) beside torchref's encoder under ``full``."""
        return torch_peer.peer_step_rows(cfg, params, tokens, repeats=repeats)

    def run_distributed(self, preset, work_dir, *, devices: int, meshes: tuple[str, ...], plans: tuple[str, ...],
                        seed: int, processes: int, hparams=None) -> list[dict]:
        """The PyTorch meshes ``ddp=2`` and ``fsdp2=2`` (gloo ranks on CPU; :func:`parity.distributed.launch.run_torch_ranks`);
        ``devices``, ``meshes`` and ``processes`` are the JAX meshes' and not used here."""
        return run_torch_ranks(preset.name, plans, work_dir, seed=seed, hparams=hparams)

    def loss_term_scale(self, cfg: TransformerConfig, params, tokens) -> float:
        """:func:`parity.runners.torch_loss_terms.loss_term_scale`: the reference's loss, its terms' scale."""
        return loss_term_scale(cfg, params, tokens)


FRAMEWORK = TorchFramework()
"""The PyTorch :class:`parity.runners.framework.Framework` (:func:`parity.runners.framework.get_framework`)."""

__all__ = ["FRAMEWORK", "NO_LIVE_ACTIVATION", "TorchFramework"]
