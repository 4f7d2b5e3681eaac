"""The parity suite: every schedule against ``none`` inside each framework, and across frameworks.

For each dtype and framework (JAX under ``jit`` and op by op, PyTorch eager) the suite runs the
no-remat reference, then every schedule, and checks byte for byte: the loss, every parameter
gradient, the weights after the optimizer steps, and the hand-rolled reverse segment loop's
gradients against the library schedule's. It then compares the frameworks on the same weights and
tokens against :data:`parity.checks.compare.TOLERANCES` (:func:`parity.checks.compare.cross_check`). A case
that raises is recorded with ``status: "error"`` and the suite goes on.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from jaxremat.models import get_model
from jaxremat.spec import DEFAULT_SCHEDULES
from jaxremat.spec.plan import RematPlan, parse_plan
from jaxremat.spec.policies import POLICIES

from parity.cases import stress
from parity.cases.budget_plan import BudgetRequest, parse_case_plan, resolve
from parity.cases.loop import Callbacks, run_cases
from parity.cases.plan_timing import time_plans
from parity.cases.record import fill_case, new_case
from parity.checks.compare import cross_row
from parity.checks.names import check_kept_names
from parity.checks.predictions import attach_predictions
from parity.checks.saving import attach_saving
from parity.inputs.presets import ModelPreset
from parity.inputs.train import AdamWConfig
from parity.inputs.pretrained import preset_inputs
from parity.report.suite_report import SCHEMA_VERSION
from parity.runners.framework import (FRAMEWORK_NAMES, FRAMEWORKS, RunOptions, framework_modes, get_framework,
                                      loss_term_scale)
from parity.runners.result import RunResult

QUICK_PLANS = DEFAULT_SCHEDULES
"""The quick suite (the default): the segment schedules."""

FULL_PLANS = (
    "none", "full", "every_k(2)", "sqrt", "segments(4)", "nested(sqrt,sqrt)", "nested(every_k(4),every_k(2))",
    *(f"full+{name}" for name in POLICIES if name != "save_nothing"),
    "every_k(2)+save_qkv_proj", "sqrt+attention_only", "nested(every_k(4),every_k(2))+save_dots",
)
"""The full suite: every schedule, every named policy on per-block checkpoints, and combinations
of segment schedules with inner policies (MaxText aliases resolve to these policies)."""

STRESS_PLANS = ("none", "full", "every_k(2)", "sqrt", "segments(2)", "nested(sqrt,sqrt)")
"""The stress suite (:mod:`parity.cases.stress`): every schedule kind, under each stress variant."""

SUITE_PLANS = {"quick": QUICK_PLANS, "full": FULL_PLANS, "stress": STRESS_PLANS}


@dataclasses.dataclass(frozen=True)
class SuiteConfig:
    """What one suite run covers.

    Attributes:
        name: suite name (``quick``, ``full`` or ``stress``; ``stress`` runs :mod:`parity.cases.stress`).
        preset: model preset (config, batch size, sequence length).
        plans: the plans to check against ``none``: :class:`jaxremat.spec.plan.RematPlan` objects, or
            :class:`parity.cases.budget_plan.BudgetRequest` s chosen for a memory budget when their case
            runs; names (``"sqrt"``, ``"full+save_dots"``, ``"budget(50%)"``) are parsed once, here.
            ``none`` is the reference: it runs first, added if missing.
        dtypes: dtypes to run (``float32``, ``float64``).
        frameworks: names of :data:`parity.runners.framework.FRAMEWORKS`.
        hparams: optimizer settings of the trained-weights check.
        timing_repeats: timed training steps per case (median reported), after one warm-up.
        seed: seed of the weights and of the token windows.
        modes: the (framework, mode) pairs to run, a subset of
            :func:`parity.runners.framework.framework_modes` (None: all of them; ``python -m parity plan``
            runs each framework's measured mode only).
        planner_cost: what budget plans minimize: ``"flops"`` (recompute FLOPs) or ``"time"`` (each block
            option's measured time, :func:`jaxremat.spec.planner.plan_for_budget`'s ``cost``).

    Raises:
        ValueError: a plan name that does not parse.
    """

    name: str
    preset: ModelPreset
    plans: tuple
    dtypes: tuple[str, ...] = ("float32",)
    frameworks: tuple[str, ...] = FRAMEWORK_NAMES
    hparams: AdamWConfig = AdamWConfig()
    timing_repeats: int = 5
    seed: int = 0
    modes: tuple[tuple[str, str], ...] | None = None
    planner_cost: str = "flops"

    def __post_init__(self) -> None:
        object.__setattr__(self, "plans", tuple(parse_case_plan(p) for p in self.plans))

    def plan_list(self) -> list[tuple[str, "RematPlan | BudgetRequest"]]:
        """``[(canonical name, plan)]`` with ``none`` first, each checked against the model.

        Raises:
            ValueError: a plan that does not resolve at the model's depth (``segments(s)`` with
                s > N), a budget plan on a model without a planner chain or with dropout, or a
                policy a framework of the suite cannot render.
        """
        out, seen = [], set()
        for plan in (parse_plan("none"), *self.plans):
            if plan.name not in seen:
                seen.add(plan.name)
                out.append((plan.name, plan))
        for _, plan in out:  # resolved now, so s > n_layer fails before any work starts
            if isinstance(plan, BudgetRequest):
                self._check_budget(plan)
                continue
            plan.segments_for(self.preset.config.n_layer)
            for fw in self.frameworks:
                FRAMEWORKS[fw].check_policies(plan)
        return out

    def _check_budget(self, plan: BudgetRequest) -> None:
        spec = get_model(self.preset.config.arch)
        if spec.jax_planner_chain is None or spec.torch_planner_chain is None:
            raise ValueError(f"{plan.name}: model family {spec.name!r} has no planner chain "
                             "(ModelSpec.jax_planner_chain / torch_planner_chain); use --model gpt-small")
        rates = self.preset.dropouts or (self.preset.config.dropout,)
        if any(rates):
            raise ValueError(f"{plan.name}: budget plans are planned from menus measured without dropout; "
                             f"model {self.preset.name!r} runs dropout {max(rates)} too: use "
                             f"python -m parity plan --model {self.preset.name}, which runs dropout 0")


def _cross_rows(plans, dtype: str, results: dict, cfg, params, tokens) -> list[dict]:
    """One :func:`parity.checks.compare.cross_row` per plan: JAX (its measured mode, else op by op)
    against PyTorch, on the loss's term scale (computed once per dtype by the reference framework)."""
    scale, failure = None, None
    try:
        scale = loss_term_scale(cfg, params, tokens)
    except Exception as exc:  # recorded on every row, and the suite goes on
        failure = f"the loss's term scale could not be computed: {type(exc).__name__}: {exc}"
    results = {k: v.result if isinstance(v, _Planned) else v for k, v in results.items()}

    def run_of(fw, name):  # a budget case compares the two frameworks' own plans: remat changes no math
        return next((results[(fw, m, name)] for m in FRAMEWORKS[fw].modes if (fw, m, name) in results), None)

    a_fw, b_fw = FRAMEWORK_NAMES
    return [cross_row(name, dtype, run_of(a_fw, name), run_of(b_fw, name), scale, failure=failure)
            for name, _ in plans]


def _runs(suite: SuiteConfig, framework: str, mode: str, dropout: float) -> bool:
    """Whether ``framework``/``mode`` runs at this dropout rate: a mode that is not the framework's
    measured one (JAX op by op) runs only at the preset's ``eager_dropouts``."""
    eager_dropouts = suite.preset.eager_dropouts
    skip = (mode != FRAMEWORKS[framework].measured_mode and eager_dropouts is not None
            and dropout not in eager_dropouts)
    chosen = suite.modes is None or (framework, mode) in suite.modes
    return framework in suite.frameworks and not skip and chosen


def count_cases(suite: SuiteConfig) -> int:
    """Number of cases :func:`run_suite` will run (for a progress bar)."""
    if suite.name == "stress":
        return stress.case_count(suite)
    dropouts = suite.preset.dropouts or (suite.preset.config.dropout,)
    modes = sum(_runs(suite, f, m, r) for r in dropouts for f, m in framework_modes())
    return len(suite.dtypes) * modes * len(suite.plan_list())


@dataclasses.dataclass(frozen=True)
class _Planned:
    """A budget case's run: the resolution (plan, attempts) and the result of the plan it reports."""

    resolution: object
    result: RunResult


@dataclasses.dataclass
class _SuiteCases:
    """The quick and full suites' cases at one dtype and dropout rate (a :class:`parity.cases.loop.CaseSet`)."""

    suite: SuiteConfig
    cfg: object
    params: dict
    tokens: object
    names_cache: dict = dataclasses.field(default_factory=dict)
    refs: dict = dataclasses.field(default_factory=dict)  # (framework, mode) -> none's run
    resolved: dict = dataclasses.field(default_factory=dict)  # (framework, budget case) -> its Resolution
    timings: dict = dataclasses.field(default_factory=dict)  # (framework, plan names) -> their PlanTimes

    def time_plans(self, framework, plans):
        """The plans' steps timed interleaved (:func:`parity.cases.plan_timing.time_plans`), once per set of plans."""
        key = (framework, frozenset(p.name for p in plans))
        if key not in self.timings:
            self.timings[key] = time_plans(framework, self.cfg, self.params, self.tokens, plans)
        return self.timings[key]

    def new_case(self, framework, mode, name, plan):
        if isinstance(plan, BudgetRequest):  # what the plan predicts is filled in once it is chosen
            case = new_case(framework, mode, name, parse_plan("none"), self.cfg, self.suite.preset.name)
            case.update(policy=None, predicted_peak_units=None, predicted_unit_ratio=None, recomputed_blocks=None,
                        budget=plan.budget.text, resolved_plan=None)
            return case
        return new_case(framework, mode, name, plan, self.cfg, self.suite.preset.name)

    def label(self, framework, mode, name):
        return f"{framework}/{mode} {self.cfg.dtype} {name}"

    def _run(self, framework, mode, plan, *, again):
        measured = mode == FRAMEWORKS[framework].measured_mode
        # The hand-rolled loop is checked in uncompiled modes: under jit it is a different XLA program
        # (Python-unrolled segments), fused differently (docs/framework-differences.md). Op by op, JAX
        # dispatches every primitive from Python (about a second per step here): that mode checks the
        # loss and gradients; training and step time are measured in the measured mode.
        options = RunOptions(hparams=self.suite.hparams, timing_repeats=1 if again else self.suite.timing_repeats,
                             seed=self.suite.seed, with_training=measured,
                             with_reverse_loop=not again and plan.name != "none" and mode == "eager")
        return get_framework(framework).run_plan(mode, self.cfg, self.params, self.tokens, plan, options)

    def run(self, framework, mode, plan, *, again):
        if not isinstance(plan, BudgetRequest):
            return self._run(framework, mode, plan, again=again)
        key = (framework, plan.name)
        if key in self.resolved:  # JAX op by op: the plan chosen and measured under jit
            r = self.resolved[key]
            return _Planned(r, self._run(framework, mode, r.plan, again=False))
        B, T = self.suite.preset.batch_size, self.suite.preset.seq_len
        r = resolve(plan, framework, self.cfg, B, T, self.refs[(framework, mode)],
                    lambda p: self._run(framework, mode, p, again=False),
                    cost=self.suite.planner_cost, time_plans=lambda plans: self.time_plans(framework, plans))
        self.resolved[key] = r
        return _Planned(r, r.result)

    def check(self, case, framework, mode, plan, res, ref, again):
        B, T = self.suite.preset.batch_size, self.suite.preset.seq_len
        planned = res if isinstance(res, _Planned) else None
        if planned is not None:
            res, plan = planned.result, planned.resolution.plan
            base = new_case(framework, mode, plan.name, plan, self.cfg, self.suite.preset.name)
            case.update({k: base[k] for k in ("policy", "predicted_peak_units", "predicted_unit_ratio",
                                                 "recomputed_blocks")}, resolved_plan=plan.name)
        if again is not None:
            self.refs[(framework, mode)] = res
            fill_case(case, dataclasses.replace(again, step_time_s=res.step_time_s, step_times_s=res.step_times_s), ref)
        else:
            check_kept_names(case, framework, self.cfg, B, T, plan, res, ref, self.names_cache)
            fill_case(case, res, ref)
        attach_predictions(case, framework, self.cfg, B, T, plan, res)
        if again is None:
            attach_saving(case, framework, self.cfg, B, T, plan, res, ref)
        if planned is not None:
            _attach_budget(case, framework, self.cfg, B, T, planned.resolution, res)


def _attach_budget(case: dict, framework: str, cfg, B: int, T: int, r, res: RunResult) -> None:
    """A budget case's fields: the budget, every plan tried, the last one's predictions; ``over_budget``
    when its measured peak activation exceeds the budget."""
    last = r.last
    spec = get_model(cfg.arch)
    # a family without an account (BERT) has no prediction of what it keeps outside the stack
    outside = (None if spec.activation_account is None else
               sum(t.bytes for t in spec.load("activation_account").outside_tensors(framework, cfg, B, T)))
    measured = res.memory.peak_activation_bytes
    case.update(budget_bytes=r.budget_bytes, budget_offset_bytes=r.offset_bytes, budget_attempts=list(r.attempts),
                planned_recompute_flops=last["recompute_flops"], planner_cost=r.cost,
                planned_step_time_s=last.get("predicted_stack_step_time_s"), option_times=r.option_times,
                predicted_saved_bytes=None if outside is None else outside + last["predicted_stack_saved_bytes"],
                predicted_peak_activation_bytes=last["predicted_peak_activation_bytes"],
                peak_activation_bytes=measured, within_budget=measured is not None and measured <= r.budget_bytes)
    case["saved_gap"] = ((case["predicted_saved_bytes"] - res.memory.saved_bytes) / res.memory.saved_bytes
                         if res.memory.saved_bytes and outside is not None else None)
    case["peak_gap"] = ((case["predicted_peak_activation_bytes"] - measured) / measured if measured else None)
    if not case["within_budget"] and case["status"] == "pass":
        case["status"] = "over_budget"
        case["error"] = (f"measured peak activation {measured} bytes > budget {r.budget_bytes} bytes after "
                         f"{len(r.attempts)} plan(s) ({', '.join(a['plan'] for a in r.attempts)})")


def _peer_rows(spec, suite: SuiteConfig, cfg, params, tokens, dtype: str) -> list[dict]:
    """The model family's peer checks (``spec.peer_checks``, e.g. :func:`parity.checks.peer.peer_checks`), or
    one failed row on error."""
    try:
        ckpt = suite.preset.checkpoint() if suite.preset.checkpoint else None
        return spec.load("peer_checks")(cfg, params, tokens, ckpt)
    except Exception as exc:  # recorded as a failed check, and the suite goes on
        return [{"check": "peer", "dtype": dtype, "max_rel_err": None, "tolerance": None, "ok": False,
                 "note": f"{type(exc).__name__}: {exc}"}]


def _peer_step_rows(suite: SuiteConfig, cfg, params, tokens, dtype: str) -> list[dict]:
    """Each framework's peer step beside its ``full`` (:meth:`parity.runners.framework.Framework.peer_step_rows`;
    only PyTorch has one), or one failed row on error."""
    rows = []
    for fw in suite.frameworks:
        try:
            rows += get_framework(fw).peer_step_rows(cfg, params, tokens, suite.timing_repeats)
        except Exception as exc:  # recorded as a failed check, and the suite goes on
            rows.append({"check": f"{fw} peer step", "dtype": dtype, "ok": False, "note": f"{type(exc).__name__}: {exc}"})
    return rows


def run_suite(suite: SuiteConfig, on_case: Callable[[dict], None] | None = None,
              on_start: Callable[[str], None] | None = None,
              on_partial: Callable[[dict], None] | None = None) -> dict:
    """Run every case of ``suite``; return the report object (``schema``, ``cases``, ``cross_framework``).

    The cases run in :func:`parity.cases.loop.run_cases` (the stress suite: :func:`parity.cases.stress.run_stress`).

    Args:
        suite: what to run.
        on_case: called with each finished case (progress display, partial reports).
        on_start: called with a short label before each case starts.
        on_partial: called with the report so far after each case (so an interrupted run keeps them).

    Raises:
        ValueError: a schedule name or parameter is invalid (before any case runs).
    """
    if suite.name == "stress":
        return stress.run_stress(suite, on_case=on_case, on_start=on_start, on_partial=on_partial)
    callbacks = Callbacks(on_case=on_case, on_start=on_start, on_partial=on_partial)
    plans = suite.plan_list()
    report = {"schema": SCHEMA_VERSION, "suite": suite.name, "model": suite.preset.name,
              "config": None, "batch_size": suite.preset.batch_size, "seq_len": suite.preset.seq_len,
              "hparams": dataclasses.asdict(suite.hparams), "seed": suite.seed,
              "cases": [], "cross_framework": []}
    dropouts = suite.preset.dropouts or (suite.preset.config.dropout,)
    for dtype, dropout in ((d, r) for d in suite.dtypes for r in dropouts):
        cfg, params, tokens = preset_inputs(suite.preset, dtype, suite.seed)
        cfg = cfg.replace(dropout=dropout)
        report["config"] = dataclasses.asdict(cfg)
        spec = get_model(cfg.arch)
        if spec.peer_checks is not None and dropout == 0.0:
            report.setdefault("peer", []).extend(_peer_rows(spec, suite, cfg, params, tokens, dtype))
            report.setdefault("peer_step", []).extend(_peer_step_rows(suite, cfg, params, tokens, dtype))
        modes = [(f, m) for f, m in framework_modes(suite.frameworks) if _runs(suite, f, m, dropout)]
        results = run_cases(report, plans, modes, _SuiteCases(suite, cfg, params, tokens), callbacks)
        # With dropout the two frameworks draw different masks (different RNGs): compared only without.
        if set(FRAMEWORK_NAMES) <= set(suite.frameworks) and dropout == 0.0:
            report["cross_framework"] += _cross_rows(plans, dtype, results, cfg, params, tokens)
    return report
