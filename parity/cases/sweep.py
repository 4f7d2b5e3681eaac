"""Depth sweep: activation memory and step time against depth, per schedule, in both frameworks.

``python -m parity sweep`` measures, for each depth N and each remat plan, in JAX and PyTorch (one
case set per depth, :class:`SweepCases`, run by the one case loop :func:`parity.cases.loop.run_cases`),
through the runners' one measurement path per framework (:func:`parity.runners.jax_memory.measure_jax`,
:func:`parity.runners.torch_memory.measure_torch`):

* **saved bytes** -- activations kept by the forward pass for the backward pass (parameters
  excluded, also where JAX lists them among the residuals; :mod:`jaxremat.memory`), beside the
  exact per-tensor prediction of :mod:`jaxremat.models.gpt.activation`;
* **peak activation bytes** -- the step's peak less parameters, gradients and optimizer state:
  JAX, XLA's compiled buffer plan of ``jit(value_and_grad(loss_fn))`` (argument + output + temp -
  alias) minus parameters (arguments) and gradients (outputs), which leaves temp bytes plus the
  tokens and the loss; PyTorch on CPU, the bytes of storages allocated during the step
  (:mod:`torchref.live_bytes`; equal to ``MemTracker``'s peak less its ``PARAM``, ``BUFFER``,
  ``GRAD`` and ``OPT`` categories, at a fraction of its cost at depth). On a GPU: the device counters (JAX
  ``peak_bytes_in_use`` in a fresh process per case, :mod:`parity.cases.gpu_pass`; torch
  ``max_memory_allocated`` after a reset) less what was allocated before the step;
* **step time** -- median of one forward+backward step, reported as a ratio to ``none`` at the
  same depth (measured side by side in one run), with the lowest and highest ratio any pair of
  timed steps gives (:func:`parity.cases.record.overhead_range`): a range that holds 1.0 is noise.

It fits the log-log slope of each memory against depth per schedule (Chen et al. 2016,
arXiv:1604.06174: about 1 for ``none``, about 0.5 for ``sqrt``, whose peak is ``2 sqrt(N)``
units), compares the N=64 peak reduction of ``sqrt`` with the per-layer model's and the unit
model's ``65/16``, and measures a frontier (step-time overhead against memory saved) of
schedules and policies at one depth.
"""

from __future__ import annotations

# Deferred imports: jaxremat.survival loads JAX; it is imported where the sweep assesses compiled programs (a
# PyTorch-only sweep never loads JAX).

import dataclasses
import math
import statistics
import time

import numpy as np

from jaxremat.models import TransformerConfig, param_shapes
from jaxremat.models.gpt import activation as am
from jaxremat.spec import parse_schedule, peak_units
from jaxremat.spec.plan import RematPlan, parse_plan

from parity.cases.loop import Callbacks, run_cases
from parity.cases.record import base_case, overhead_range
from parity.checks.predictions import GAP_LIMIT, gap, gap_flags
from parity.inputs.corpus import token_batch
from parity.runners.framework import FRAMEWORK_NAMES, FRAMEWORKS, check_frameworks, get_framework

DEFAULT_DEPTHS = (4, 8, 16, 32, 64)
DEFAULT_SCHEDULES = ("none", "full", "sqrt", "nested")
FRONTIER_PLANS = ("none", "full", "sqrt", "nested", "every_k(2)", "full+save_dots", "full+save_qkv_proj",
                  "full+attention_only")
SWEEP_CONFIG = TransformerConfig(n_layer=4, d_model=32, n_head=2, d_ff=128, max_seq_len=32, vocab_size=256)
SWEEP_MODEL = "gpt-sweep"
"""The sweep's model in its case records: :data:`SWEEP_CONFIG` at each depth."""
SWEEP_SCHEMA_VERSION = 4
"""sweep.json schema: 4 gives each case the fields every case record starts with (``mode``, ``model``,
``dtype``, ``dropout``; :data:`parity.cases.record.BASE_FIELDS`); 3 runs the cases in the one case loop
(``status``, ``compared_with``); 2 measured through the runners' one path per framework (docs/report-schema.md)."""


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """What one sweep covers.

    Attributes:
        depths: block counts N (each >= 1, at least two for a slope).
        plans: remat plans (``SCHEDULE`` or ``SCHEDULE+POLICY``), ``none`` included.
        frameworks: names of :data:`parity.runners.framework.FRAMEWORKS`.
        config: the model (its ``n_layer`` is replaced by each depth).
        batch_size, seq_len: B and T of the token batch.
        frontier_depth: depth of the frontier measurement (None: skip it).
        frontier_plans: plans of the frontier.
        timing_repeats: timed steps per case (median), after one warm-up.
    """

    depths: tuple[int, ...] = DEFAULT_DEPTHS
    plans: tuple[str, ...] = DEFAULT_SCHEDULES
    frameworks: tuple[str, ...] = FRAMEWORK_NAMES
    config: TransformerConfig = SWEEP_CONFIG
    batch_size: int = 2
    seq_len: int = 32
    frontier_depth: int | None = 16
    frontier_plans: tuple[str, ...] = FRONTIER_PLANS
    timing_repeats: int = 3

    def __post_init__(self) -> None:
        if len(set(self.depths)) < 2 or any(not isinstance(d, int) or d < 1 for d in self.depths):
            raise ValueError(f"depths must be at least two distinct integers >= 1, got {self.depths}")
        if not self.frameworks:
            raise ValueError(f"frameworks must be a non-empty subset of {FRAMEWORK_NAMES}, got {self.frameworks}")
        check_frameworks("frameworks", self.frameworks)
        for p in self.plans:  # raises ValueError with the valid names, or the depth that does not fit
            for d in self.depths:
                _check_plan_depth(p, d)
        if self.frontier_depth:
            for p in self.frontier_plans:
                _check_plan_depth(p, self.frontier_depth)
        if not 1 <= self.seq_len <= self.config.max_seq_len or self.batch_size < 1:
            raise ValueError(f"need batch_size >= 1 and 1 <= seq_len <= {self.config.max_seq_len}")
        if self.timing_repeats < 1:
            raise ValueError(f"timing_repeats must be >= 1, got {self.timing_repeats}")


def _check_plan_depth(text: str, depth: int) -> None:
    """Raise ValueError when the plan is unknown or its schedule does not resolve at this depth."""
    plan = parse_plan(text)
    try:
        plan.segments_for(depth)
    except ValueError as exc:
        raise ValueError(f"plan {plan.name!r} at depth {depth}: {exc}") from None


def _param_bytes(cfg: TransformerConfig) -> int:
    item = np.dtype(cfg.dtype).itemsize
    return sum(math.prod(s) for s in param_shapes(cfg).values()) * item


def _predictions(framework: str, cfg, B: int, T: int, plan: RematPlan) -> dict:
    if not plan.saves_nothing:  # the per-layer model covers schedules, not policies (per-segment ones included)
        return {"predicted_saved_bytes": None, "predicted_peak_activation_bytes": None}
    return {"predicted_saved_bytes": am.predict_saved_bytes(framework, cfg, B, T, plan.schedule),
            "predicted_peak_activation_bytes": am.predict_peak_activation_bytes(framework, cfg, B, T, plan.schedule)}


class SweepCases:
    """The sweep's cases at one depth, as a case set of :func:`parity.cases.loop.run_cases`.

    They are measured, not compared bitwise: no determinism re-run of ``none``
    (``rerun_reference = False``), and a plan still runs when ``none`` failed
    (``requires_reference = False``; at depth ``none`` may be the case that does not fit).
    Each case holds its measurement (:meth:`parity.runners.framework.Framework.measure_plan`), the per-layer
    model's predictions and the gaps between them; ratios to ``none`` are attached after the loop.
    """

    rerun_reference = False
    requires_reference = False

    def __init__(self, cfg: TransformerConfig, tokens: np.ndarray, repeats: int, depth_sweep_plans=frozenset()) -> None:
        self.cfg, self.tokens, self.repeats = cfg, tokens, repeats
        self.depth_sweep_plans = frozenset(depth_sweep_plans)  # plans of the depth sweep at this depth
        self.B, self.T = tokens.shape[0], tokens.shape[1] - 1

    def new_case(self, framework, mode, name, plan):
        return {**base_case(framework, mode, plan.name, SWEEP_MODEL, self.cfg),
                "unit_peak": peak_units(self.cfg.n_layer, plan.schedule),
                **_predictions(framework, self.cfg, self.B, self.T, plan),
                "in_depth_sweep": plan.name in self.depth_sweep_plans}

    def label(self, framework, mode, name):
        return f"{framework} N={self.cfg.n_layer} {name}"

    def run(self, framework, mode, plan, *, again):
        return get_framework(framework).measure_plan(self.cfg, self.tokens, plan, self.repeats)

    def check(self, case, framework, mode, plan, res, ref, again):
        case.update(res)
        case["saved_gap"] = gap(case["predicted_saved_bytes"], case["saved_bytes"])
        case["peak_gap"] = gap(case["predicted_peak_activation_bytes"], case["peak_activation_bytes"])
        case["flags"] = gap_flags(case["saved_gap"], case["peak_gap"])
        case["status"] = "measured"


def fit_slope(depths, values) -> float | None:
    """Least-squares slope of ``log(values)`` against ``log(depths)``; None with < 2 positive points."""
    pts = [(math.log(d), math.log(v)) for d, v in zip(depths, values) if v and v > 0]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def _tokens(sweep: SweepConfig) -> np.ndarray:
    return token_batch(sweep.batch_size, sweep.seq_len) % sweep.config.vocab_size


def _attach_survival(cases: list[dict]) -> None:
    """Cases of a compiled program (those with ``dots_before``: JAX): did the program realize the saving
    its residuals promise (vs ``none`` at the same depth)?"""
    compiled = [c for c in cases if not c["error"] and "dots_before" in c]
    if not compiled:
        return
    from jaxremat.survival import assess

    compiled = [c for c in cases if not c["error"] and "dots_before" in c]
    by_depth = {(c["framework"], c["n_layer"]): c for c in compiled if c["plan"] == "none"}
    for c in compiled:
        ref = by_depth.get((c["framework"], c["n_layer"]))
        if ref is None or c is ref:
            continue
        s = assess(f"{c['plan']} at N={c['n_layer']}", none_saved=ref["saved_bytes"], saved=c["saved_bytes"],
                   none_temp=ref["compiled"]["temp_bytes"], temp=c["compiled"]["temp_bytes"],
                   dots_before=c["dots_before"], dots_after=c["dots_after"])
        c["survival"] = s.as_dict()


def _attach_ratios(cases: list[dict]) -> None:
    """Step-time and memory ratios to ``none`` at the same depth and framework."""

    ref = {(c["framework"], c["n_layer"]): c for c in cases if c["plan"] == "none" and not c["error"]}
    for c in cases:
        r = ref.get((c["framework"], c["n_layer"]))
        if c["error"] or r is None:
            continue
        c["time_overhead"] = c["step_time_s"] / r["step_time_s"]
        c["time_overhead_range"] = overhead_range(c["step_times_s"], r["step_times_s"])
        c["saved_ratio"] = c["saved_bytes"] / r["saved_bytes"]
        c["peak_activation_ratio"] = c["peak_activation_bytes"] / r["peak_activation_bytes"]
        c["memory_saved_fraction"] = 1.0 - c["peak_activation_ratio"]


def slopes(cases: list[dict], depths) -> dict:
    """``{framework: {plan: {"saved": slope, "peak_activation": slope}}}`` over the depth cases."""
    out: dict = {}
    for c in cases:
        out.setdefault(c["framework"], {}).setdefault(c["plan"], None)
    for fw, plans in out.items():
        for plan in plans:
            rows = sorted((c for c in cases if c["framework"] == fw and c["plan"] == plan
                           and c["n_layer"] in depths and not c["error"]), key=lambda c: c["n_layer"])
            ds = [c["n_layer"] for c in rows]
            plans[plan] = {"saved": fit_slope(ds, [c["saved_bytes"] for c in rows]),
                           "peak_activation": fit_slope(ds, [c["peak_activation_bytes"] for c in rows]),
                           "depths": ds}
    return out


def sqrt_reduction(cases: list[dict], cfg: TransformerConfig, B: int, T: int, depth: int) -> dict:
    """Peak-activation reduction ``none / sqrt`` at ``depth``: measured, per-layer model, unit model."""

    none, sq = parse_schedule("none"), parse_schedule("sqrt")
    c_at = cfg.replace(n_layer=depth)
    out = {"n_layer": depth, "unit_model": peak_units(depth, none) / peak_units(depth, sq)}
    for fw in FRAMEWORK_NAMES:
        got = {c["plan"]: c for c in cases if c["framework"] == fw and c["n_layer"] == depth and not c["error"]}
        if "none" not in got or "sqrt" not in got:
            continue
        out[fw] = {
            "measured": got["none"]["peak_activation_bytes"] / got["sqrt"]["peak_activation_bytes"],
            "measured_saved": got["none"]["saved_bytes"] / got["sqrt"]["saved_bytes"],
            "per_layer_model": (am.predict_peak_activation_bytes(fw, c_at, B, T, none)
                                / am.predict_peak_activation_bytes(fw, c_at, B, T, sq)),
        }
    return out


def block_accounts(cfg: TransformerConfig, B: int, T: int, frameworks) -> dict:
    """Per-block saved bytes by activation name: measured (one block, ``none``) and the model's."""
    out = {}
    for fw in frameworks:
        model = am.block_tensors(fw, cfg, B, T)
        measured = get_framework(fw).block_saved(cfg, B, T)
        match = measured == [(t.shape, t.dtype, t.bytes) for t in model]
        by_name: dict = {}
        for t, (_, _, nbytes) in zip(model, measured):  # measured bytes, named by the matching model entry
            by_name[str(t.name)] = by_name.get(str(t.name), 0) + nbytes
        out[fw] = {"measured_bytes": sum(m[2] for m in measured), "predicted_bytes": sum(t.bytes for t in model),
                   "tensor_by_tensor_match": match, "bytes_by_name": by_name if match else None,
                   "tensors": [dataclasses.asdict(t) for t in model]}
    return out


def run_sweep(sweep: SweepConfig, on_case=None) -> dict:
    """Run every (depth, plan, framework) case and the frontier; return the report object.

    Raises:
        ValueError: invalid sweep (before any case runs).
    """
    tokens = _tokens(sweep)
    B, T = sweep.batch_size, sweep.seq_len
    depth_plans = [parse_plan(p).name for p in sweep.plans]
    frontier_plans = [parse_plan(p).name for p in sweep.frontier_plans] if sweep.frontier_depth is not None else []
    report: dict = {"cases": []}
    modes = [(fw, FRAMEWORKS[fw].measured_mode) for fw in sweep.frameworks]
    for depth in sorted(set(sweep.depths) | ({sweep.frontier_depth} if sweep.frontier_depth is not None else set())):
        names = [*(depth_plans if depth in sweep.depths else []),
                 *(frontier_plans if depth == sweep.frontier_depth else [])]
        names = sorted(dict.fromkeys(names), key=lambda n: n != "none")  # each once, none first
        run_cases(report, [(n, parse_plan(n)) for n in names], modes,
                  SweepCases(sweep.config.replace(n_layer=depth), tokens, sweep.timing_repeats,
                             depth_plans if depth in sweep.depths else ()),
                  Callbacks(on_case=on_case))
    cases = report["cases"]
    _attach_ratios(cases)
    _attach_survival(cases)
    depth_cases = [c for c in cases if c["in_depth_sweep"]]
    return {
        "schema": SWEEP_SCHEMA_VERSION, "config": dataclasses.asdict(sweep.config), "batch_size": B, "seq_len": T,
        "depths": list(sweep.depths), "plans": list(sweep.plans), "frameworks": list(sweep.frameworks),
        "frontier_depth": sweep.frontier_depth, "gap_limit": GAP_LIMIT,
        "cases": cases, "slopes": slopes(depth_cases, sweep.depths),
        "sqrt_reduction": sqrt_reduction(cases, sweep.config, B, T, max(sweep.depths)),
        "block": block_accounts(sweep.config, B, T, sweep.frameworks),
        "korthikanti_layer_bytes": am.korthikanti_layer_bytes(B, T, sweep.config.d_model, sweep.config.n_head,
                                                              bytes_per_element=np.dtype(sweep.config.dtype).itemsize,
                                                              dropout=False, d_ff=sweep.config.d_ff),
        "layer_bytes": {fw: am.layer_bytes(fw, sweep.config, B, T) for fw in sweep.frameworks},
    }
