"""What recording and replaying forward hooks costs per checkpoint, on the default model (gpt-small).

Every checkpointed segment of ``torchref.render.forward_blocks`` records the forward hooks of its
modules in the forward pass and puts them back around its recompute
(:class:`torchref.hooks.ForwardHooks`). This prints, in one run:

* microseconds per checkpoint of that work alone for one GPT block (its 12 modules): no hooks
  (the common case), and a hook removed between forward and backward (the swap path);
* training-step time (forward + backward of :func:`torchref.render.model_loss`) with the replay on
  and off (off: a stub recording nothing), interleaved on, off, on, off, ... so that load on a
  shared machine falls on both alike; medians, min-max, and the ratio of the medians.

Usage::

    python scripts/bench_hook_replay.py                   # gpt-small, full and sqrt, 41 steps each
    python scripts/bench_hook_replay.py --repeats 101 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import numpy as np
import torch

import torchref.forward_state as forward_state
from jaxremat.models import init_params
from jaxremat.spec.plan import parse_plan
from parity.inputs.presets import get_preset
from torchref.hooks import ForwardHooks, owners_of
from torchref.model import GPT
from torchref.render import model_loss


class _NoReplay:
    """ForwardHooks that records nothing (the replay turned off)."""

    def __init__(self, owners):
        pass

    def replayed(self):
        return contextlib.nullcontext()


def per_checkpoint_us(block: torch.nn.Module, calls: int = 2000) -> dict[str, float]:
    """Mean microseconds of record + replay for one block, without hooks and with a hook removed in between."""
    out = {}
    owners = owners_of([block])  # ForwardState lists them for the buffers anyway
    for case in ("no hooks", "a hook removed before backward"):
        t0 = time.perf_counter()
        for _ in range(calls):
            hooks = ForwardHooks(owners)
            handle = block.mlp.register_forward_hook(lambda m, i, o: None) if case != "no hooks" else None
            if handle is not None:
                handle.remove()
            with hooks.replayed():
                pass
        out[case] = (time.perf_counter() - t0) / calls * 1e6
    return out


def step_times(model: GPT, tokens: torch.Tensor, plan: str, repeats: int) -> dict[str, list[float]]:
    """Seconds per training step with the replay on and off, interleaved."""
    parsed = parse_plan(plan)
    schedule, policy = parsed.schedule, (None if parsed.policy.saves_nothing else parsed.policy)
    times: dict[str, list[float]] = {"on": [], "off": []}
    real = forward_state.ForwardHooks
    for i in range(2 * repeats + 2):
        which = "on" if i % 2 == 0 else "off"
        forward_state.ForwardHooks = real if which == "on" else _NoReplay
        try:
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            model_loss(model, tokens, schedule, policy=policy).backward()
            if i >= 2:  # one warm-up step each
                times[which].append(time.perf_counter() - t0)
        finally:
            forward_state.ForwardHooks = real
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt-small")
    parser.add_argument("--plans", default="full,sqrt")
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    preset = get_preset(args.preset)
    cfg = preset.config
    model = GPT.from_params(cfg, init_params(cfg))
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, cfg.vocab_size, (preset.batch_size, preset.seq_len + 1)))
    block = model.blocks[0]
    print(f"# {args.preset}: {cfg.n_layer} layers, B={preset.batch_size}, T={preset.seq_len}; "
          f"{len(owners_of([block]))} modules per block; torch {torch.__version__}, {torch.get_num_threads()} threads")
    for case, us in per_checkpoint_us(block).items():
        print(f"record + replay per checkpoint, {case}: {us:.1f} us")
    print("| plan | step ms on (median; min-max) | step ms off (median; min-max) | on / off |")
    print("|---|---|---|---:|")
    for plan in args.plans.split(","):
        t = step_times(model, tokens, plan, args.repeats)
        on, off = statistics.median(t["on"]), statistics.median(t["off"])
        print(f"| `{plan}` | {on * 1e3:.2f} ({min(t['on']) * 1e3:.2f}-{max(t['on']) * 1e3:.2f}) "
              f"| {off * 1e3:.2f} ({min(t['off']) * 1e3:.2f}-{max(t['off']) * 1e3:.2f}) | {on / off:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
