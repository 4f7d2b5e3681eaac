"""The planner's time cost in PyTorch: each block option's forward and backward time, measured.

The PyTorch side of :mod:`jaxremat.block_time`: for every option of a block's menu (``store``, or
checkpoint under a policy, rendered as :func:`torchref.render.forward_blocks` renders a segment plan:
non-reentrant checkpoint, selective checkpoint contexts for a policy) a segment of ``L`` blocks runs
its forward pass alone (the autograd graph recorded, as in a training step) and its whole training
step (forward, then backward of the output's sum: the recompute included), timed at two lengths,
interleaved with every other option's over several rounds
(:func:`jaxremat.spec.option_time.measure_options`); the slope against the length is one block's
time, the intercept a segment's own. The timing runs on one intra-op thread (``torch.set_num_threads(1)``,
restored after): on a shared machine torch's OpenMP workers spin while they wait, which inflated both the
CPU time and the wall time of a gpt-small block several-fold and made them vary 10x between repeats at
load 9 on 2 cores; on one thread the repeats agreed within about 20%. Blocks are built with fixed seeds; a measurement is kept per
(model, batch, sequence, option, rounds) for the life of the process.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from jaxremat.models.config import TransformerConfig
from jaxremat.spec.option_time import DEFAULT_LENGTHS, DEFAULT_ROUNDS, OptionTime, measure_options, option_plan, timed_gpt_chain

from .model import Block, torch_dtype
from .planner import DEFAULT_MENU, gpt_chain
from .render import forward_blocks

__all__ = ["block_option_times", "gpt_option_times", "timed_chain"]

_MEASURED: dict = {}
"""(cfg, batch, seq, rounds, lengths, option name) -> OptionTime: the process's measurements."""


def _segment_calls(make_block: Callable[[], nn.Module], x: torch.Tensor) -> Callable[[str, int], tuple]:
    blocks_of: dict = {}

    def calls(name: str, length: int) -> tuple:
        if length not in blocks_of:
            torch.manual_seed(length)
            blocks_of[length] = [make_block() for _ in range(length)]
        blocks = blocks_of[length]
        plan = option_plan(name, length)
        h = x.detach().clone().requires_grad_(True)

        def forward():
            return forward_blocks(blocks, h, plan)

        def step():
            for b in blocks:
                b.zero_grad(set_to_none=True)
            h.grad = None
            forward_blocks(blocks, h, plan).sum().backward()
        return forward, step
    return calls


def block_option_times(make_block: Callable[[], nn.Module], x: torch.Tensor, names: Sequence[str], *,
                       rounds: int = DEFAULT_ROUNDS, lengths: Sequence[int] = DEFAULT_LENGTHS,
                       **kw) -> dict[str, OptionTime]:
    """Measure each option of ``names`` on segments of blocks built by ``make_block`` (module docstring).

    Args:
        make_block: builds one block, ``block(x) -> y`` with y of x's shape (called once per block of a
            timed segment).
        x: an example input, e.g. a (B, T, D) float32 tensor.
        names: option names: ``"store"`` or a policy name (``"save_nothing"``: plain checkpoint).
        rounds, lengths: as :func:`jaxremat.spec.option_time.measure_options`.
        **kw: ``min_sample_s``, ``clock`` (:func:`jaxremat.spec.option_time.time_rounds`).

    Returns:
        ``{name: OptionTime}`` (seconds per block, with spread).

    Raises:
        ValueError: an unknown policy name, or bad lengths or rounds.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one intra-op thread while timing (module docstring); restored after
    try:
        return measure_options(_segment_calls(make_block, x), list(names), lengths=lengths, rounds=rounds, **kw)
    finally:
        torch.set_num_threads(threads)


def gpt_option_times(cfg: TransformerConfig, batch: int, seq: int, names: Sequence[str], *,
                     rounds: int = DEFAULT_ROUNDS, lengths: Sequence[int] = DEFAULT_LENGTHS) -> dict[str, OptionTime]:
    """:func:`block_option_times` on :class:`torchref.model.Block` at (B, T); an option measured before in
    this process at the same model, shape, rounds and lengths is reused."""
    key = (cfg, int(batch), int(seq), int(rounds), tuple(lengths))
    todo = [n for n in names if key + (n,) not in _MEASURED]
    if todo:
        torch.manual_seed(0)
        x = torch.randn(batch, seq, cfg.d_model, dtype=torch_dtype(cfg))
        for name, t in block_option_times(lambda: Block(cfg), x, todo, rounds=rounds, lengths=lengths).items():
            _MEASURED[key + (name,)] = t
    return {n: _MEASURED[key + (n,)] for n in names}


def timed_chain(cfg: TransformerConfig, batch: int, seq: int, policies: Sequence = DEFAULT_MENU, *,
                rounds: int = DEFAULT_ROUNDS) -> dict:
    """:func:`torchref.planner.gpt_chain` with every option's measured ``step_time_s`` and
    ``segment_time_s`` set, and ``option_times`` (``{name: OptionTime}``) added, as
    :func:`jaxremat.block_time.timed_chain`.

    Raises:
        ValueError: a family other than GPT, bad sizes, or a bad menu.
    """
    return timed_gpt_chain(cfg, batch, seq, policies, rounds, gpt_chain, gpt_option_times)
