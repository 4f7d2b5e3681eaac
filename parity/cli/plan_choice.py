"""The plan command's choice per budget, the paired timing it rests on, and its tables of measured times.

For each framework and budget ``python -m parity plan`` measures two plans, the planner's and the best
uniform one. :func:`paired_times` times their training steps against each other, interleaved
(:func:`parity.cases.plan_timing.time_plans`, :data:`PAIR_ROUNDS` rounds), so that their ratio carries its
real spread. :func:`choose` says which to use: the planner's plan (the least cost of its model over a
space holding every uniform plan), unless its case failed, or the paired step times say, beyond
their noise, that the uniform plan is faster: slower in every paired round and by more than the spread, the
test candidates are picked by (:func:`parity.cases.plan_timing.beyond_noise`, mirrored). A time ratio marked noise
(:attr:`parity.checks.timing.RatioSpread.noise`) never decides: the choice then follows the model.
"""

from __future__ import annotations

from jaxremat.spec.plan import parse_plan

from parity.cases.plan_timing import spread_text, time_plans
from parity.checks.timing import RatioSpread
from parity.inputs.pretrained import preset_inputs
from parity.report.format import md_table

__all__ = ["CANDIDATE_COLUMNS", "OPTION_COLUMNS", "PAIRED_COLUMNS", "PAIR_ROUNDS", "candidate_rows",
           "candidates_markdown", "choice_lines", "choose", "option_rows", "options_markdown", "paired_markdown",
           "paired_times",
           "time_vs_uniform"]

PAIR_ROUNDS = 9
"""Interleaved rounds of the planner's plan against the uniform plan (>= 7)."""


def paired_times(suite, rows: list[dict], rounds: int = PAIR_ROUNDS) -> None:
    """Set each row's ``paired``: the planner's and the uniform plan's steps timed interleaved (``plans``,
    ``rounds``, ``load_1min``, ``step_ms``, ``ratio``: planner over uniform, a
    :meth:`parity.checks.timing.RatioSpread.as_dict`); ``{"same_plan": True}`` where both are one plan; None
    where a case did not pass."""
    cfg = params = tokens = None
    for row in rows:
        p, u = row.get("planner") or {}, row.get("uniform") or {}
        row["paired"] = None
        if p.get("status") != "pass" or u.get("status") != "pass":
            continue
        if p["plan"] == u["plan"]:
            row["paired"] = {"same_plan": True, "plans": [p["plan"], u["plan"]]}
            continue
        if cfg is None:
            cfg, params, tokens = preset_inputs(suite.preset, "float32", suite.seed)
        t = time_plans(row["framework"], cfg, params, tokens, [parse_plan(p["plan"]), parse_plan(u["plan"])], rounds)
        row["paired"] = {"plans": [p["plan"], u["plan"]], "rounds": t.rounds, "load_1min": list(t.load_1min),
                         "step_ms": t.as_dict()["step_ms"], "ratio": t.ratio(p["plan"], u["plan"]).as_dict()}


def time_vs_uniform(row: dict) -> RatioSpread | None:
    """The planner's step time over the uniform plan's, paired (:func:`paired_times`), or None where they were not
    timed against each other (a case failed, or both are one plan)."""
    r = (row.get("paired") or {}).get("ratio")
    return None if r is None else RatioSpread(r["median"], r["min"], r["max"], r["rounds"])


def choose(row: dict) -> tuple[str, str]:
    """``(who, why)``: ``"planner"`` or ``"uniform"`` for one plan row (module docstring), and the reason."""
    p, u = row.get("planner") or {}, row.get("uniform") or {}
    if p.get("status") != "pass":
        return ("uniform", f"the planner's case is {p.get('status')}") if u.get("status") == "pass" else \
            ("none", "neither case passed")
    if u.get("status") != "pass":
        return "planner", f"the uniform case is {u.get('status') or 'missing'}"
    cost = row.get("cost") or "cost"
    if (row.get("paired") or {}).get("same_plan"):
        return "planner", "the same plan as the uniform one"
    t = time_vs_uniform(row)
    if t is None:
        return "planner", f"no paired step times; by the {cost} model"
    if t.noise:
        return "planner", f"paired time/uniform {t.text(3)}: noise decides nothing; by the {cost} model"
    if t.rounds >= 2 and t.low > 1:  # not noise and above 1: beyond_noise(uniform / planner)
        return "uniform", f"measured slower than the uniform plan (paired): {t.text(3)}"
    return "planner", f"measured no slower than the uniform plan (paired): {t.text(3)}"


def _candidate_note(case: dict) -> str | None:
    """A case's pick among candidates timed whole, in a few words: its rule and the ratio it rests on."""
    rule, r = case.get("candidate_rule"), case.get("candidate_ratio")
    if not rule:
        return None
    if r is None:
        return rule
    ratio = spread_text(RatioSpread(r["median"], r["min"], r["max"], r["rounds"]))
    return f"{rule} ({ratio} of the least-FLOPs candidate)" if rule.startswith("fastest") else \
        f"{rule} (the least median: {ratio})"


def choice_lines(rows: list[dict]) -> list[str]:
    """One line per plan row: the plan to use and why (:func:`choose`: with the planner's plan over the uniform
    plan, paired, median [min-max]), and where candidates were timed whole each case's pick and its rule."""
    out = []
    for r in rows:
        line = f"{r['framework']} {r['budget']}: {r.get('choice')} ({r.get('choice_reason')})"
        picks = [f"{who} {note}" for who in ("planner", "uniform")
                 if (note := _candidate_note(r.get(who) or {})) is not None]
        out.append(line + (f"; candidates timed whole: {', '.join(picks)}" if picks else ""))
    return out


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


PAIRED_COLUMNS = ("framework", "budget", "planner plan", "uniform plan", "planner step ms", "uniform step ms",
                  "planner / uniform (paired)", "rounds", "load")


def paired_markdown(rows: list[dict]) -> list[str]:
    """plan.md's section on the planner's plan timed against the uniform plan (empty when no pair was timed)."""
    table = []
    for r in rows:
        pr = r.get("paired") or {}
        if pr.get("same_plan"):
            table.append([r["framework"], r["budget"], pr["plans"][0], pr["plans"][1], "-", "-", "the same plan", "-", "-"])
        elif pr.get("ratio"):
            t, (a, b) = time_vs_uniform(r), pr["plans"]
            loads = "-".join("-" if x is None else f"{x:.1f}" for x in pr["load_1min"])
            table.append([r["framework"], r["budget"], a, b, _ms(pr["step_ms"][a]), _ms(pr["step_ms"][b]), t.text(3),
                          str(pr["rounds"]), loads])
    if not table:
        return []
    return ["", "## The planner's plan against the uniform plan, paired", "",
            "Both plans' training steps timed interleaved in one run (`parity.cli.plan_choice.paired_times`: process "
            "CPU time, medians [min-max] over rounds; the ratio is the median of per-round ratios, `noise` where its "
            "spread is wider than its distance from 1; load: the 1-minute load average before and after).", "",
            md_table(PAIRED_COLUMNS, table)]


CANDIDATE_COLUMNS = ("framework", "budget", "case", "candidate", "why a candidate", "recompute FLOPs", "step ms",
                     "vs least FLOPs (paired)", "chosen")


def candidate_rows(rows: list[dict]) -> list[list[str]]:
    """One row per candidate timed whole for a case (its last attempt's ``candidates``)."""
    out = []
    for r in rows:
        for who in ("planner", "uniform"):
            for c in (r.get(who) or {}).get("candidates") or ():
                v = c["vs_model_choice"]
                out.append([r["framework"], r["budget"], who, c["plan"], "; ".join(c["sources"]),
                            f"{c['recompute_flops'] / 1e6:.1f} M", _ms(c["step_ms"]),
                            spread_text(RatioSpread(v["median"], v["min"], v["max"], v["rounds"])),
                            "yes" if c["plan"] == r[who]["plan"] else ""])
    return out


def candidates_markdown(rows: list[dict]) -> list[str]:
    """plan.md's section on the candidate plans timed whole (empty when none were)."""
    table = candidate_rows(rows)
    if not table:
        return []
    timings = [(r.get(who) or {}).get("candidate_timing") for r in rows for who in ("planner", "uniform")]
    loads = sorted({x for t in timings if t for x in t["load_1min"] if x is not None})
    rounds = {t["rounds"] for t in timings if t}
    return ["", "## Candidate plans, timed whole (the time cost)", "",
            f"Each case's candidates (`parity.cases.budget_plan.candidate_plans`) compiled once and their training "
            f"steps timed interleaved over {', '.join(map(str, sorted(rounds)))} rounds (process CPU time; load "
            f"{loads[0] if loads else '-'}-{loads[-1] if loads else '-'}); `vs least FLOPs`: the median of "
            "per-round ratios to the candidate of fewest recompute FLOPs, [min-max]. That candidate is kept unless "
            "another is faster in every paired round, the whole [min-max] below 1, and by more than its spread "
            "(`parity.cases.plan_timing.pick_cases`, one rule for both cases: `fastest beyond noise`, else `noise: least FLOPs kept`); the planner's "
            "case picks among its own candidates and the uniform case's pick.", "", md_table(CANDIDATE_COLUMNS, table)]
