"""Benchmark of the remat planner (jaxremat.spec.planner.plan_for_budget): N blocks, a menu of
options per block with random heterogeneous costs, a budget between the least peak and storing
everything; prints the median wall time of a few runs (issue 14: N = 128, >= 6 options, <= 2 s).

    python scripts/bench_planner.py [--blocks 128] [--options 6] [--runs 5] [--resolution 1000]

Not a timed test: it prints the time and the plan's numbers.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from jaxremat.spec.planner import DEFAULT_RESOLUTION, BlockOption, min_peak_plan, plan_for_budget

POLICIES = ("save_nothing", "save_dots", "save_dots_no_batch", "attention_only", "mlp_only", "save_qkv_proj",
            "save_out_proj", "save_dots_except_mlp")


def random_menus(n_blocks: int, n_options: int, seed: int = 0) -> list[list[BlockOption]]:
    """Store plus ``n_options - 1`` checkpoint options per block, costs drawn per block (bytes ~ 1e8)."""
    rng = random.Random(seed)
    menus = []
    for _ in range(n_blocks):
        full = rng.randint(50_000_000, 150_000_000)
        menu = [BlockOption("store", False, None, full, full, 0)]
        for p in POLICIES[:n_options - 1]:
            kept = rng.randint(0, full // 2)
            menu.append(BlockOption(p, True, p, kept, full, rng.uniform(1e9, 1e10) * (1 - kept / full)))
        menus.append(menu)
    return menus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=128)
    ap.add_argument("--options", type=int, default=6, choices=range(1, len(POLICIES) + 2))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--resolution", type=int, default=DEFAULT_RESOLUTION)
    args = ap.parse_args()
    menus = random_menus(args.blocks, args.options)
    boundary = 16_000_000
    least, _ = min_peak_plan(menus, boundary)
    everything = sum(m[0].kept_bytes for m in menus) + boundary
    budget = (least + everything) // 3
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        r = plan_for_budget(menus, budget, boundary, resolution=args.resolution)
        times.append(time.perf_counter() - t0)
    print(f"blocks={args.blocks} options={args.options} resolution={args.resolution} budget={budget / 2**30:.2f} GiB "
          f"(least peak {least / 2**30:.2f} GiB, store all {everything / 2**30:.2f} GiB)")
    print(f"plan: {len(r.plan.segments)} segments, peak {r.peak_bytes / 2**30:.2f} GiB, "
          f"recompute {r.recompute_flops:.3e} FLOPs, quantum {r.quantum_bytes} bytes")
    print(f"plan_for_budget median time over {args.runs} runs: {statistics.median(times):.3f} s "
          f"(min {min(times):.3f} s, max {max(times):.3f} s)")


if __name__ == "__main__":
    main()
