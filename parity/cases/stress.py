"""The stress suite (``python -m parity run --suite stress``): remat where it goes wrong in practice.

Each variant runs under every plan of the suite in JAX (``jit`` and op by op) and PyTorch, and
is compared byte for byte with the same variant under ``none`` in the same framework and mode:

* ``bf16`` -- the GPT in mixed precision (float32 parameters, bfloat16 compute:
  ``TransformerConfig.compute_dtype``); loss, gradients, trained weights, reverse loop.
* ``frozen`` -- the GPT with its embeddings and first half of the blocks frozen
  (:mod:`parity.cases.stress_frozen`); trainable gradients and all trained weights bitwise, every
  trainable gradient present and nonzero, frozen ones absent (torch) or zero (JAX) and frozen
  weights unchanged.
* ``running_stats`` -- a user-style BatchNorm block stack (:mod:`parity.cases.stress_user`); after
  the training steps the running statistics and step counters are bitwise those of ``none``
  and every counter equals the number of steps.
* ``dropout(p)+noise`` -- the user-style stack with dropout at rate p and a second random op
  (multiplicative normal noise) in every block; the recompute redraws the same values.

Cross-framework rows compare JAX (``jit``) with PyTorch for the variants without randomness
(the two RNGs differ), against :data:`parity.checks.compare.TOLERANCES` (``bfloat16`` for ``bf16``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jaxremat.models import TransformerConfig, init_params

from parity.cases.loop import Callbacks, run_cases
from parity.cases.record import fill_case, new_case
from parity.cases.stress_frozen import frozen_entries, split_trainable
from parity.cases.stress_user import UserStack
from parity.checks.compare import compare_bitwise, cross_row
from parity.inputs.corpus import token_batch
from parity.report.suite_report import SCHEMA_VERSION
from parity.runners.framework import (FRAMEWORK_NAMES, FRAMEWORKS, RunOptions, framework_modes, get_framework,
                                      loss_term_scale)
from parity.runners.result import RunResult

DROPOUT_RATES = (0.1, 0.5)
NOISE = 0.1
VARIANTS = ("bf16", "frozen", "running_stats", *(f"dropout({p})+noise" for p in DROPOUT_RATES))
CROSS_VARIANTS = {"bf16": "bfloat16", "frozen": "float32", "running_stats": "float32"}
GPT_VARIANTS = ("bf16", "frozen")
"""The variants that run the suite's GPT; the others run the user-style stack."""


def _user_stack(variant: str, base: UserStack) -> UserStack:
    if variant == "running_stats":
        return dataclasses.replace(base, running_stats=True)
    p = float(variant[len("dropout("):variant.index(")")])
    return dataclasses.replace(base, dropout=p, noise=NOISE)


def _run(variant, framework, mode, plan, suite, cfg, params, tokens, base: UserStack, again: bool) -> RunResult:
    """One run of ``variant``: loss, grads, trained (and state / the frozen check; memory for ``bf16``)."""
    fw = get_framework(framework)
    if variant not in GPT_VARIANTS:
        return fw.run_user_stack(mode, _user_stack(variant, base), plan)
    measured = mode == FRAMEWORKS[framework].measured_mode
    options = RunOptions(hparams=suite.hparams, timing_repeats=1 if again else suite.timing_repeats, seed=suite.seed,
                         with_training=measured, frozen=variant == "frozen",
                         with_reverse_loop=not again and plan.name != "none" and mode == "eager")
    run_cfg = cfg.replace(compute_dtype="bfloat16") if variant == "bf16" else cfg
    return fw.run_plan(mode, run_cfg, params, tokens, plan, options)


def _bitwise(case: dict, what: str, a: dict, b: dict) -> bool:
    r = compare_bitwise(a, b)
    case[f"{what}_bitwise_equal"] = r.equal
    if what == "grads":
        case.update(max_ulp=r.max_ulp, max_abs_diff=r.max_abs_diff)
    if not r.equal:
        case["mismatched"] = sorted(set(case.get("mismatched", []) + [f"{what}:{n}" for n in r.mismatched + r.nonfinite]))
    return r.equal


def _fill(case: dict, variant: str, cfg, params, res: RunResult, ref: RunResult, steps: int) -> None:
    """Every check of one variant's case; ``status`` is pass when all hold."""
    if variant == "bf16":
        fill_case(case, res, ref)
        return
    checks = [_bitwise(case, "loss", {"loss": res.loss}, {"loss": ref.loss})]
    case["loss"] = float(res.loss)
    grads, ref_grads = res.grads, ref.grads
    if variant == "frozen":
        grads, ref_grads = split_trainable(cfg, grads), split_trainable(cfg, ref_grads)
        zero = [k for k, g in grads.items() if not np.any(g)]
        frozen_g = frozen_entries(cfg, res.grads)
        frozen_w = compare_bitwise(frozen_entries(cfg, res.trained), frozen_entries(cfg, params))
        case["trainable_grads_nonzero"] = not zero
        case["frozen_grads_zero"] = all(not np.any(g) for g in frozen_g.values())
        case["frozen_weights_unchanged"] = frozen_w.equal
        if res.frozen_grads_none is not None:
            case["frozen_grads_none"] = res.frozen_grads_none
            checks.append(res.frozen_grads_none)
        checks += [not zero, case["frozen_grads_zero"], frozen_w.equal]
    checks.append(_bitwise(case, "grads", grads, ref_grads))
    checks.append(_bitwise(case, "weights", res.trained, ref.trained))
    if res.state:
        checks.append(_bitwise(case, "state", res.state, ref.state))
        counts = [res.state[k] for k in ("count", "num_batches_tracked") if k in res.state]
        case["state_counts"] = sorted({int(c) for arr in counts for c in np.ravel(arr)})
        case["state_counted_once"] = case["state_counts"] == [steps]
        checks.append(case["state_counted_once"])
    case["status"] = "pass" if all(checks) else "fail"


def _term_scale(variant: str, cfg, params, tokens, b: RunResult | None) -> tuple[float | None, str | None]:
    """The loss's term scale of a variant's cross-framework rows, or ``(None, why)``.

    The GPT variants' next-token cross-entropy: the reference's term scale
    (:func:`parity.runners.framework.loss_term_scale`) on the float32 model. The user
    stack's loss, ``mean(y^2)``, is a mean of non-negative terms, which cannot cancel: its terms'
    scale is the loss itself (the reference run's).
    """
    try:
        if variant in GPT_VARIANTS:
            return loss_term_scale(cfg, params, tokens), None
        return (None, None) if b is None else (abs(float(b.loss)), None)
    except Exception as exc:  # recorded on the variant's rows, and the suite goes on
        return None, f"the loss's term scale could not be computed: {type(exc).__name__}: {exc}"


def _cross_rows(variant: str, plans, results: dict, cfg, params, tokens) -> list[dict]:
    """One :func:`parity.checks.compare.cross_row` per plan of a variant without randomness."""
    def run_of(fw, name):
        return next((results[(fw, m, name)] for m in FRAMEWORKS[fw].modes if (fw, m, name) in results), None)

    a_fw, b_fw = FRAMEWORK_NAMES
    rows = []
    for name, _ in plans:
        a, b = run_of(a_fw, name), run_of(b_fw, name)
        scale, failure = _term_scale(variant, cfg, params, tokens, b)
        grads = {}
        if variant == "frozen" and a is not None and b is not None:
            grads = {"grads_a": split_trainable(cfg, a.grads), "grads_b": split_trainable(cfg, b.grads)}
        rows.append(cross_row(name, CROSS_VARIANTS[variant], a, b, scale, failure=failure, variant=variant, **grads))
    return rows


def case_count(suite) -> int:
    """Number of cases :func:`run_stress` runs for ``suite``."""
    return len(VARIANTS) * len(framework_modes(suite.frameworks)) * len(suite.plan_list())


@dataclasses.dataclass
class _StressCases:
    """One stress variant's cases (a :class:`parity.cases.loop.CaseSet`)."""

    variant: str
    suite: object
    cfg: TransformerConfig
    case_cfg: TransformerConfig
    params: dict
    tokens: np.ndarray
    base: UserStack

    def new_case(self, framework, mode, name, plan):
        gpt = self.variant in GPT_VARIANTS
        case = new_case(framework, mode, name, plan, self.case_cfg, self.suite.preset.name)
        case.update(variant=self.variant, model=self.suite.preset.name if gpt else "user-stack")
        return case

    def label(self, framework, mode, name):
        return f"{self.variant} {framework}/{mode} {name}"

    def run(self, framework, mode, plan, *, again):
        return _run(self.variant, framework, mode, plan, self.suite, self.cfg, self.params, self.tokens, self.base, again)

    def check(self, case, framework, mode, plan, res, ref, again):
        if again is not None:
            res = dataclasses.replace(again, step_time_s=res.step_time_s, step_times_s=res.step_times_s)
        _fill(case, self.variant, self.cfg, self.params, res, ref, self.base.steps)


def run_stress(suite, on_case: Callable | None = None, on_start: Callable | None = None,
               on_partial: Callable | None = None, variants: tuple[str, ...] = VARIANTS,
               user_stack: UserStack | None = None) -> dict:
    """Run the stress variants; the report has the layout of :func:`parity.cases.suite.run_suite`'s,
    each case and cross row naming its ``variant``. A case that raises is recorded as ``error``.

    The cases of each variant run in :func:`parity.cases.loop.run_cases`. ``user_stack`` sets the
    shape of the user-style stack (default :class:`UserStack` with the suite's seed); the GPT
    variants use ``suite.preset``.
    """
    callbacks = Callbacks(on_case=on_case, on_start=on_start, on_partial=on_partial)
    plans = suite.plan_list()
    base = user_stack or UserStack(seed=suite.seed)
    cfg = suite.preset.config.replace(dtype="float32")
    params = init_params(cfg, seed=suite.seed)
    tokens = token_batch(suite.preset.batch_size, suite.preset.seq_len, seed=suite.seed)
    report = {"schema": SCHEMA_VERSION, "suite": suite.name, "model": suite.preset.name,
              "config": dataclasses.asdict(cfg), "batch_size": suite.preset.batch_size,
              "seq_len": suite.preset.seq_len, "hparams": dataclasses.asdict(suite.hparams), "seed": suite.seed,
              "user_stack": dataclasses.asdict(base), "variants": list(variants),
              "cases": [], "cross_framework": []}
    for variant in variants:
        case_cfg = cfg if variant in GPT_VARIANTS else TransformerConfig(n_layer=base.n_layer)
        results = run_cases(report, plans, framework_modes(suite.frameworks),
                            _StressCases(variant, suite, cfg, case_cfg, params, tokens, base), callbacks)
        if variant in CROSS_VARIANTS and set(FRAMEWORK_NAMES) <= set(suite.frameworks):
            report["cross_framework"] += _cross_rows(variant, plans, results, cfg, params, tokens)
    return report
