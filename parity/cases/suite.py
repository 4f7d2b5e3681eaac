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
from parity.cases.loop import FRAMEWORK_MODES, Callbacks, run_cases
from parity.cases.record import fill_case, new_case
from parity.checks.compare import cross_check, tolerance_for
from parity.checks.loss_terms import loss_term_scale
from parity.checks.names import expected_names, measured_names
from parity.checks.predictions import attach_predictions
from parity.checks.saving import attach_saving
from parity.inputs.presets import ModelPreset
from parity.inputs.train import AdamWConfig
from parity.inputs.pretrained import preset_inputs
from parity.report.suite_report import SCHEMA_VERSION
from parity.runners.dispatch import run_framework
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
        schedules: plans ``SCHEDULE`` or ``SCHEDULE+POLICY`` (:mod:`jaxremat.spec.plan`), ``none``
            first (it is the reference and is added if missing).
        dtypes: dtypes to run (``float32``, ``float64``).
        frameworks: subset of ``("jax", "torch")``.
        hparams: optimizer settings of the trained-weights check.
        timing_repeats: timed training steps per case (median reported), after one warm-up.
        seed: seed of the weights and of the token windows.
        modes: the (framework, mode) pairs to run, a subset of
            :data:`parity.cases.loop.FRAMEWORK_MODES` (None: all of them; ``python -m parity plan``
            runs JAX under ``jit`` only).
    """

    name: str
    preset: ModelPreset
    schedules: tuple[str, ...]
    dtypes: tuple[str, ...] = ("float32",)
    frameworks: tuple[str, ...] = ("jax", "torch")
    hparams: AdamWConfig = AdamWConfig()
    timing_repeats: int = 5
    seed: int = 0
    modes: tuple[tuple[str, str], ...] | None = None

    def schedule_objects(self) -> list[tuple[str, "RematPlan | BudgetRequest"]]:
        """``[(canonical name, plan)]`` with ``none`` first; raises ValueError on a bad name.

        ``plan(50%)`` and ``best_uniform(12MiB)`` are :class:`parity.cases.budget_plan.BudgetRequest` s,
        resolved when their case runs.
        """
        parsed = [parse_case_plan(s) for s in self.schedules]
        out, seen = [], set()
        for plan in [parse_plan("none")] + parsed:
            if plan.name not in seen:
                seen.add(plan.name)
                out.append((plan.name, plan))
        for _, plan in out:  # resolve now so s > n_layer fails before any work starts
            if isinstance(plan, BudgetRequest):
                spec = get_model(getattr(self.preset.config, "arch", "gpt"))
                if spec.jax_planner_chain is None or spec.torch_planner_chain is None:
                    raise ValueError(f"{plan.name}: model family {spec.name!r} has no planner chain "
                                     "(ModelSpec.jax_planner_chain / torch_planner_chain); use --model gpt-small")
                if any(self.preset.dropouts or (self.preset.config.dropout,)):
                    raise ValueError(f"{plan.name}: budget plans are planned from menus measured without dropout; "
                                     f"model {self.preset.name!r} runs dropout "
                                     f"{max(self.preset.dropouts or (self.preset.config.dropout,))} too: use "
                                     f"python -m parity plan --model {self.preset.name}, which runs dropout 0")
                continue
            plan.segments_for(self.preset.config.n_layer)
            for p in plan.policies:
                if ("torch" in self.frameworks and "block_input" in (p.kept_names | p.offloaded_names)
                        and not p.save_everything):
                    raise ValueError(f"plan {plan.name!r}: PyTorch cannot keep 'block_input' (a checkpointed segment "
                                     "is replayed from its start); drop it or run --frameworks jax")
        return out


def _check_kept(case: dict, framework: str, cfg, suite: SuiteConfig, plan: RematPlan, res: RunResult, ref: RunResult,
                cache: dict) -> None:
    """Record what one checkpointed block keeps under the plan's policy and whether it is as declared.

    ``save_everything`` must keep exactly the bytes of ``none``; every other policy must keep (and
    offload) the activation names :func:`parity.checks.names.expected_names` gives. A segment plan
    whose segments follow several policies is checked policy by policy: ``block_names`` and
    ``expected_names`` are then lists with one entry per policy (``{"policy": name, ...}``) and
    ``names_ok`` holds when every entry is as declared; its ``save_everything`` segments are
    checked by the cost model only (the plan keeps less than ``none`` elsewhere).
    """
    policies = [p for p in plan.policies if not p.saves_nothing]
    if not policies:
        return
    if not get_model(cfg.arch).block_names_measurable:  # block_memory builds the GPT block only
        case["expected_names"] = "not measured for this architecture"
        return
    if len(plan.policies) == 1 and policies[0].save_everything:
        case["names_ok"] = res.memory.saved_bytes == ref.memory.saved_bytes
        case["expected_names"] = "the same saved bytes as none"
        return
    checked = []
    for policy in (p for p in policies if not p.save_everything):
        key = (framework, cfg, policy)
        if key not in cache:
            cache[key] = measured_names(framework, cfg, suite.preset.batch_size, suite.preset.seq_len, policy)
        measured, expected = cache[key], expected_names(policy, framework)
        ok = measured["kept"] == expected["kept"] and measured["offloaded"] == expected["offloaded"]
        checked.append((policy.name, measured, expected, ok))
    if len(plan.policies) == 1:
        _, case["block_names"], case["expected_names"], case["names_ok"] = checked[0]
        return
    case["block_names"] = [{"policy": name, **measured} for name, measured, _, _ in checked]
    case["expected_names"] = [{"policy": name, **expected} for name, _, expected, _ in checked]
    case["names_ok"] = all(ok for *_, ok in checked)


def _cross(schedule: str, dtype: str, a: RunResult | None, b: RunResult | None, term_scale: float | None,
           scale_error: str | None = None) -> dict:
    """JAX (``a``) against PyTorch (``b``) on one schedule: :func:`parity.checks.compare.cross_check`'s fields.

    The loss is checked relative to ``term_scale`` (:func:`parity.checks.loss_terms.loss_term_scale`),
    each gradient tensor relative to its largest entry; ``tolerance`` is the gradient bound and
    ``tolerance_loss`` the loss bound, each with its reason.
    """
    tol, tol_loss = tolerance_for(dtype, "grads"), tolerance_for(dtype, "loss")
    out = {"schedule": schedule, "dtype": dtype, "tolerance": tol.bound, "tolerance_reason": tol.reason,
           "tolerance_loss": tol_loss.bound, "tolerance_loss_reason": tol_loss.reason,
           "loss_err": None, "loss_abs_diff": None, "loss_term_scale": term_scale,
           "max_rel_err_loss": None, "max_rel_err_grads": None, "worst_grad": None, "ok": False, "error": None}
    if a is None or b is None:
        out["error"] = "a framework's case did not complete; nothing to compare"
        return out
    if term_scale is None:
        out["error"] = scale_error or "the loss's term scale could not be computed; nothing to compare"
        return out
    out.update(cross_check(a.loss, b.loss, a.grads, b.grads, term_scale, dtype))
    return out


def _cross_rows(schedules, dtype: str, results: dict, cfg, params, tokens) -> list[dict]:
    """One :func:`_cross` row per schedule (JAX ``jit``, else op by op, against PyTorch)."""
    scale, failure = None, None
    try:
        scale = loss_term_scale(cfg, params, tokens)
    except Exception as exc:  # recorded on every row, and the suite goes on
        failure = f"the loss's term scale could not be computed: {type(exc).__name__}: {exc}"
    results = {k: v.result if isinstance(v, _Planned) else v for k, v in results.items()}
    # a budget case compares the two frameworks' own plans for one budget: remat changes no math
    return [_cross(name, dtype, results.get(("jax", "jit", name)) or results.get(("jax", "eager", name)),
                   results.get(("torch", "eager", name)), scale, failure) for name, _ in schedules]


def _runs(suite: SuiteConfig, framework: str, mode: str, dropout: float) -> bool:
    """Whether ``framework``/``mode`` runs at this dropout rate (JAX op by op only at the preset's eager_dropouts)."""
    eager_dropouts = suite.preset.eager_dropouts
    skip_eager = (framework, mode) == ("jax", "eager") and eager_dropouts is not None and dropout not in eager_dropouts
    chosen = suite.modes is None or (framework, mode) in suite.modes
    return framework in suite.frameworks and not skip_eager and chosen


def count_cases(suite: SuiteConfig) -> int:
    """Number of cases :func:`run_suite` will run (for a progress bar)."""
    if suite.name == "stress":
        return stress.case_count(suite)
    dropouts = suite.preset.dropouts or (suite.preset.config.dropout,)
    modes = sum(_runs(suite, f, m, r) for r in dropouts for f, m in FRAMEWORK_MODES)
    return len(suite.dtypes) * modes * len(suite.schedule_objects())


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
        if again:  # the reference's second run: determinism, one timed step
            suite = dataclasses.replace(self.suite, timing_repeats=1)
            return run_framework(framework, mode, self.cfg, self.params, self.tokens, plan, suite,
                                 with_reverse_loop=False)
        # The hand-rolled loop is checked op by op in JAX: under jit it is a different XLA program
        # (Python-unrolled segments), fused differently (docs/framework-differences.md).
        return run_framework(framework, mode, self.cfg, self.params, self.tokens, plan, self.suite,
                             with_reverse_loop=plan.name != "none" and (framework, mode) != ("jax", "jit"))

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
                    min_checkpoint_length=self.suite.preset.jax_min_checkpoint_length if framework == "jax" else 1)
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
            _check_kept(case, framework, self.cfg, self.suite, plan, res, ref, self.names_cache)
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
                planned_recompute_flops=last["recompute_flops"],
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
    schedules = suite.schedule_objects()
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
        modes = [(f, m) for f, m in FRAMEWORK_MODES if _runs(suite, f, m, dropout)]
        results = run_cases(report, schedules, modes, _SuiteCases(suite, cfg, params, tokens), callbacks)
        # With dropout the two frameworks draw different masks (different RNGs): compared only without.
        if "jax" in suite.frameworks and "torch" in suite.frameworks and dropout == 0.0:
            report["cross_framework"] += _cross_rows(schedules, dtype, results, cfg, params, tokens)
    return report
