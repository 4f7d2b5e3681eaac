"""Menus of block options for the remat planner, measured in PyTorch, and the planner on a GPT.

The PyTorch side of :mod:`jaxremat.planner`: for every option of a block's menu (store it;
checkpoint it with no policy; checkpoint it under a named policy, rendered as a selective
checkpoint) the planner (:mod:`jaxremat.spec.planner`) needs three costs, measured here on the
block itself by running it once forward and backward on the CPU:

* **kept bytes**: ``store``: the storages autograd saves while the plain block runs forward
  (saved-tensor hooks, :class:`torchref.memory.SavedActivationRecorder`; parameters and buffers
  left out, the block's input counted when the block saves it, as ``ln_1`` does); a checkpoint
  option: the op outputs its selective checkpoint caches (:class:`torchref.policies.SelectiveCheckpoint`;
  the checkpoint's own input is the segment boundary, which the planner adds per segment);
* **working bytes**: the ``store`` bytes (a recomputed block rebuilds what it saves), or what
  the option keeps if that is more;
* **transient bytes**: what one forward and backward of the block allocates at its peak
  (:func:`torchref.live_bytes.step_peak_bytes`, parameters, their gradients and the input left
  out) beyond what it keeps and rebuilds: its output and that output's gradient, the activation
  gradients and the backward's temporaries (the planner charges a segment the largest of its blocks');
* **recompute FLOPs**: ``torch.utils.flop_counter.FlopCounterMode`` over one forward and
  backward of the checkpointed block less the plain block's: the FLOPs the recompute costs
  (matrix products; the counter counts those ops). The checkpoint runs as
  :func:`torchref.render.forward_blocks` runs it (non-reentrant, early stop
  :data:`torchref.render.EARLY_STOP`, off: the recompute replays the whole block).

:func:`block_options` measures any ``nn.Module`` block ``block(x) -> y`` (a user's own block);
:func:`gpt_block_options` and :func:`plan_gpt` do it for :class:`torchref.model.Block`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from jaxremat.models.config import TransformerConfig
from jaxremat.models.gpt import activation as account
from jaxremat.spec.planner import BlockOption, NoPlanFits, PlannerResult, plan_for_budget
from jaxremat.spec.policies import parse_policy

from .live_bytes import step_peak_bytes
from .memory import SavedActivationRecorder
from .model import Block, torch_dtype
from .policies import SelectiveCheckpoint
from .render import EARLY_STOP

__all__ = ["DEFAULT_MENU", "block_options", "gpt_block_options", "gpt_chain", "plan_gpt"]

DEFAULT_MENU = ("save_nothing", "save_dots", "attention_only", "save_qkv_proj", "mlp_only")
"""The checkpoint options of the default menu, as :data:`jaxremat.planner.DEFAULT_MENU`."""


def _check_menu(policies: Sequence) -> tuple:
    if isinstance(policies, str) or not isinstance(policies, (list, tuple)):
        raise ValueError(f"policies must be a list of policy names, e.g. {list(DEFAULT_MENU)}, got {policies!r}")
    parsed = [parse_policy(p) for p in policies]
    for p in parsed:
        if p.offloaded_names or p.save_everything:
            raise ValueError(f"policy {p.name!r} cannot be a planner option: offloading policies are not modelled "
                             "(transfer time, host memory) and 'save_everything' is 'store' with one more boundary")
        if "block_input" in p.kept_names:
            raise ValueError(f"policy {p.name!r} keeps 'block_input', which PyTorch cannot keep (a checkpointed "
                             "segment is replayed from its start)")
    names = [p.name for p in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"policies must be distinct, got {names}")
    return tuple(parsed)


def _run(block: nn.Module, x: torch.Tensor, sac: SelectiveCheckpoint | None):
    if sac is None:
        return block(x)
    kwargs = {"context_fn": sac.context_fn} if sac.selective else {}
    return checkpoint(block, x, use_reentrant=False, preserve_rng_state=True, early_stop=EARLY_STOP, **kwargs)


def _flops(block: nn.Module, x: torch.Tensor, sac: SelectiveCheckpoint | None) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        _run(block, x, sac).sum().backward()
    block.zero_grad(set_to_none=False)
    return int(counter.get_total_flops())


def block_options(block: nn.Module, x: torch.Tensor, policies: Sequence = DEFAULT_MENU) -> list[BlockOption]:
    """The menu of one block, measured on the block: ``store`` then one checkpoint option per policy.

    Args:
        block: an ``nn.Module`` with ``block(x) -> y`` (one layer of a stack; dropout is drawn as in
            its current training mode). Its gradients are cleared after each measurement.
        x: an example input, e.g. a (B, T, D) float32 tensor (a detached copy requiring grad is used).
        policies: the checkpoint options, policy names or :class:`jaxremat.spec.policies.Policy`
            values (``"save_nothing"``: plain non-reentrant checkpoint); offloading policies,
            ``save_everything`` and policies keeping ``block_input`` are refused.

    Returns:
        ``[BlockOption("store", ...), BlockOption(policy name, checkpointed=True, ...), ...]``
        with kept and working bytes and recompute FLOPs (module docstring).

    Raises:
        ValueError: a bad or duplicate policy, or one the planner cannot take (above).
    """
    menu = _check_menu(policies)
    x = x.detach().requires_grad_(True)
    exclude = [*block.parameters(), *block.buffers()]
    kept = []
    for recorder in (SavedActivationRecorder(exclude=exclude), SavedActivationRecorder(exclude=[*exclude, x])):
        with recorder:  # one recorder per pass: saved-tensor hooks stack, only the innermost one packs
            out = block(x)
        kept.append(int(recorder.total_bytes))
        out.sum().backward()  # allocates the gradients, kept (zeroed in place) for the peaks below
    store, store_wo_input = kept
    fixed = [*exclude, x, x.grad, *(q.grad for q in block.parameters() if q.grad is not None)]
    plain = _flops(block, x, None)

    def transient(sac, kept: int) -> int:
        """What one forward and backward of the block allocates at its peak, beyond what it keeps and
        rebuilds: the output and its gradient, the activation gradients, the backward's temporaries."""
        block.zero_grad(set_to_none=False)
        total = step_peak_bytes(lambda: _run(block, x, sac).sum().backward(), fixed)
        return max(0, total - max(store_wo_input, kept))

    options = [BlockOption("store", False, kept_bytes=store, working_bytes=store,
                           transient_bytes=transient(None, store_wo_input))]
    for p in menu:
        sac = SelectiveCheckpoint(p)
        out = _run(block, x, sac)
        kept = int(sac.kept_bytes()) if sac.selective else 0
        out.sum().backward()
        flops = _flops(block, x, SelectiveCheckpoint(p))
        options.append(BlockOption(p.name, True, p, kept_bytes=kept, working_bytes=max(store, kept),
                                   recompute_flops=float(max(0, flops - plain)),
                                   transient_bytes=transient(SelectiveCheckpoint(p), kept)))
    block.zero_grad(set_to_none=True)
    return options


def gpt_block_options(cfg: TransformerConfig, batch: int, seq: int, policies: Sequence = DEFAULT_MENU,
                      *, seed: int = 0) -> list[BlockOption]:
    """The menu of one :class:`torchref.model.Block` at batch B and sequence T (random weights and input,
    ``seed``; measured once per configuration and menu in a process: cached); every block of a GPT has
    the same menu.

    Raises:
        ValueError: bad sizes, dropout (the account covers dropout 0), or a bad menu.
    """
    account.layer_bytes("torch", cfg, batch, seq)  # checks the family's sizes and dropout 0
    return list(_cached_gpt_menu(cfg, batch, seq, _check_menu(policies), seed))


@functools.lru_cache(maxsize=32)
def _cached_gpt_menu(cfg: TransformerConfig, batch: int, seq: int, policies: tuple, seed: int) -> tuple:
    torch.manual_seed(seed)
    block = Block(cfg)
    x = torch.randn(batch, seq, cfg.d_model, dtype=torch_dtype(cfg))
    return tuple(block_options(block, x, policies))


def gpt_chain(cfg: TransformerConfig, batch: int, seq: int, policies: Sequence = DEFAULT_MENU) -> dict:
    """``{"options_per_block", "boundary_bytes", "invariant_bytes" (0 in PyTorch), "fixed_bytes"}`` of a GPT,
    as :func:`jaxremat.planner.gpt_chain` (``fixed_bytes``: outside the stack at the peak)."""
    menu = gpt_block_options(cfg, batch, seq, policies)
    return {"options_per_block": [menu] * cfg.n_layer, "boundary_bytes": account.boundary_bytes(cfg, batch, seq),
            "invariant_bytes": 0, "fixed_bytes": account.non_stack_peak_bytes("torch", cfg, batch, seq)}


def plan_gpt(cfg: TransformerConfig, batch: int, seq: int, budget_bytes: int,
             policies: Sequence = DEFAULT_MENU, **kw) -> PlannerResult:
    """The plan of least recompute whose predicted peak activation bytes fit ``budget_bytes`` (PyTorch).

    As :func:`jaxremat.planner.plan_gpt`; the plan goes to :func:`torchref.render.forward_blocks` /
    :func:`torchref.render.model_loss` as the schedule.

    Raises:
        jaxremat.spec.planner.NoPlanFits: no plan fits (the least achievable peak, and a plan).
        ValueError: as :func:`gpt_block_options`, or a negative budget.
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be an integer >= 0, got {budget_bytes!r}")
    chain = gpt_chain(cfg, batch, seq, policies)
    fixed = chain.pop("fixed_bytes")
    try:
        res = plan_for_budget(chain["options_per_block"], max(0, budget_bytes - fixed), chain["boundary_bytes"],
                              chain["invariant_bytes"], **kw)
    except NoPlanFits as exc:
        raise NoPlanFits(budget_bytes, exc.min_peak_bytes + fixed, exc.min_peak_plan) from None
    return dataclasses.replace(res, peak_bytes=res.peak_bytes + fixed, budget_bytes=budget_bytes,
                               min_peak_bytes=res.min_peak_bytes + fixed)
