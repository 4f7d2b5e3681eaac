"""The PyTorch estimate of a model's training step at any size, nothing allocated (imports PyTorch, not JAX).

:func:`estimate_plans` steps the family's model (:attr:`jaxremat.models.ModelSpec.torch_model`, its loss
``torch_loss``) under fake tensors, one fresh model per plan (:func:`torchref.estimate.estimate_step`): the
step the harness measures on real tensors with MemTracker, AdamW's state held, counted by
:class:`torchref.estimate.LivePeak` (equal to MemTracker's count to the byte, at O(1) per op where
MemTracker's bookkeeping grows with the live storages: one plan and ``none`` of a 48-layer d_model 64
model took 314 s with it, 96 layers 79 s with the live count, here).
Per plan (:data:`parity.runners.estimate_budget.ROW_KEYS`):

* parameters: the parameters' storages (``PARAM``, ``cfg.dtype``); gradients: the parameters' size
  (what the step ends with; at the peak only those allocated by then are held, counted in the total);
* AdamW state: the optimizer state's storages (``OPT``: two moments per parameter, a step count per tensor);
* activation peak: the peak less ``PARAM``, ``BUFFER``, ``GRAD`` and ``OPT`` (as the measured runs,
  :func:`parity.runners.torch_memory.measure_torch`);
* total peak: the step's peak, every category;
* recompute FLOPs: from the planner's per-block menus (:func:`fake_chain`: ``FlopCounterMode`` over one
  block, checkpointed less plain) times the blocks the plan recomputes, as in JAX. Not counted on the
  measured step: the counter's module tracker keeps activations alive and would change the peak
  (:mod:`torchref.estimate`).

The planner's per-block menus at a real size are measured on one fake block
(:func:`torchref.planner.block_options` under ``FakeTensorMode``: its saved tensors, selective-checkpoint
caches, peaks and FLOPs are all shape-level, and equal the real block's at gpt-small).

:func:`check_plans` runs the same step on real tensors at a shape that runs here and compares the peaks.
:func:`host_bytes_needed` sizes the process: the fake model is one Python module tree, so its host memory
grows with the depth.
"""

from __future__ import annotations

import functools
import math

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from jaxremat.models import TransformerConfig, get_model, param_shapes
from jaxremat.models.gpt import activation as account
from jaxremat.spec.plan import RematPlan, parse_plan
from torchref.estimate import PlanEstimate, estimate_step
from torchref.model import Block, compute_context, torch_dtype
from torchref.planner import DEFAULT_MENU, block_options, model_chain

from parity.report.environment import available_memory_bytes
from parity.runners.estimate_budget import (add_ratios, as_budget, budget_row, chain_policies, check_reachable,
                                            plan_within_budget, recompute_flops)

__all__ = ["CHECK_MARGIN_BYTES", "HOST_BASE_BYTES", "HOST_LAYER_BYTES", "check_plans", "estimate_plans", "fake_chain", "host_bytes_needed"]

HOST_BASE_BYTES = 1 << 30
"""Host memory of the process besides the model (PyTorch itself, MemTracker's records): 1 GiB."""
HOST_LAYER_BYTES = 1 << 20
"""Host memory per layer of a fake model and its step (module objects, fake tensors): 1 MiB, over five
times the measured growth with depth (peak resident memory 320 MB at 24 layers, 333 MB at 96)."""


CHECK_MARGIN_BYTES = 0
"""The fake-tensor peak's allowed difference from the real step's MemTracker peak, in bytes: 0, as measured at
every shape and plan of docs/real-sizes.md (both count the same storages, created and freed in the same order;
memory a CPU kernel allocates inside itself is no tensor and neither counts it)."""

def host_bytes_needed(cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Host memory (bytes) :func:`estimate_plans` needs: :data:`HOST_BASE_BYTES` + N * :data:`HOST_LAYER_BYTES`
    (fake tensors hold no data: the batch shape costs nothing; the signature is
    :func:`parity.runners.jax_estimate.host_bytes_needed`'s)."""
    return HOST_BASE_BYTES + cfg.n_layer * HOST_LAYER_BYTES


def _check_host(cfg: TransformerConfig, batch: int, seq: int) -> None:
    need, have = host_bytes_needed(cfg, batch, seq), available_memory_bytes()
    if have is not None and need > 0.9 * have:
        raise ValueError(f"the PyTorch estimate of {cfg.n_layer} layers needs about {need / 2**30:.1f} GiB of host "
                         f"memory (a fake model is one Python object tree) but {have / 2**30:.1f} GiB is available")


def _builder(cfg: TransformerConfig, batch: int, seq: int):
    spec = get_model(cfg.arch)
    model_cls, width = spec.load("torch_model"), seq + 1 if spec.batch == "windows" else seq

    def build():
        with torch.random.fork_rng(devices=[]):  # the same weights and tokens every call, real or fake
            torch.manual_seed(0)
            tokens = torch.randint(1, cfg.vocab_size, (batch, width))
            return model_cls(cfg), (tokens,)

    loss_fn = spec.load("torch_loss")
    return build, lambda model, plan, tokens: loss_fn(model, tokens, plan.schedule, policy=plan.policy)


def fake_chain(cfg: TransformerConfig, batch: int, seq: int, policies=DEFAULT_MENU) -> dict:
    """The planner's chain of a GPT at a real size: the block's menu measured on a fake block (as
    :func:`torchref.planner.gpt_chain` measures a real one); other families: their chain on real tensors.

    Raises:
        ValueError: bad sizes or menu.
    """
    if cfg.arch != "gpt":
        return model_chain(cfg, batch, seq, policies)
    account.check_sizes("torch", cfg, batch, seq)
    menu = list(_fake_gpt_menu(cfg, batch, seq, tuple(policies)))
    return {"options_per_block": [menu] * cfg.n_layer, "boundary_bytes": account.boundary_bytes(cfg, batch, seq),
            "invariant_bytes": 0, "fixed_bytes": account.non_stack_peak_bytes("torch", cfg, batch, seq)}


@functools.lru_cache(maxsize=8)
def _fake_gpt_menu(cfg: TransformerConfig, batch: int, seq: int, policies: tuple) -> tuple:
    with FakeTensorMode(), compute_context(cfg):  # autocast as the model runs its blocks (bfloat16 compute)
        block = Block(cfg)
        x = torch.randn(batch, seq, cfg.d_model, dtype=torch_dtype(cfg))
        return tuple(block_options(block, x, policies))


def _row(est: PlanEstimate, grad_bytes: int, flops) -> dict:
    return {"framework": "torch", "plan": est.plan, "parameters_bytes": est.parameter_bytes,
            "gradients_bytes": grad_bytes, "adamw_state_bytes": est.optimizer_bytes,
            "activation_peak_bytes": est.activation_bytes, "total_peak_bytes": est.peak_bytes, "ratio_to_none": None,
            "recompute_flops": flops, "backend": f"{est.backend}, one step with AdamW's state held",
            "compile_time_s": est.time_s}


def estimate_plans(cfg: TransformerConfig, batch_size: int, seq_len: int, plans, *, budget=None,
                   menu=DEFAULT_MENU) -> list[dict]:
    """One row per plan of the PyTorch training step at ``cfg`` and (B, T), nothing allocated (module docstring).

    The same signature, rows and budget rule as :func:`parity.runners.jax_estimate.estimate_plans`
    (``none`` first; a budget's plan last, checked on its own fake-tensor step; ``menu``:
    :data:`torchref.planner.DEFAULT_MENU`).

    Raises:
        ValueError: a bad plan or one invalid at ``cfg.n_layer``, a bad budget or one below anything a
            plan reaches (a bytes budget before any step), or more host memory than is available.
    """
    parsed = [parse_plan("none")] + [p for p in (parse_plan(x) for x in plans) if p.name != "none"]
    for p in parsed:
        p.segments_for(cfg.n_layer)
    b = as_budget(budget) if budget is not None else None
    _check_host(cfg, batch_size, seq_len)
    build, loss = _builder(cfg, batch_size, seq_len)
    grad_bytes = sum(math.prod(s) for s in param_shapes(cfg).values()) * torch_dtype(cfg).itemsize
    chain = fake_chain(cfg, batch_size, seq_len, chain_policies(parsed, menu if b is not None else ()))
    if b is not None and b.bytes is not None:
        # parameters, gradients, two AdamW moments; the gradients may be unallocated at the activation peak
        check_reachable(b.bytes, 4 * grad_bytes, chain, "torch", gradients_bytes=grad_bytes, what=b.text)

    def measure(plan: RematPlan) -> dict:
        return _row(estimate_step(build, plan, loss), grad_bytes, recompute_flops(chain, plan, cfg.n_layer))

    rows = [measure(p) for p in parsed]
    if b is not None:
        rows.append(budget_row(rows, lambda: plan_within_budget(b, rows[0], chain, cfg.n_layer, measure, "torch",
                                                                gradients_bytes=grad_bytes)))
    return add_ratios(rows)


def check_plans(cfg: TransformerConfig, batch_size: int, seq_len: int, plans) -> list[dict]:
    """The estimate (fake tensors, :class:`torchref.estimate.LivePeak`) against the real step's MemTracker
    peak (the harness's counter), per plan, at a shape that runs here.

    Returns:
        One dict per plan: ``plan``, ``fake`` and ``real`` (the categories at the peak and ``Total``:
        ``PARAM``, ``BUFFER``, ``GRAD``, ``OPT`` in both, the rest as ``ACT+TEMP`` in the estimate and as
        MemTracker's ``ACT``, ``TEMP``, ``OTH``), ``difference_bytes`` (fake total less real) and
        ``relative`` (that over the real).

    Raises:
        ValueError: a bad plan.
    """
    build, loss = _builder(cfg, batch_size, seq_len)
    out = []
    for plan in [parse_plan(p) for p in plans]:
        fake = estimate_step(build, plan, loss)
        real = estimate_step(build, plan, loss, fake=False, tracker="memtracker")
        diff = fake.peak_bytes - real.peak_bytes
        out.append({"plan": plan.name, "fake": {**fake.breakdown, "Total": fake.peak_bytes},
                    "real": {**real.breakdown, "Total": real.peak_bytes}, "difference_bytes": diff,
                    "relative": diff / real.peak_bytes})
    return out
