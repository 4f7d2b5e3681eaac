"""Plots of a depth sweep (matplotlib, PNG files next to the report).

* :func:`plot_memory_vs_depth` -- saved and peak activation bytes against depth, log-log, one
  line per schedule and framework, with the ``2 sqrt(N)`` chain optimum (Chen et al. 2016,
  arXiv:1604.06174) scaled to the per-layer model's unit for reference.
* :func:`plot_frontier` -- step-time overhead against peak activation memory saved, one point per
  plan (schedule and policy) and framework, the Pareto frontier drawn per framework.
* :func:`plot_block_bytes` -- one block's saved bytes by activation name, JAX and PyTorch side by side.
* :func:`plot_loss_curves` -- the fine-tuning run's loss per step, per plan and framework.

Each file is written atomically (a temporary PNG next to it, then ``os.replace``).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from parity.report.files import atomic_target

_STYLE = {"jax": "-", "torch": "--"}


def _save(fig, path: Path) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically (:func:`parity.report.files.atomic_target`) and close it.

    Raises:
        parity.report.files.WriteError: the file could not be written; a previous plot there is kept.
    """

    try:
        fig.tight_layout()
        with atomic_target(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return Path(path)
_MARK = {"jax": "o", "torch": "s"}


def plot_memory_vs_depth(report: dict, path: Path) -> Path:
    """Two panels (saved, peak activation bytes) against depth; returns ``path``."""
    cases = [c for c in report["cases"] if c.get("in_depth_sweep") and not c["error"]]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {p: f"C{i}" for i, p in enumerate(report["plans"])}
    depths = sorted(report["depths"])
    for ax, key, title in ((axes[0], "saved_bytes", "saved activation bytes"),
                           (axes[1], "peak_activation_bytes", "peak activation bytes")):
        for fw in report["frameworks"]:
            for plan in report["plans"]:
                rows = sorted((c for c in cases if c["framework"] == fw and c["plan"] == plan), key=lambda c: c["n_layer"])
                if rows:
                    slope = report["slopes"][fw][plan]["saved" if key == "saved_bytes" else "peak_activation"]
                    label = f"{fw} {plan} (slope {slope:.2f})" if slope is not None else f"{fw} {plan}"
                    ax.plot([c["n_layer"] for c in rows], [c[key] for c in rows], _STYLE[fw], marker=_MARK[fw],
                            color=colors[plan], label=label)
        unit = max(report["layer_bytes"].values())
        ax.plot(depths, [2 * math.sqrt(n) * unit for n in depths], ":", color="k",
                label="2*sqrt(N) x one layer (chain optimum)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("depth N (blocks)")
        ax.set_ylabel("bytes")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left")
    return _save(fig, path)


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points (memory saved, overhead) not dominated (more saved at no more overhead), by saving."""
    front = []
    for saved, over in sorted(points, key=lambda p: (p[1], -p[0])):
        if not front or saved > front[-1][0]:
            front.append((saved, over))
    return sorted(front)


def plot_frontier(report: dict, path: Path) -> Path:
    """Step-time overhead vs peak activation memory saved at the frontier depth; returns ``path``."""
    depth = report["frontier_depth"]
    cases = [c for c in report["cases"] if c["n_layer"] == depth and not c["error"] and "time_overhead" in c]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for i, fw in enumerate(report["frameworks"]):
        rows = [c for c in cases if c["framework"] == fw]
        pts = [(c["memory_saved_fraction"], c["time_overhead"]) for c in rows]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=_MARK[fw], color=f"C{i}", label=fw)
        for c, (x, y) in zip(rows, pts):
            ax.annotate(c["plan"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        front = pareto(pts)
        ax.plot([p[0] for p in front], [p[1] for p in front], _STYLE[fw], color=f"C{i}", alpha=0.6,
                label=f"{fw} frontier")
    ax.set_xlabel(f"peak activation memory saved vs none (fraction), N={depth}")
    ax.set_ylabel("step time / none's")
    ax.set_title("remat frontier: time paid for memory saved")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_block_bytes(report: dict, path: Path) -> Path:
    """One block's saved bytes by activation name, both frameworks side by side; returns ``path``."""
    block = report["block"]
    fws = [fw for fw in report["frameworks"] if block[fw]["bytes_by_name"]]
    names: list[str] = []
    for fw in fws:
        names += [n for n in block[fw]["bytes_by_name"] if n not in names]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / max(1, len(fws))
    for i, fw in enumerate(fws):
        vals = [block[fw]["bytes_by_name"].get(n, 0) for n in names]
        ax.bar([k + (i - (len(fws) - 1) / 2) * width for k in range(len(names))], vals, width,
               label=f"{fw} ({block[fw]['measured_bytes']:,} B per block)")
    ax.set_xticks(range(len(names)), [("mask (unnamed)" if n == "None" else n) for n in names], rotation=30, ha="right")
    ax.set_ylabel("bytes kept for the backward pass")
    ax.set_title(f"one block under none, B={report['batch_size']} T={report['seq_len']} "
                 f"D={report['config']['d_model']} F={report['config']['d_ff']} H={report['config']['n_head']}")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def write_plots(report: dict, out_dir: Path) -> dict[str, str]:
    """All three plots into ``out_dir``; returns ``{kind: file name}``."""
    out_dir = Path(out_dir)
    files = {"memory_vs_depth": "memory_vs_depth.png", "frontier": "frontier.png", "block_bytes": "block_bytes.png"}
    plot_memory_vs_depth(report, out_dir / files["memory_vs_depth"])
    if report.get("frontier_depth") is not None:
        plot_frontier(report, out_dir / files["frontier"])
    else:
        files.pop("frontier")
    plot_block_bytes(report, out_dir / files["block_bytes"])
    return files


def _time_errors(cases: list[dict]) -> list[list[float]]:
    """Error bars of step-time ratios: the distance from each ratio down to and up to its measured range."""
    lo = [max(0.0, c["time_overhead"] - c["time_overhead_range"][0]) if c.get("time_overhead_range") else 0.0
          for c in cases]
    hi = [max(0.0, c["time_overhead_range"][1] - c["time_overhead"]) if c.get("time_overhead_range") else 0.0
          for c in cases]
    return [lo, hi]


def plot_budget_frontier(report: dict, path: Path) -> Path:
    """``python -m parity plan --frontier``: recompute FLOPs and step-time ratio against measured peak
    activation bytes, one point per budget: the planner's plan, the best uniform plan, and (PyTorch)
    ``torch.compile`` at the same ``activation_memory_budget``; every point is measured (peak and time),
    the FLOPs are the menu's count (the compiled points': FlopCounterMode's). A compiled point that
    failed its gradient check (``error`` set) is drawn apart, in grey, never on the line. Returns ``path``."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {"jax": "C0", "torch": "C1"}
    for who, marker, fill in (("planner", "o", True), ("uniform", "s", False)):
        for fw in dict.fromkeys(r["framework"] for r in report["plan_rows"]):
            pts = [r[who] for r in report["plan_rows"] if r["framework"] == fw and r[who]
                   and r[who].get("peak_activation_bytes") and r[who].get("recompute_flops") is not None]
            pts.sort(key=lambda c: c["peak_activation_bytes"])
            if not pts:
                continue
            label = f"{fw} {'planner' if who == 'planner' else 'best uniform plan'} (measured)"
            style = dict(marker=marker, color=colors[fw], markerfacecolor=colors[fw] if fill else "none",
                         linestyle=_STYLE[fw], label=label)
            axes[0].plot([c["peak_activation_bytes"] / 2**20 for c in pts], [c["recompute_flops"] / 1e6 for c in pts],
                         **style)
            timed = [c for c in pts if c.get("time_overhead") is not None]
            axes[1].errorbar([c["peak_activation_bytes"] / 2**20 for c in timed], [c["time_overhead"] for c in timed],
                             yerr=_time_errors(timed), capsize=2, **style)
    comp = sorted((p for p in report.get("compiled") or [] if not p.get("error") and p.get("peak_activation_bytes")),
                  key=lambda p: p["peak_activation_bytes"])
    if comp:
        label = f"torch.compile {comp[0].get('backend', '')} activation_memory_budget (measured)"
        axes[0].plot([p["peak_activation_bytes"] / 2**20 for p in comp], [p["recompute_flops"] / 1e6 for p in comp],
                     marker="x", color="C3", linestyle=":", label=label)
        for p in comp:
            axes[0].annotate(f"{p['activation_memory_budget']:g}",
                             (p["peak_activation_bytes"] / 2**20, p["recompute_flops"] / 1e6), fontsize=7,
                             textcoords="offset points", xytext=(3, 3))
        timed = [p for p in comp if p.get("time_overhead") is not None]
        axes[1].plot([p["peak_activation_bytes"] / 2**20 for p in timed], [p["time_overhead"] for p in timed],
                     marker="x", color="C3", linestyle=":", label=label)
    wrong = [p for p in report.get("compiled") or [] if p.get("error") and p.get("peak_activation_bytes")
             and p.get("recompute_flops") is not None]  # measured, but failed its gradient check: no option
    if wrong:
        axes[0].scatter([p["peak_activation_bytes"] / 2**20 for p in wrong], [p["recompute_flops"] / 1e6 for p in wrong],
                        marker="X", color="0.6", label="torch.compile: gradients wrong vs eager none (not an option)")
    axes[0].set_ylabel("recompute per step (MFLOP)")
    axes[1].set_ylabel("step time / none's step time (measured; bars: range)")
    for ax in axes:
        ax.set_xlabel("peak activation bytes of one step (MiB, measured)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    costs = sorted({r["cost"] for r in report["plan_rows"] if r.get("cost")})
    fig.suptitle(f"remat plans for a memory budget: {report.get('model')}"
                 + (f" (planned on {' and '.join(costs)})" if costs else ""))
    return _save(fig, path)


def plot_loss_curves(report: dict, path: Path) -> Path:
    """The fine-tuning run's loss at every step, one line per plan and framework (and dropout rate); returns ``path``.

    Plans that are bitwise equal to ``none`` draw on top of it: the figure shows one line per framework
    and rate when remat changed nothing, as it must.
    """
    fig, ax = plt.subplots(figsize=(9, 5))
    plans = list(dict.fromkeys(c["plan"] for c in report["cases"]))
    colors = {p: f"C{i}" for i, p in enumerate(plans)}
    for c in report["cases"]:
        if not c.get("losses"):
            continue
        steps = list(range(1, len(c["losses"]) + 1))
        dashed = "--" if c["dropout"] == 0 else _STYLE.get(c["framework"], "-")
        ax.plot(steps, c["losses"], dashed, marker=_MARK.get(c["framework"], "o"), markersize=3, color=colors[c["plan"]],
                label=f"{c['framework']} {c['plan']} dropout {c['dropout']:g}", alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"fine-tuning {report['model']}: loss per step (remat plans overlap none bit for bit)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)
