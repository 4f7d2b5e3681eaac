"""``python -m parity.experiments.plan_candidates``: which plans for a memory budget are fastest, timed whole.

For one framework, model and budget, the candidate plans of :func:`parity.cases.budget_plan.candidate_plans`
on the FLOPs chain and on the chain of block options timed on short segments (``planner_chain(...,
cost="time")``): the planner's plan on each cost, the uniform plan of least cost on each, and ``full`` under each
option of the menu that fits. Their training steps are timed interleaved (:func:`parity.cases.plan_timing.time_plans`,
process CPU time), and each is printed with its paired ratio, median [min-max] over rounds, to the planner's
plan on each cost and to the best uniform plan on each cost. It tells which way of choosing a plan (the FLOPs
model, the segment-time model, or timing the candidates whole) gives the fastest plan (docs/planner.md).

The budget is resolved as ``python -m parity plan`` does (``none``'s measured peak activation, the model's
offset taken off), with no re-planning: a candidate is predicted to fit, not measured.
"""

from __future__ import annotations

import argparse
import time

from jaxremat.spec.plan import parse_plan
from jaxremat.spec.planner import chain_costs, parse_budget

from parity.cases.budget_plan import candidate_plans
from parity.cases.plan_timing import time_plans
from parity.checks.timing import load_average_1min
from parity.inputs.presets import get_preset
from parity.inputs.pretrained import preset_inputs
from parity.runners.framework import FRAMEWORK_NAMES, get_framework


def candidates(framework: str, model: str, budget: str) -> tuple[list, dict, dict]:
    """``([(plan, sources, recompute_flops)], chains, phases)``: the candidates of both chains for ``budget``."""
    preset = get_preset(model)
    cfg, params, tokens = preset_inputs(preset, "float32", 0)
    cfg = cfg.replace(dropout=0.0)
    B, T, fw = preset.batch_size, preset.seq_len, get_framework(framework)
    phases = {}
    t0 = time.perf_counter()
    flops = fw.planner_chain(cfg, B, T, tuple(fw.default_menu()), "flops")
    timed = fw.planner_chain(cfg, B, T, tuple(fw.default_menu()), "time")
    phases["chains_s"] = time.perf_counter() - t0
    measured = fw.measure_plan(cfg, tokens, parse_plan("none"), 1)["peak_activation_bytes"]
    predicted = flops["fixed_bytes"] + chain_costs(flops["options_per_block"], [(cfg.n_layer, "store")],
                                                   flops["boundary_bytes"], flops["invariant_bytes"])[0]
    target = parse_budget(budget).resolve(measured) - max(0, measured - predicted)
    cands = candidate_plans({"flops": flops, "time": timed}, cfg.n_layer, target)
    out = {}
    for plan, pred in cands["budget"]:
        out[plan.name] = (plan, pred["sources"], pred["recompute_flops"])
    return list(out.values()), {"cfg": cfg, "params": params, "tokens": tokens}, phases


def main(argv: list[str] | None = None) -> int:
    """Time the candidates and print one Markdown table; returns 0."""
    ap = argparse.ArgumentParser(prog="python -m parity.experiments.plan_candidates", description=__doc__.split("\n")[0])
    ap.add_argument("--framework", choices=FRAMEWORK_NAMES, default="jax")
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    cands, inputs, phases = candidates(args.framework, args.model, args.budget)
    t0 = time.perf_counter()
    t = time_plans(args.framework, inputs["cfg"], inputs["params"], inputs["tokens"], [c[0] for c in cands],
                   args.rounds)
    phases["compile_and_time_s"] = time.perf_counter() - t0
    refs = {}
    for plan, sources, _ in cands:
        for s in sources:
            if s in ("planner (flops)", "planner (time)", "best uniform (flops)", "best uniform (time)"):
                refs[s] = plan.name
    print(f"# {args.framework}, {args.model}, budget {args.budget}: {len(cands)} candidates, {t.rounds} rounds, "
          f"load {t.load_1min[0]} -> {t.load_1min[1]} (now {load_average_1min()}); "
          + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    cols = ["plan", "why a candidate", "recompute MFLOP", "step ms"] + [f"/ {k}" for k in refs]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for plan, sources, flops in cands:
        ms = t.step_ms(plan.name)
        cells = [f"`{plan.name}`", "; ".join(sources), f"{flops / 1e6:.1f}", f"{ms[0]:.2f} [{ms[1]:.2f}-{ms[2]:.2f}]"]
        cells += [t.ratio(plan.name, ref).text(3) for ref in refs.values()]
        print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
