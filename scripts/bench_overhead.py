"""Remat's step-time overhead against ``none``, both frameworks, beside the one-extra-forward bound.

Chen et al. 2016 (arXiv:1604.06174) bound checkpointing's cost at one extra forward pass: a training
step goes from ~3 forward-equivalents (forward + backward at ~2x) to ~4, i.e. at most 4/3 of ``none``;
on an A100, seed 002 measured +11% to +22%. This benchmark measures, in one run:

* two sizes: ``compute`` (8 layers, d_model 256, d_ff 1024, T=256, B=3: a step of ~0.55 s of CPU on one
  core, compute dominates) and ``default`` (the gpt-small preset, B=4, T=64: a step of tens of ms,
  where fixed per-checkpoint costs show);
* the plans ``none``, ``full``, ``every_k(2)``, ``sqrt``, ``full+attention_only`` and the planner's plan
  for 50% of ``none``'s predicted peak activation (``budget(50%)``; each framework's own planner:
  :func:`torchref.planner.plan_model`, :func:`jaxremat.planner.plan_model`);
* PyTorch only, plain torch on the same blocks: ``plain:full`` (``torch.utils.checkpoint.checkpoint``
  per block, ``use_reentrant=False``, torch's defaults), ``plain:full:no_early_stop`` (the same with early
  stop off, as torchref runs it), ``plain:sqrt`` (``checkpoint_sequential`` with sqrt's segment count) and
  ``plain:full+attention_only`` (torch's ``create_selective_checkpoint_contexts`` with a policy function
  that saves the ops of the policy's regions, :func:`torchref.names.current_name`, and nothing else), and
  ``plain:full+attention_only:no_early_stop`` (the same with early stop off, as torchref runs it).

Each framework runs in its own process, pinned to one core (``os.sched_setaffinity``; torch with one
intra-op and one inter-op thread, XLA:CPU without its Eigen thread pool). JAX steps are
``jit(value_and_grad(loss_fn))`` compiled once before timing; every plan gets one warm-up step. The
plans then run interleaved A B A B for ``--rounds`` rounds: a round runs each plan right after (in odd
rounds right before) its own ``none`` step, so a pair shares the load of its moment, the pairs' order
rotated every round; torchref and plain torch are paired the same way. Each plan's overhead is the
median of its per-round ratios to ``none`` with [min-max] (:func:`parity.checks.timing.ratio_spread`),
marked ``noise`` when the spread is wider than the effect. Each step is timed on two clocks: the
worker's CPU time (``time.process_time``; single-threaded and pinned, it is the step's compute, the
time other jobs held the core left out) and wall time; a table per clock. The 1-minute load average is read every round and printed beside every figure.

Usage::

    python scripts/bench_overhead.py                          # both sizes, both frameworks, 7 rounds
    python scripts/bench_overhead.py --sizes compute --rounds 9 --json overhead.json
    python scripts/bench_overhead.py --frameworks torch --plans none,full --sizes default
    python scripts/bench_overhead.py --planner     # the planner on FLOPs and on measured time, and the uniform plans

``--planner`` times :data:`parity.experiments.overhead_plans.BUDGET_PLANS` (chosen there) and pairs the time-cost
plan directly with the others (:data:`PLANNER_PAIRS`). The ``:time`` plans are chosen in the worker, pinned like
the steps, the way ``python -m parity plan --cost time`` chooses them
(:attr:`parity.runners.framework.FrameworkInfo.time_cost`): PyTorch on block options timed on segments; JAX among candidate plans compiled and timed whole
(:func:`parity.cases.budget_plan.timed_choice`), whose compiled steps the benchmark then times.

Not a timed test: it prints ratios measured side by side (docs/time.md has the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from parity.checks.timing import RatioSpread, load_average_1min, ratio_spread
from parity.experiments.overhead_plans import BUDGET_PLANS, chain_cache, choose_plans, option_times, plan_timer

PLANS = ("none", "full", "every_k(2)", "sqrt", "full+attention_only", "budget(50%)")
PLANNER_PAIRS = (("best_uniform(50%):time", "budget(50%):time"), ("best_uniform(50%)", "budget(50%):time"),
                 ("budget(50%)", "budget(50%):time"))
"""(reference, candidate): the time-cost plan paired directly with the uniform plans and the FLOPs plan."""
TORCH_REFERENCES = ("plain:full", "plain:full:no_early_stop", "plain:sqrt", "plain:full+attention_only",
                    "plain:full+attention_only:no_early_stop")
REFERENCE_PAIRS = (("full", "plain:full"), ("full", "plain:full:no_early_stop"), ("sqrt", "plain:sqrt"),
                   ("full+attention_only", "plain:full+attention_only"),
                   ("full+attention_only", "plain:full+attention_only:no_early_stop"))
"""(torchref plan, plain torch on the same blocks): torchref is held to at most 1.05x the plain call."""
BOUND = 4 / 3
FORWARD = "forward"
"""The loss alone, no gradient: its ratio to ``none`` is one forward pass in step units, so ``1 + forward / none``
is the one-extra-forward bound as measured here (the whole model's forward: an upper bound for the blocks')."""
SEED_002 = "+11..22% (A100, seed 002)"
SIZES = {
    # name: (n_layer, d_model, n_head, d_ff, batch, seq_len)
    "compute": (8, 256, 4, 1024, 3, 256),
    "default": (8, 64, 4, 256, 4, 64),
}


def _config(size: str):
    from jaxremat.models import TransformerConfig
    from parity.inputs.corpus import BYTE_VOCAB_SIZE

    n_layer, d_model, n_head, d_ff, batch, seq = SIZES[size]
    return TransformerConfig(vocab_size=BYTE_VOCAB_SIZE, n_layer=n_layer, d_model=d_model, n_head=n_head,
                             d_ff=d_ff, max_seq_len=seq), batch, seq


def _pairs(names: list[str]) -> list[tuple[str, str]]:
    """(reference, candidate) pairs: every plan against ``none``, torchref against plain torch on the same blocks."""
    pairs = [("none", n) for n in names if n != "none"]
    pairs += [(ref, cand) for ref, cand in PLANNER_PAIRS if ref in names and cand in names]
    return pairs + [(plain, ours) for ours, plain in REFERENCE_PAIRS if ours in names and plain in names]


def _interleave(steps: dict, rounds: int) -> dict:
    """One warm-up step per plan, then ``rounds`` rounds; a round runs every pair back to back (A B, B A in
    odd rounds), the pairs' order rotated per round, so that load falls on both steps of a pair alike."""
    for step in steps.values():
        step()
    pairs = _pairs(list(steps))
    times = {p: {"wall": ([], []), "cpu": ([], [])} for p in pairs}
    loads = []
    for r in range(rounds):
        loads.append(load_average_1min())
        for ref, cand in pairs[r % len(pairs):] + pairs[:r % len(pairs)]:
            for name in ((ref, cand) if r % 2 == 0 else (cand, ref)):
                w0, c0 = time.perf_counter(), time.process_time()
                steps[name]()
                c1, w1 = time.process_time(), time.perf_counter()
                times[(ref, cand)]["wall"][name == cand].append(w1 - w0)
                times[(ref, cand)]["cpu"][name == cand].append(c1 - c0)
    return {"pairs": [{"reference": ref, "candidate": cand, "reference_s": t["wall"][0], "candidate_s": t["wall"][1],
                       "reference_cpu_s": t["cpu"][0], "candidate_cpu_s": t["cpu"][1]}
                      for (ref, cand), t in times.items()], "load_1min": loads}


def _torch_steps(size: str, plans: list[str]) -> tuple[dict, dict]:
    # Deferred imports: a worker process loads one framework only.
    import numpy as np
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, checkpoint_sequential, create_selective_checkpoint_contexts

    from jaxremat.models import init_params
    from jaxremat.spec.plan import parse_plan
    from jaxremat.spec.policies import parse_policy
    from torchref.model import GPT, compute_context, lm_loss, split_tokens
    from torchref.names import current_name
    from torchref.policies import is_view_op
    from torchref.block_time import timed_chain
    from torchref.planner import model_chain
    from torchref.render import model_loss

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    cfg, batch, seq = _config(size)
    params = init_params(cfg)
    model = GPT.from_params(cfg, params)
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1)))
    n_sqrt = len(parse_plan("sqrt").schedule.segments_for(cfg.n_layer))

    kept = parse_policy("attention_only").save_names

    def sac_policy(ctx, op, *args, **kwargs):
        save = not is_view_op(op) and current_name() in kept
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    def plain(kind: str):
        def blocks(x):
            if kind == "plain:sqrt":
                return checkpoint_sequential(list(model.blocks), n_sqrt, x, use_reentrant=False)
            early_stop = not kind.endswith(":no_early_stop")
            if kind.startswith("plain:full+attention_only"):
                for b in model.blocks:
                    x = checkpoint(b, x, use_reentrant=False, early_stop=early_stop,
                                   context_fn=lambda: create_selective_checkpoint_contexts(sac_policy))
                return x
            for b in model.blocks:
                x = checkpoint(b, x, use_reentrant=False, early_stop=early_stop)
            return x

        def step():
            model.zero_grad(set_to_none=True)  # as torchref's steps: fresh gradients, none accumulated
            inputs, targets = split_tokens(tokens)
            with compute_context(cfg):
                logits = model.head(blocks(model.embed(inputs)))
            lm_loss(logits, targets).backward()
        return step

    chains, got = chain_cache(model_chain, timed_chain, cfg, batch, seq)
    chosen, candidates = choose_plans(plans, chains, cfg.n_layer, plan_timer("torch", cfg, params, tokens.numpy()),
                                      TORCH_REFERENCES)

    def ours(plan):
        def step():
            model.zero_grad(set_to_none=True)
            model_loss(model, tokens, plan).backward()
        return step

    steps = {n: (plain(n) if n in TORCH_REFERENCES else ours(chosen[n])) for n in plans}
    steps[FORWARD] = lambda: model_loss(model, tokens, chosen["none"])  # graph recorded, as a recompute does
    info = {"threads": torch.get_num_threads(), "version": torch.__version__,
            "resolved": {n: p.name for n, p in chosen.items()}, "candidates": candidates, **option_times(got)}
    return steps, info


def _jax_steps(size: str, plans: list[str]) -> tuple[dict, dict]:
    # Deferred imports: a worker process loads one framework only, after XLA_FLAGS is set.
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxremat.model import loss_fn
    from jaxremat.models import init_params
    from jaxremat.block_time import timed_chain
    from jaxremat.planner import model_chain
    from jaxremat.spec.plan import parse_plan
    from parity.runners.jax_runner import compiled_step

    cfg, batch, seq = _config(size)
    canonical = init_params(cfg)
    tokens_np = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1))
    params = {k: jnp.asarray(v) for k, v in canonical.items()}
    tokens = jnp.asarray(tokens_np, dtype=jnp.int32)
    chains, got = chain_cache(model_chain, timed_chain, cfg, batch, seq)
    t0 = time.perf_counter()
    chosen, candidates = choose_plans(plans, chains, cfg.n_layer, plan_timer("jax", cfg, canonical, tokens_np))
    choose_s = time.perf_counter() - t0
    steps, compile_s = {}, {}
    for name, plan in chosen.items():
        t0 = time.perf_counter()
        compiled = compiled_step(cfg, plan, tuple(tokens.shape), False)  # the candidates' own, compiled once
        compile_s[name] = time.perf_counter() - t0
        steps[name] = lambda c=compiled: jax.block_until_ready(c(params, tokens, None))
    forward = jax.jit(lambda p, t: loss_fn(p, t, cfg, parse_plan("none"))).lower(params, tokens).compile()
    steps[FORWARD] = lambda: jax.block_until_ready(forward(params, tokens))
    return steps, {"version": jax.__version__, "resolved": {n: p.name for n, p in chosen.items()},
                   "compile_s": compile_s, "choose_s": choose_s, "candidates": candidates, **option_times(got)}


def worker(framework: str, size: str, plans: list[str], rounds: int, core: int) -> dict:
    """Pin this process to ``core``, build the steps of ``framework`` and time them interleaved."""
    os.sched_setaffinity(0, {core})
    if framework == "jax":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
        steps, info = _jax_steps(size, plans)
    else:
        steps, info = _torch_steps(size, plans)
    return {"framework": framework, "size": size, "core": core, **info, **_interleave(steps, rounds)}


def _load_text(loads: list) -> str:
    loads = [x for x in loads if x is not None]
    if not loads:
        return "load n/a"
    return f"load {statistics.median(loads):.1f} [{min(loads):.1f}-{max(loads):.1f}]"


def summarize(run: dict, clock: str = "cpu") -> dict:
    """Per plan: the paired ratio to ``none``; torchref against plain torch; ``none``'s median step time (s).

    ``clock`` is ``"cpu"`` (the worker's CPU time, ``time.process_time``: what the step computed, the
    time other processes held the core left out) or ``"wall"`` (``time.perf_counter``).
    """
    key = "_cpu_s" if clock == "cpu" else "_s"
    out = {"none_step_time_s": statistics.median(t for p in run["pairs"] if p["reference"] == "none"
                                                 for t in p["reference" + key]),
           "load": _load_text(run["load_1min"]), "ratios": {}, "vs_plain": {}, "vs_budget": {}}
    for p in run["pairs"]:
        rs = ratio_spread(p["candidate" + key], p["reference" + key])
        if p["reference"] == "none":
            out["ratios"][p["candidate"]] = rs
        elif p["reference"] in BUDGET_PLANS:
            out["vs_budget"][f"{p['candidate']} / {p['reference']}"] = rs
        else:
            out["vs_plain"][f"{p['candidate']} / {p['reference']}"] = rs
    return out


def print_size(size: str, runs: list[dict], clock: str) -> None:
    """One Markdown table per size and clock: each plan's ratio to ``none`` in each framework, then torchref
    vs plain torch."""
    n_layer, d_model, _, d_ff, batch, seq = SIZES[size]
    sums = {r["framework"]: summarize(r, clock) for r in runs}
    print(f"\n## {size}, {clock} time: {n_layer} layers, d_model {d_model}, d_ff {d_ff}, B={batch}, T={seq}; "
          f"bound {BOUND:.2f}x (one extra forward, 3 -> 4 forward-equivalents); measured elsewhere {SEED_002}")
    for r in runs:
        s = sums[r["framework"]]
        fwd = s["ratios"].pop(FORWARD, None)
        bound = f"1 + forward/none = {1 + fwd.median:.2f}x [{1 + fwd.low:.2f}-{1 + fwd.high:.2f}]" if fwd else "-"
        print(f"- {r['framework']}: none {s['none_step_time_s'] * 1e3:.0f} ms/step on core {r['core']}, {s['load']}; "
              f"bound measured here {bound}; " + "; ".join(f"{n} = {r['resolved'][n]}" for n in BUDGET_PLANS
                                                          if n in r["resolved"]))
    fws = [r["framework"] for r in runs]
    names = []
    for s in sums.values():
        names += [n for n in s["ratios"] if n not in names]
    print("\n| plan | " + " | ".join(f"{f} / none (median [min-max])" for f in fws) + " | within 4/3? |")
    print("|---|" + "---:|" * len(fws) + "---|")
    for name in names:
        cells = [sums[f]["ratios"][name].text() if name in sums[f]["ratios"] else "-" for f in fws]
        within = [f for f in fws if name in sums[f]["ratios"] and sums[f]["ratios"][name].median <= BOUND]
        print(f"| `{name}` | " + " | ".join(cells) + f" | {', '.join(within) or 'no'} |")
    for f in fws:
        for label, rs in sums[f]["vs_plain"].items():
            verdict = "within 1.05x" if rs.median <= 1.05 else "ABOVE 1.05x"
            print(f"- {f}: torchref `{label}` = {rs.text(3)} ({verdict}; {sums[f]['load']})")
        for label, rs in sums[f]["vs_budget"].items():
            verdict = "noise: decides nothing" if rs.noise else "slower" if rs.median > 1 else "no slower"
            print(f"- {f}: `{label}` = {rs.text(3)} ({verdict}; {sums[f]['load']})")
    if clock == "cpu":  # chosen once, on CPU time
        _print_candidates(runs)


def _print_candidates(runs: list[dict]) -> None:
    """Per plan chosen among candidates timed whole: the choice, why, and every candidate with its paired ratio."""
    def ratio(d: dict) -> str:
        return RatioSpread(d["median"], d["min"], d["max"], d["rounds"]).text(3)

    for r in runs:
        for name, c in r.get("candidates", {}).items():
            print(f"- {r['framework']}: `{name}` chose `{r['resolved'][name]}`: {c['choice_reason']} "
                  f"({c['timing']['rounds']} rounds, load {c['timing']['load_1min']}); candidates: " + "; ".join(
                      f"`{row['plan']}` ({', '.join(row['sources'])}; {row['recompute_flops'] / 1e6:.0f} MFLOP; "
                      f"{row['step_ms'][0]:.0f} ms; {ratio(row['vs_model_choice'])} of the model's choice)"
                      for row in c["candidates"]))


def _run_worker(framework: str, size: str, plans: list[str], rounds: int, core: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", framework, "--sizes", size, "--plans", ",".join(plans),
           "--rounds", str(rounds), "--core", str(core)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _split(text: str) -> list[str]:
    from parity.cli.util import split_list

    return split_list(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="compute,default", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--frameworks", default="torch,jax")
    ap.add_argument("--plans", default=",".join(PLANS), help="plans timed against none (none is always added)")
    ap.add_argument("--no-plain", action="store_true", help="leave out plain torch checkpoint references")
    ap.add_argument("--planner", action="store_true",
                    help="time the budget plans only: " + ", ".join(BUDGET_PLANS).replace("%", "%%") + " (the planner on FLOPs and on "
                    "measured time, the best uniform plan on each), plain torch left out")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (>= 2)")
    ap.add_argument("--core", type=int, default=None, help="the core each worker is pinned to (default: the last)")
    ap.add_argument("--json", default=None, help="also write every step time and load reading to this file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes, frameworks = _split(args.sizes), _split(args.frameworks)
    plans = ["none", *(p for p in (BUDGET_PLANS if args.planner else _split(args.plans)) if p != "none")]
    args.no_plain = args.no_plain or args.planner
    bad = [s for s in sizes if s not in SIZES] + [f for f in frameworks if f not in ("torch", "jax")]
    if bad or args.rounds < 2:
        print(f"bench_overhead: unknown {bad} or --rounds {args.rounds} < 2; sizes are {', '.join(SIZES)}, "
              "frameworks torch and jax", file=sys.stderr)
        return 2
    core = args.core if args.core is not None else max(os.sched_getaffinity(0))
    if args.worker:
        print(json.dumps(worker(args.worker, sizes[0], plans, args.rounds, core)))
        return 0
    print(f"# bench_overhead: {args.rounds} interleaved rounds, each framework in its own process pinned to core "
          f"{core}; load at start {load_average_1min()} on {os.cpu_count()} cores")
    runs = []
    for size in sizes:
        size_runs = []
        for fw in frameworks:
            fw_plans = plans + ([] if args.no_plain or fw != "torch" else list(TORCH_REFERENCES))
            size_runs.append(_run_worker(fw, size, fw_plans, args.rounds, core))
        for clock in ("cpu", "wall"):
            print_size(size, size_runs, clock)
        sys.stdout.flush()
        runs += size_runs
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(runs, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
