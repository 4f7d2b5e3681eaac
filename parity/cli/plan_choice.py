"""The plan command's choice per budget, and its tables of measured block-option times.

For each framework and budget ``python -m parity plan`` measures two plans, the planner's and the best
uniform one. :func:`choose` says which to use: the planner's plan (the least cost of its model over a
space holding every uniform plan), unless its case failed, or the measured step times say, beyond
their noise, that the uniform plan is faster. A time ratio marked noise
(:attr:`parity.checks.timing.RatioSpread.noise`) never decides: the choice then follows the model.
"""

from __future__ import annotations

from parity.checks.timing import ratio_between
from parity.report.format import md_table

__all__ = ["OPTION_COLUMNS", "choose", "option_rows", "options_markdown", "time_vs_uniform"]


def time_vs_uniform(row: dict):
    """The planner's measured step time over the uniform plan's (a :class:`parity.checks.timing.RatioSpread`
    from their ratios to ``none`` and ranges), or None where either was not timed."""
    p, u = row.get("planner") or {}, row.get("uniform") or {}
    if not p.get("time_overhead") or not u.get("time_overhead"):
        return None
    return ratio_between(p["time_overhead"], p.get("time_overhead_range"), u["time_overhead"],
                         u.get("time_overhead_range"))


def choose(row: dict) -> tuple[str, str]:
    """``(who, why)``: ``"planner"`` or ``"uniform"`` for one plan row (module docstring), and the reason."""
    p, u = row.get("planner") or {}, row.get("uniform") or {}
    if p.get("status") != "pass":
        return ("uniform", f"the planner's case is {p.get('status')}") if u.get("status") == "pass" else \
            ("none", "neither case passed")
    if u.get("status") != "pass":
        return "planner", f"the uniform case is {u.get('status') or 'missing'}"
    cost = row.get("cost") or "flops"
    t = time_vs_uniform(row)
    if t is None:
        return "planner", f"no step times; by the {cost} model"
    if t.noise:
        return "planner", f"measured time/uniform {t.text()}: noise decides nothing; by the {cost} model"
    if t.median > 1:
        return "uniform", f"measured slower than the uniform plan: {t.text()}"
    return "planner", f"measured no slower than the uniform plan: {t.text()}"


OPTION_COLUMNS = ("framework", "option", "forward ms/block", "backward ms/block (recompute incl.)", "segment ms",
                  "step ms/block")


def _ms(v) -> str:
    return "-" if not v else f"{v[0]:.3f} [{v[1]:.3f}-{v[2]:.3f}]"


def option_rows(rows: list[dict]) -> list[list[str]]:
    """One row per framework and block option measured for the time cost (medians over rounds, [min-max])."""
    out, seen = [], set()
    for r in rows:
        if not r.get("option_times") or r["framework"] in seen:
            continue
        seen.add(r["framework"])
        for name, t in r["option_times"].items():
            out.append([r["framework"], name, _ms(t["forward_ms"]), _ms(t["backward_ms"]), _ms(t["segment_ms"]),
                        f"{t['step_ms']:.3f}"])
    return out


def options_markdown(rows: list[dict]) -> list[str]:
    """plan.md's section on the measured block options (empty when no row was planned on time)."""
    table = option_rows(rows)
    if not table:
        return []
    some = next(t for r in rows for t in (r.get("option_times") or {}).values())
    return ["", "## Block options, measured (the time cost)", "",
            f"Each option timed on segments of {some['lengths'][0]} and {some['lengths'][1]} blocks, interleaved "
            f"over {some['rounds']} rounds (process CPU time; `jaxremat.block_time`, `torchref.block_time`): per "
            "block the slope, per segment the intercept; medians [min-max] over rounds. The planner minimizes "
            "`step ms/block` summed over the blocks plus `segment ms` per segment (negative medians count as 0).",
            "", md_table(OPTION_COLUMNS, table)]
