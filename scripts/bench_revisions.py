"""Benchmark: compiled peak and step time of the quick-suite plans, two revisions of jaxremat side by side.

Each revision is exported from git (``git archive``) into a temporary directory; a fresh Python
process per (revision, plan) imports that revision's ``jaxremat``, compiles
``jax.jit(jax.value_and_grad(loss_fn))`` for a preset, reads XLA's memory plan
(``Compiled.memory_analysis()``: temp bytes, and the peak: argument + output + temp - alias) and
times ``--steps`` steps after one warm-up step. Rounds alternate the revisions (A B A B ...) so that
the machine's load falls on both alike; the table gives memory once (it is deterministic) and the
median step time over the rounds with its min-max spread.

Usage::

    python scripts/bench_revisions.py --before 3a36ec3 --after HEAD            # gpt-small, quick plans
    python scripts/bench_revisions.py --before 3a36ec3 --after HEAD --model gpt-tiny --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANS = ("none", "full", "every_k(2)", "sqrt", "segments(4)")

WORKER = r"""
import json, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np
from jaxremat.model import loss_fn
from jaxremat.models import init_params
from jaxremat.spec import parse_schedule
from parity.inputs.presets import get_preset
preset = get_preset(sys.argv[1]); cfg = preset.config; plan = sys.argv[2]; steps = int(sys.argv[3])
params = {k: jnp.asarray(v) for k, v in init_params(cfg, seed=1).items()}
tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (preset.batch_size, preset.seq_len + 1)),
                     jnp.int32)
f = jax.jit(jax.value_and_grad(lambda p, t: loss_fn(p, t, cfg, parse_schedule(plan))))
compiled = f.lower(params, tokens).compile()
m = compiled.memory_analysis()
jax.block_until_ready(compiled(params, tokens))
times = []
for _ in range(steps):
    t0 = time.perf_counter(); jax.block_until_ready(compiled(params, tokens)); times.append(time.perf_counter() - t0)
print(json.dumps({"temp_bytes": m.temp_size_in_bytes,
                  "peak_bytes": m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                  - m.alias_size_in_bytes, "step_time_s": statistics.median(times)}))
"""


def export(rev: str, into: str) -> str:
    """``git archive rev`` unpacked into a new directory under ``into``; its path."""
    path = tempfile.mkdtemp(prefix=f"rev_{rev[:10]}_", dir=into)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", path], input=archive, check=True)
    return path


def measure(tree: str, model: str, plan: str, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, "-c", WORKER, model, plan, str(steps)], env=env, capture_output=True,
                         text=True, cwd=tree)
    if out.returncode:
        raise RuntimeError(f"{tree} {plan}: the worker failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision (e.g. a commit hash)")
    ap.add_argument("--after", default="HEAD", help="git revision, or 'worktree' for the files as they are")
    ap.add_argument("--model", default="gpt-small", help="a parity preset (gpt-small, gpt-tiny)")
    ap.add_argument("--plans", type=lambda t: t.split(";"), default=list(PLANS), help="';'-separated plans")
    ap.add_argument("--rounds", type=int, default=3, help="A B rounds per plan")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per process (median taken)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": export(args.before, tmp), "after": ROOT if args.after == "worktree" else export(args.after, tmp)}
        print(f"{args.model}: {args.before} -> {args.after}; {args.rounds} rounds x {args.steps} steps, interleaved")
        print(f"{'plan':<14}{'temp MB before':>15}{'after':>9}{'peak MB before':>16}{'after':>9}"
              f"{'step ms before (min-max)':>28}{'after (min-max)':>24}{'ratio':>7}")
        for plan in args.plans:
            runs = {"before": [], "after": []}
            for _ in range(args.rounds):
                for name in ("before", "after"):
                    runs[name].append(measure(trees[name], args.model, plan, args.steps))
            b, a = runs["before"], runs["after"]
            tb, ta = [r["step_time_s"] * 1e3 for r in b], [r["step_time_s"] * 1e3 for r in a]
            print(f"{plan:<14}{b[0]['temp_bytes'] / 1e6:>15.2f}{a[0]['temp_bytes'] / 1e6:>9.2f}"
                  f"{b[0]['peak_bytes'] / 1e6:>16.2f}{a[0]['peak_bytes'] / 1e6:>9.2f}"
                  f"{statistics.median(tb):>12.1f} ({min(tb):.1f}-{max(tb):.1f})"
                  f"{statistics.median(ta):>11.1f} ({min(ta):.1f}-{max(ta):.1f})"
                  f"{statistics.median(ta) / statistics.median(tb):>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
