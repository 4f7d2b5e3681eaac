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

import functools
from typing import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from jaxremat.models.config import TransformerConfig
from jaxremat.models.gpt import activation as account
from jaxremat.models.bert.layout import encoder_chain_base
from jaxremat.models.registry import get_model
from jaxremat.spec.planner import BlockOption, PlannerResult, plan_chain
from jaxremat.spec.policies import parse_policy

from .live_bytes import step_peak_bytes
from .memory import SavedActivationRecorder
from .encoder import EncoderBlock
from .model import Block, torch_dtype
from .policies import SelectiveCheckpoint
from .render import EARLY_STOP

__all__ = ["DEFAULT_MENU", "block_options", "encoder_chain", "gpt_block_options", "gpt_chain", "model_chain", "plan_gpt",
           "plan_model"]

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
    account.check_sizes("torch", cfg, batch, seq)  # the family's sizes and dropout 0
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


class _MaskedBlock(nn.Module):
    """An encoder block with its key mask held as a buffer: ``block(x)``, as :func:`block_options` runs it."""

    def __init__(self, block: EncoderBlock, key_mask: torch.Tensor):
        super().__init__()
        self.block = block
        self.register_buffer("key_mask", key_mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, self.key_mask)


@functools.lru_cache(maxsize=32)
def _cached_encoder_menu(cfg: TransformerConfig, batch: int, seq: int, policies: tuple, seed: int) -> tuple:
    torch.manual_seed(seed)
    block = _MaskedBlock(EncoderBlock(cfg), torch.ones(batch, seq, dtype=torch.bool))
    x = torch.randn(batch, seq, cfg.d_model, dtype=torch_dtype(cfg))
    return tuple(block_options(block, x, policies))


def encoder_chain(cfg: TransformerConfig, batch: int, seq: int, policies: Sequence = DEFAULT_MENU) -> dict:
    """The chain of a BERT encoder stack (:class:`torchref.encoder.EncoderBlock`), as
    :func:`jaxremat.planner.encoder_chain`: menus measured on the block (dropout 0, every key
    real), ``invariant_bytes`` and ``fixed_bytes`` 0, left to the caller's calibration.

    Raises:
        ValueError: a family other than BERT, bad sizes, or a bad menu.
    """
    base = encoder_chain_base(cfg, batch, seq, torch_dtype(cfg).itemsize)
    menu = list(_cached_encoder_menu(cfg.replace(dropout=0.0), batch, seq, _check_menu(policies), 0))
    return {"options_per_block": [menu] * cfg.n_layer, **base}


def model_chain(cfg: TransformerConfig, batch: int, seq: int, policies: Sequence = DEFAULT_MENU) -> dict:
    """The planner's chain of any registered family, in PyTorch (its ``torch_planner_chain``,
    :mod:`jaxremat.models.registry`), as :func:`jaxremat.planner.model_chain`.

    Raises:
        ValueError: a family without a planner chain, or as that family's chain builder.
    """
    return get_model(cfg.arch).load("torch_planner_chain")(cfg, batch, seq, policies)


def plan_model(cfg: TransformerConfig, batch: int, seq: int, budget_bytes: int,
               policies: Sequence = DEFAULT_MENU, **kw) -> PlannerResult:
    """The plan of least recompute whose predicted peak activation bytes fit ``budget_bytes`` (PyTorch).

    As :func:`jaxremat.planner.plan_model`; the plan goes to :func:`torchref.render.forward_blocks` /
    :func:`torchref.render.model_loss` as the schedule.

    Raises:
        jaxremat.spec.planner.NoPlanFits: no plan fits (the least achievable peak, and a plan).
        ValueError: as :func:`model_chain`, or a negative budget.
    """
    return plan_chain(model_chain(cfg, batch, seq, policies), budget_bytes, **kw)


def plan_gpt(cfg: TransformerConfig, batch: int, seq: int, budget_bytes: int,
             policies: Sequence = DEFAULT_MENU, **kw) -> PlannerResult:
    """:func:`plan_model` for a GPT (raises ValueError for another family)."""
    if cfg.arch != "gpt":
        raise ValueError(f"plan_gpt plans a GPT; cfg.arch is {cfg.arch!r} (use plan_model)")
    return plan_model(cfg, batch, seq, budget_bytes, policies, **kw)
