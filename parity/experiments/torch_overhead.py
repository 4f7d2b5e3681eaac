"""``python -m parity.experiments.torch_overhead``: where PyTorch's remat overhead goes, per step and per checkpoint.

Two measurements, both printed as Markdown (docs/time.md quotes them):

1. ``torch.profiler`` (``with_flops=True``) over one training step of each variant on the GPT:
   ``none``, torchref's ``full`` and ``full+attention_only``, and plain torch on the same blocks
   (``torch.utils.checkpoint.checkpoint`` per block, ``use_reentrant=False``, early stop on -- torch's
   default -- and off, as torchref runs it). Per variant: matrix-product FLOPs, ATen ops run, the
   step's CPU time (``time.process_time``), and the share of its wall time spent outside ATen ops
   (Python, autograd's engine, the checkpoint's saved-tensor hooks; the profiler's op times are wall
   times, so a share, not seconds, survives load). Recompute is what the FLOPs and op counts add over ``none``;
   what torch's early stop saves is the difference between the two plain variants.
2. Fixed costs per checkpoint on a no-op segment (:func:`fixed_costs_us`): torch's non-reentrant
   checkpoint (saved-tensor hooks, the recompute call), the part of it that saves and restores the
   RNG state (``preserve_rng_state=True``), and torchref's :class:`torchref.forward_state.ForwardState`
   (buffer snapshot, forward hooks recorded and replayed, :func:`torchref.hooks.is_recomputing`).

Each of the step's variants is run ``--repeats`` times, interleaved, and the profile of the median
step (by CPU time) is kept; the fixed-cost loops are timed in CPU time too. Process pinned to one
core, torch on one thread.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint

from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.plan import parse_plan
from torchref.forward_state import ForwardState
from torchref.model import GPT, compute_context, lm_loss, split_tokens
from torchref.render import model_loss

from parity.checks.timing import load_average_1min

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def _variants(model: GPT, tokens: torch.Tensor) -> dict:
    def plain(early_stop: bool):
        def step():
            inputs, targets = split_tokens(tokens)
            with compute_context(model.cfg):
                x = model.embed(inputs)
                for b in model.blocks:
                    x = checkpoint(b, x, use_reentrant=False, early_stop=early_stop)
                logits = model.head(x)
            lm_loss(logits, targets).backward()
        return step

    def ours(plan: str):
        parsed = parse_plan(plan)
        return lambda: model_loss(model, tokens, parsed).backward()

    return {"none": ours("none"), "full": ours("full"), "full+attention_only": ours("full+attention_only"),
            "plain:full": plain(True), "plain:full:no_early_stop": plain(False)}


def _profiled(step) -> dict:
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    # An op called under a dispatch mode (the selective checkpoint's) is recorded at the dispatcher's entry
    # with a PythonDispatchMode child, under which it is recorded again if the mode runs it (not when the
    # mode returns a cached output): only that inner record counts.
    events = [e for e in prof.events() if e.name.startswith("aten::")
              and not any(c.name == "PythonDispatchMode" for c in e.cpu_children)]
    matmuls = [e for e in events if e.name in MATMUL_OPS]
    return {"wall_s": wall, "cpu_s": cpu, "matmul_flops": sum(e.flops or 0 for e in matmuls), "matmuls": len(matmuls),
            "aten_ops": len(events), "aten_self_s": sum(e.self_cpu_time_total for e in events) / 1e6}


def profile_steps(model: GPT, tokens: torch.Tensor, repeats: int) -> dict:
    """Per variant, the profile of its median-wall step over ``repeats`` interleaved profiled steps."""
    variants = _variants(model, tokens)
    for step in variants.values():
        step()
    runs = {n: [] for n in variants}
    for _ in range(repeats):
        for name, step in variants.items():
            model.zero_grad(set_to_none=True)
            runs[name].append(_profiled(step))
    return {n: sorted(r, key=lambda x: x["cpu_s"])[len(r) // 2] for n, r in runs.items()}


def fixed_costs_us(model: GPT, calls: int, rounds: int = 7) -> dict:
    """Microseconds per checkpoint of torch's and torchref's fixed work on a no-op segment (``t * 2``).

    Four loops, interleaved over ``rounds`` rounds of ``calls`` calls each, the fastest round of each
    (``timeit``'s rule: load only ever adds time to a loop this short): the op with its
    backward, the same under ``checkpoint`` with and without RNG state preserved, and under
    ``checkpoint(ForwardState([block]).wrap(...))`` as torchref calls it (the GPT's first block: its
    modules and buffers are what ForwardState walks). The differences are the fixed costs.
    """
    block = model.blocks[0]
    x = torch.zeros(4, requires_grad=True)

    def op(t):
        return t * 2

    def ckpt(fn, preserve):
        return lambda: checkpoint(fn(), x, use_reentrant=False, preserve_rng_state=preserve,
                                  early_stop=False).sum().backward()

    loops = {"op": lambda: op(x).sum().backward(), "checkpoint": ckpt(lambda: op, True),
             "checkpoint, no RNG": ckpt(lambda: op, False),
             "checkpoint + ForwardState": ckpt(lambda: ForwardState([block]).wrap(op), True)}
    us = {n: [] for n in loops}
    for r in range(rounds):
        for name, fn in loops.items():
            t0 = time.process_time()
            for _ in range(calls):
                fn()
            us[name].append((time.process_time() - t0) / calls * 1e6)
    m = {n: min(v) for n, v in us.items()}
    return {"torch checkpoint machinery (hooks, recompute call, RNG)": m["checkpoint"] - m["op"],
            "of which RNG state save + restore": m["checkpoint"] - m["checkpoint, no RNG"],
            "torchref ForwardState (buffers, forward hooks, is_recomputing)": m["checkpoint + ForwardState"] - m["checkpoint"]}


def main(argv: list[str] | None = None) -> int:
    """Parse the options, measure, print two Markdown tables; returns 0."""
    ap = argparse.ArgumentParser(prog="python -m parity.experiments.torch_overhead", description=__doc__.split("\n")[0])
    ap.add_argument("--d-model", type=int, default=256, help="d_model (d_ff = 4 d_model, 4 heads, 8 layers)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="profiled steps per variant (interleaved)")
    ap.add_argument("--calls", type=int, default=500, help="calls per fixed-cost loop and round")
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    cfg = TransformerConfig(vocab_size=256, n_layer=8, d_model=args.d_model, n_head=4, d_ff=4 * args.d_model,
                            max_seq_len=args.seq_len)
    model = GPT.from_params(cfg, init_params(cfg))
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq_len + 1)))
    load = load_average_1min()
    prof = profile_steps(model, tokens, args.repeats)
    ref = prof["none"]
    print(f"# torch {torch.__version__}, 1 thread; 8 layers, d_model {args.d_model}, B={args.batch}, "
          f"T={args.seq_len}; load {load} -> {load_average_1min()}")
    print("\n| variant | matmul GFLOP (/none) | matmuls | ATen ops | step CPU s (/none) | outside ATen, share of wall |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, p in prof.items():
        print(f"| `{name}` | {p['matmul_flops'] / 1e9:.2f} ({p['matmul_flops'] / ref['matmul_flops']:.3f}) | "
              f"{p['matmuls']} | {p['aten_ops']} | {p['cpu_s']:.3f} ({p['cpu_s'] / ref['cpu_s']:.2f}) | "
              f"{1 - p['aten_self_s'] / p['wall_s']:.1%} |")
    print(f"\n| fixed cost per checkpoint (CPU time, fastest of 7 interleaved rounds of {args.calls} calls) | us |")
    print("|---|---:|")
    for name, us in fixed_costs_us(model, args.calls).items():
        print(f"| {name} | {us:.1f} |")
    print(f"\n(median step by CPU time, {args.repeats} profiled steps per variant; load {load_average_1min()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
