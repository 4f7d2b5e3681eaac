"""``report.html``: one self-contained page beside report.json / sweep.json / plan.json.

The page opens from disk with no network: plotly.js (the ``plotly`` package's offline bundle,
:func:`plotly.offline.get_plotlyjs`) and the page's script (``parity/report/report_page.js``) are
inlined, with the data as JSON. It has

* a **live part**: controls for depth N, schedule (none / full / every_k(k) / sqrt /
  segments(s) / nested(sqrt,sqrt)), k or s, policy, batch, sequence length and framework; the
  per-layer model's predicted saved and peak activation bytes, the unit model's peak units
  (s + N/s for s segments) and the recompute (blocks and FLOPs) for that setting, read from
  :func:`parity.report.html_model.model_data` (the Python model exported as data), and the measured
  point where the report holds one for that setting, marked as measured;
* **static views**: memory vs depth per schedule (both frameworks), saved vs peak activation per
  plan, step-time ratio vs peak activation ratio (the trade), the cross-framework table and, for
  ``parity plan``, the frontier (recompute FLOPs vs measured peak activation). Every axis has
  its unit; every point says whether it is measured or predicted.

Command line: ``python -m parity.report.html DIR`` rewrites ``DIR/report.html`` from the
report.json, sweep.json or plan.json in DIR; ``--screenshot PNG`` also saves a picture of the
default view, taken in headless Chromium (:mod:`parity.report.browser`). docs/report-html.md
says what the page shows and how it is tested.
"""

from __future__ import annotations

# Deferred imports: plotly (its 4.8 MB bundle is read only when a page is written) and playwright
# (an optional dependency, only for --screenshot).

import argparse
import dataclasses
import html
import importlib.resources
import json
import sys
from pathlib import Path

from jaxremat.models import get_model, registered_models
from jaxremat.models.config import TransformerConfig
from jaxremat.models.gpt import activation as am
from jaxremat.spec import parse_plan, parse_schedule

from parity.report.browser import missing, screenshot
from parity.report.files import atomic_write, json_safe
from parity.report.html_model import DEFAULT_BATCHES, DEFAULT_MAX_DEPTH, DEFAULT_SEQS, model_data
from parity.runners.framework import FRAMEWORK_NAMES

HTML_NAME = "report.html"
SOURCES = ("report.json", "sweep.json", "plan.json", "finetune.json", "estimate.json")
MIN_SCHEMA = {"run": 6, "sweep": 4, "plan": 2, "finetune": 1, "estimate": 1}
"""The oldest schema of each report the page reads: the ones whose cases start with the same fields
(:data:`parity.cases.record.BASE_FIELDS`)."""


def report_kind(report: dict) -> str:
    """``"plan"``, ``"sweep"``, ``"finetune"``, ``"estimate"`` or ``"run"``: which command wrote ``report``."""
    if "plan_rows" in report:
        return "plan"
    if report.get("command") in ("finetune", "estimate"):
        return report["command"]
    return "sweep" if "slopes" in report or "depths" in report else "run"


def _config(report: dict) -> TransformerConfig | None:
    cfg = report.get("config") or {}
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    try:
        return TransformerConfig(**{k: v for k, v in cfg.items() if k in fields})
    except (TypeError, ValueError):
        return None


def _modelled(cfg: TransformerConfig | None) -> bool:
    """Whether the per-layer model covers this configuration (a GPT block without dropout)."""
    return (cfg is not None and cfg.arch in registered_models()
            and get_model(cfg.arch).activation_account is not None and not cfg.dropout)


def _plan_parts(text: str) -> tuple[str, str]:
    """``(schedule name, policy name)`` of a plan text; the text itself when it does not parse."""
    try:
        p = parse_plan(text)
        return p.schedule.name, p.policy.name
    except ValueError:
        return text, "save_nothing"


def measured_points(report: dict) -> list[dict]:
    """The measured cases of a run, sweep or plan report, one flat record each (errored cases left out).

    ``peak_activation_bytes`` is None where the report has none (a run's case under a policy: the
    report attaches it beside a prediction only, :mod:`parity.checks.predictions`)."""
    out = []
    for c in report.get("cases") or []:
        if c.get("error") or c.get("status") == "error" or (c.get("saved_bytes") is None
                                                              and c.get("peak_activation_bytes") is None):
            continue
        sched, pol = _plan_parts(c["plan"])
        sv = c.get("saving") or {}
        out.append({
            "framework": c["framework"], "mode": c["mode"], "dtype": c["dtype"], "n_layer": c["n_layer"],
            "label": c.get("variant") and f"{c['variant']}: {c['plan']}" or c["plan"], "schedule": sched, "policy": pol,
            "batch": report.get("batch_size"), "seq": report.get("seq_len"),
            "saved_bytes": c.get("saved_bytes"), "peak_activation_bytes": c.get("peak_activation_bytes"),
            "predicted_saved_bytes": c.get("predicted_saved_bytes"),
            "predicted_peak_activation_bytes": c.get("predicted_peak_activation_bytes"),
            "time_overhead": c.get("time_overhead"),
            "peak_activation_ratio": c.get("peak_activation_ratio", sv.get("peak_activation_ratio")),
            "step_time_s": c.get("step_time_s"),
        })
    return out


def _depth_curves(report: dict, cfg: TransformerConfig, points: list[dict], max_depth: int) -> list[dict]:
    """The per-layer model's predicted peak activation bytes over depth 1..max_depth for every
    (framework, schedule) measured without a policy, at the report's batch and sequence length."""
    b, t = report.get("batch_size"), report.get("seq_len")
    seen, curves = set(), []
    for p in points:
        key = (p["framework"], p["schedule"])
        if p["policy"] != "save_nothing" or key in seen or p["dtype"] != cfg.dtype:
            continue
        seen.add(key)
        try:
            sched = parse_schedule(p["schedule"])
        except ValueError:
            continue
        xs, ys = [], []
        for n in range(1, max_depth + 1):
            try:
                ys.append(am.predict_peak_activation_bytes(p["framework"], cfg.replace(n_layer=n), b, t, sched))
            except ValueError:
                continue
            xs.append(n)
        curves.append({"framework": p["framework"], "schedule": p["schedule"], "depths": xs, "peak_activation_bytes": ys})
    return curves


def page_data(report: dict) -> dict:
    """Everything the page's script reads: the live model, the measured points, the static views' data."""
    kind, cfg = report_kind(report), _config(report)
    points = measured_points(report)
    data = {"kind": kind, "title": _title(report, kind), "points": points, "model": None, "curves": [],
            "cross_framework": [[x["dtype"], x["plan"], x["loss_err"], x["tolerance_loss"], x["max_rel_err_grads"],
                                 x["tolerance"], bool(x["ok"])] for x in report.get("cross_framework") or []],
            "plan_rows": _plan_points(report), "compiled": _compiled_points(report),
            "line_dash": {fw: "solid" if i == 0 else "dash" for i, fw in enumerate(FRAMEWORK_NAMES)},
            "loss_curves": [{"framework": c["framework"], "plan": c["plan"], "dropout": c["dropout"],
                             "losses": c["losses"]} for c in report.get("cases") or [] if c.get("losses")],
            "estimate_rows": [{k: r.get(k) for k in ("framework", "plan", "parameters_bytes", "gradients_bytes",
                                                     "adamw_state_bytes", "activation_peak_bytes", "total_peak_bytes",
                                                     "recompute_flops")}
                              for r in report.get("rows") or []] if kind == "estimate" else [],
            "defaults": {"batch": report.get("batch_size"), "seq": report.get("seq_len"),
                         "n_layer": (report.get("config") or {}).get("n_layer")}}
    if _modelled(cfg) and kind != "estimate":  # an estimate's model is real-size: its table and bars say it all
        deepest = max([p["n_layer"] for p in points if p["n_layer"]] + [cfg.n_layer, DEFAULT_MAX_DEPTH])
        batches = sorted({*DEFAULT_BATCHES, report.get("batch_size") or 1})
        seqs = sorted({*DEFAULT_SEQS, report.get("seq_len") or 16})
        policies = ["save_nothing"] + sorted({p["policy"] for p in points} - {"save_nothing"})
        frameworks = [f for f in FRAMEWORK_NAMES if f in {p["framework"] for p in points}] or list(FRAMEWORK_NAMES)
        data["model"] = model_data(cfg, frameworks=tuple(frameworks), batches=tuple(batches), seqs=tuple(seqs),
                                   max_depth=deepest, policies=tuple(policies))
        data["curves"] = _depth_curves(report, cfg, points, max(deepest, 16))
    return data


def _plan_points(report: dict) -> list[dict]:
    out = []
    for r in report.get("plan_rows") or []:
        for who in ("planner", "uniform"):
            c = r.get(who) or {}
            if c.get("peak_activation_bytes") is None:
                continue
            out.append({"framework": r["framework"], "budget": r["budget"], "who": who, "plan": c.get("plan"),
                        "peak_activation_bytes": c["peak_activation_bytes"],
                        "predicted_peak_activation_bytes": c.get("predicted_peak_activation_bytes"),
                        "recompute_flops": c.get("recompute_flops"), "budget_bytes": r.get("budget_bytes")})
    return out


def _compiled_points(report: dict) -> list[dict]:
    return [{"budget": p["budget"], "peak_activation_bytes": p["peak_activation_bytes"],
             "recompute_flops": p.get("recompute_flops"), "backend": p.get("backend")}
            for p in report.get("compiled") or [] if not p.get("error") and p.get("peak_activation_bytes") is not None]


def _title(report: dict, kind: str) -> str:
    what = {"run": "Parity report", "sweep": "Depth sweep", "plan": "Memory-budget plans",
            "finetune": "Fine-tuning under every plan", "estimate": "Memory estimate, nothing allocated"}[kind]
    return f"{what}: {report.get('model') or 'gpt'}" + (f" ({report['suite']} suite)" if report.get("suite") else "")


def _script(name: str) -> str:
    return importlib.resources.files("parity.report").joinpath(name).read_text(encoding="utf-8")


def _json_for_script(obj) -> str:
    """JSON safe inside a <script> element (no ``</`` sequence can close it)."""
    return json.dumps(json_safe(obj), separators=(",", ":")).replace("</", "<\\/")


def html_page(report: dict) -> str:
    """The whole page for one report (module doc) as a string."""
    from plotly.offline import get_plotlyjs

    data = page_data(report)
    return _TEMPLATE.format(title=html.escape(data["title"]), plotly=get_plotlyjs(),
                            data=_json_for_script(data), script=_script("report_page.js"))


def write_html(report: dict, out: Path) -> Path:
    """Write ``out/report.html`` for ``report`` atomically (:func:`parity.report.files.atomic_write`).

    Raises:
        parity.report.files.WriteError: the file could not be written; the old one is kept whole.
    """
    return atomic_write(Path(out) / HTML_NAME, html_page(report))


def load_report(directory: Path) -> dict:
    """The report.json, sweep.json or plan.json in ``directory`` (the first of :data:`SOURCES` there).

    Raises:
        FileNotFoundError: none of them is there.
    """
    for name in SOURCES:
        if (Path(directory) / name).is_file():
            report = json.loads((Path(directory) / name).read_text(encoding="utf-8"))
            wanted = MIN_SCHEMA[report_kind(report)]
            if not isinstance(report.get("schema"), int) or report["schema"] < wanted:
                raise ValueError(f"{Path(directory) / name} is schema {report.get('schema')!r}, written by an older "
                                 f"version; this page reads schema {wanted} and later (docs/report-schema.md): run "
                                 "the command that wrote it again")
            return report
    raise FileNotFoundError(f"{directory} holds none of {', '.join(SOURCES)}; pass the --out directory of "
                            "python -m parity run, sweep, plan, finetune or estimate")


def main(argv=None) -> int:
    """``python -m parity.report.html DIR [--screenshot PNG [--overwrite]]``; returns the exit code (2: bad input).

    An existing PNG is replaced only with ``--overwrite``; without it, or without a browser
    (:func:`parity.report.browser.missing`), the command refuses (exit 2) before it writes anything.
    Exit 1: the page asked for the network or logged an error while the screenshot was taken.
    """
    ap = argparse.ArgumentParser(prog="python -m parity.report.html",
                                 description="Rewrite DIR/report.html from the report.json, sweep.json or plan.json in "
                                 "DIR; optionally save a screenshot of its default view (headless Chromium).")
    ap.add_argument("directory", type=Path)
    ap.add_argument("--screenshot", type=Path, default=None, metavar="PNG")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --screenshot PNG instead of refusing")
    args = ap.parse_args(argv)
    if args.screenshot is not None and (args.screenshot.suffix.lower() != ".png" or args.screenshot.is_dir()):
        print(f"error: --screenshot {args.screenshot}: give a .png file path", file=sys.stderr)
        return 2
    if args.screenshot is not None and args.screenshot.exists() and not args.overwrite:
        print(f"error: --screenshot {args.screenshot} exists; pass --overwrite to replace it, or give another path",
              file=sys.stderr)
        return 2
    if args.screenshot is not None and missing() is not None:
        print(f"error: --screenshot needs a headless browser: {missing()}; or drop --screenshot", file=sys.stderr)
        return 2
    if not args.directory.is_dir():
        print(f"error: {args.directory} is not a folder; give the folder holding report.json, sweep.json or "
              "plan.json", file=sys.stderr)
        return 2
    try:
        path = write_html(load_report(args.directory), args.directory)
    except json.JSONDecodeError as exc:
        print(f"error: a report in {args.directory} is not valid JSON ({exc}); rerun the command that wrote it",
              file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    if args.screenshot is not None:
        try:
            screenshot(path, args.screenshot)
        except RuntimeError as exc:  # the page asked for the network or logged an error
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.screenshot}")
    return 0


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.2em; color: #222; max-width: 1400px; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.15em; margin-top: 1.6em; }}
#controls {{ display: grid; grid-template-columns: repeat(4, minmax(200px, 1fr)); gap: .5em 1.2em; background: #f4f6f8;
  padding: .8em; border-radius: 6px; }}
#controls label {{ display: flex; flex-direction: column; font-size: .9em; }}
#numbers {{ border-collapse: collapse; margin: .8em 0; }}
#numbers td, #numbers th, table.data td, table.data th {{ border: 1px solid #ccc; padding: .25em .6em; text-align: right; }}
#numbers th, table.data th {{ background: #eef; }} td.what {{ text-align: left; }}
.measured {{ color: #b33; font-weight: 600; }} .note {{ color: #555; font-size: .9em; }}
.row {{ display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }} .plot {{ min-height: 380px; }}
table.data {{ border-collapse: collapse; }}
</style></head><body>
<h1 id="title">{title}</h1>
<p class="note">Predicted numbers come from the per-layer model (jaxremat/models/gpt/activation.py) and the unit
model (jaxremat/spec/cost.py), exported into this page as data; measured numbers from the report's cases.
This file needs no network.</p>
<h2>Live: set depth, schedule and policy</h2>
<div id="live"></div>
<h2>Static views</h2>
<div id="static"></div>
<script>{plotly}</script>
<script id="report-data" type="application/json">{data}</script>
<script>{script}</script>
</body></html>
"""

if __name__ == "__main__":
    sys.exit(main())
