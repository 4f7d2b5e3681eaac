"""The measurements behind docs/real-sizes.md: seed 002's table, uniform schedules at three sizes, the checks.

``python -m parity.experiments.real_sizes [seed002|uniform|checks|all] [--out FILE.json]`` prints Markdown
tables and writes every row as JSON:

* ``seed002``: seed 002's four rows (``none``, ``every_k(2)``, ``sqrt``, ``full+attention_only``) at its
  shape (``gpt-1.3b``: 24 layers, d_model 2048, 16 heads, T=2048, B=8), in JAX and PyTorch, float32 and
  bfloat16 mixed precision, materialized and fused attention (each framework's ``estimate_plans`` verb,
  :meth:`parity.runners.framework.Framework.estimate_plans`), with the wall time of each framework's call;
* ``uniform``: the uniform schedules (``full``, ``every_k(k)``, ``segments(s)``, ``sqrt``) at ``gpt2-124m``,
  ``gpt2-350m`` and ``gpt-1.3b``, float32, materialized, both frameworks: total peak and recompute;
* ``checks``: the estimate against a step that runs here, per plan, at ``gpt-small``, ``minilm-l6`` and
  12 layers, d_model 256, T=256, B=4 (JAX: abstract against concrete compile, equal field by field;
  PyTorch: the fake-tensor peak against the real step's MemTracker peak, and their difference).

Everything is estimated on this machine's CPU (XLA:CPU's buffer assignment; PyTorch's CPU kernels, which
choose the flash kernel for fused attention); nothing of the real sizes is allocated.
"""

from __future__ import annotations

import argparse
import json
import time

from parity.inputs.real_sizes import resolve_shape
from parity.runners.framework import FRAMEWORK_NAMES, get_framework

SEED_PLANS = ("every_k(2)", "sqrt", "full+attention_only")
SEED_A100_GB = {"none": 47, "every_k(2)": 28, "sqrt": 24, "full+attention_only": 31}
"""Seed 002's A100 80GB measurements (GB of GPU memory; its rows: no checkpointing, uniform every 2 layers,
sqrt (every 5 layers), selective attention-only)."""
UNIFORM = ("full", "every_k(2)", "every_k(3)", "every_k(4)", "every_k(5)", "segments(2)", "sqrt")
FRAMEWORKS = FRAMEWORK_NAMES


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f}"


def seed002() -> list[dict]:
    """Seed 002's four rows in both frameworks, both precisions, both attentions (rows with ``setting``)."""
    out = []
    for precision in ("float32", "bfloat16"):
        for attention in ("materialized", "fused"):
            shape = resolve_shape("gpt-1.3b", precision=precision, attention=attention)
            for fw in FRAMEWORKS:
                t0 = time.perf_counter()
                rows = get_framework(fw).estimate_plans(shape.config, shape.batch_size, shape.seq_len, SEED_PLANS)
                wall = time.perf_counter() - t0
                for r in rows:
                    out.append({**r, "precision": precision, "attention": attention, "call_wall_s": wall})
    return out


def seed002_markdown(rows: list[dict]) -> str:
    """Total peak (GB, 10^9 bytes) and its ratio to none, per setting and plan, beside the seed's A100 column."""
    settings = [(p, a, fw) for p in ("float32", "bfloat16") for a in ("materialized", "fused") for fw in FRAMEWORKS]
    head = "| plan | seed A100 | " + " | ".join(f"{fw} {p[:4]} {a[:5]}" for p, a, fw in settings) + " |"
    lines = [head, "|" + "---|" * (2 + len(settings))]
    for plan in ("none", *SEED_PLANS):
        cells = []
        for p, a, fw in settings:
            r = next(x for x in rows if (x["precision"], x["attention"], x["framework"], x["plan"]) == (p, a, fw, plan))
            cells.append(f"{_gb(r['total_peak_bytes'])} ({r['ratio_to_none']:.2f})")
        lines.append(f"| `{plan}` | {SEED_A100_GB[plan]} ({SEED_A100_GB[plan] / 47:.2f}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def uniform() -> list[dict]:
    """The uniform schedules at three sizes, float32, materialized, both frameworks."""
    out = []
    for preset in ("gpt2-124m", "gpt2-350m", "gpt-1.3b"):
        shape = resolve_shape(preset)
        for fw in FRAMEWORKS:
            for r in get_framework(fw).estimate_plans(shape.config, shape.batch_size, shape.seq_len, UNIFORM):
                out.append({**r, "model": preset})
    return out


def uniform_markdown(rows: list[dict]) -> str:
    """Total peak (GB) and recompute (TFLOP) per model, framework and schedule."""
    keys = sorted({(r["model"], r["framework"]) for r in rows}, key=lambda k: (k[0] != "gpt2-124m", k))
    lines = ["| schedule | " + " | ".join(f"{m} {fw}" for m, fw in keys) + " |", "|" + "---|" * (1 + len(keys))]
    for plan in ("none", *UNIFORM):
        cells = []
        for m, fw in keys:
            r = next(x for x in rows if (x["model"], x["framework"], x["plan"]) == (m, fw, plan))
            cells.append(f"{_gb(r['total_peak_bytes'])} GB, {(r['recompute_flops'] or 0) / 1e12:.1f} TF")
        lines.append(f"| `{plan}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


CHECK_SHAPES = {"gpt-small": {"model": "gpt-small"}, "minilm-l6": {"model": "minilm-l6"},
                "12L D256 T256 B4": {"n_layer": 12, "d_model": 256, "n_head": 4, "seq_len": 256, "batch_size": 4,
                                     "vocab": 256}}
CHECK_PLANS = ("none", "every_k(2)", "sqrt", "full", "full+attention_only")


def checks() -> list[dict]:
    """The estimate against the real step (PyTorch) and the concrete compile (JAX), per shape and plan."""
    out = []
    for name, kw in CHECK_SHAPES.items():
        shape = resolve_shape(**kw)
        args = (shape.config, shape.batch_size, shape.seq_len, CHECK_PLANS)
        for fw in FRAMEWORKS:
            for r in get_framework(fw).check_estimates(*args):
                out.append({"shape": name, "framework": fw, "plan": r["plan"], "estimate": r["estimated_peak_bytes"],
                            "real": r["measured_peak_bytes"], "equal": r["difference_bytes"] == 0})
    return out


def checks_markdown(rows: list[dict]) -> str:
    lines = ["| shape | framework | plan | estimate bytes | real bytes | difference |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['shape']} | {r['framework']} | `{r['plan']}` | {r['estimate']} | {r['real']} | "
              f"{r['estimate'] - r['real']} |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", nargs="?", default="all", choices=("seed002", "uniform", "checks", "all"))
    ap.add_argument("--out", default=None, help="write every row as JSON here")
    args = ap.parse_args(argv)
    parts = {"seed002": (seed002, seed002_markdown), "uniform": (uniform, uniform_markdown),
             "checks": (checks, checks_markdown)}
    result = {}
    for name, (measure, markdown) in parts.items():
        if args.part in (name, "all"):
            t0 = time.perf_counter()
            result[name] = measure()
            print(f"## {name} ({time.perf_counter() - t0:.0f} s)\n\n{markdown(result[name])}\n", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
