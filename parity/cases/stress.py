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

from parity.cases import stress_frozen, stress_user
from parity.cases.loop import FRAMEWORK_MODES, Callbacks, run_cases
from parity.cases.record import fill_case, new_case
from parity.cases.stress_frozen import frozen_entries, split_trainable
from parity.cases.stress_user import UserStack
from parity.checks.compare import compare_bitwise, max_rel_err, tolerance_for
from parity.inputs.corpus import token_batch
from parity.report.suite_report import SCHEMA_VERSION
from parity.runners.dispatch import run_framework
from parity.runners.result import RunResult

DROPOUT_RATES = (0.1, 0.5)
NOISE = 0.1
VARIANTS = ("bf16", "frozen", "running_stats", *(f"dropout({p})+noise" for p in DROPOUT_RATES))
CROSS_VARIANTS = {"bf16": "bfloat16", "frozen": "float32", "running_stats": "float32"}


def _user_stack(variant: str, base: UserStack) -> UserStack:
    if variant == "running_stats":
        return dataclasses.replace(base, running_stats=True)
    p = float(variant[len("dropout("):variant.index(")")])
    return dataclasses.replace(base, dropout=p, noise=NOISE)


def _run(variant, framework, mode, plan, suite, cfg, params, tokens, base: UserStack) -> RunResult:
    """One run of ``variant``: loss, grads, trained (and state / the frozen check; memory for ``bf16``)."""
    if variant == "bf16":
        bf = cfg.replace(compute_dtype="bfloat16")
        return run_framework(framework, mode, bf, params, tokens, plan, suite,
                              with_reverse_loop=plan.name != "none" and (framework, mode) != ("jax", "jit"))
    if variant == "frozen":
        if framework == "jax":
            return stress_frozen.run_jax(cfg, params, tokens, plan.schedule, mode=mode, hparams=suite.hparams)
        return stress_frozen.run_torch(cfg, params, tokens, plan.schedule, hparams=suite.hparams)
    stack = _user_stack(variant, base)
    if framework == "jax":
        return stress_user.run_jax(stack, plan.schedule, jit=mode == "jit")
    return stress_user.run_torch(stack, plan.schedule)


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


def _cross(variant: str, name: str, jax_res, torch_res, cfg) -> dict:
    dtype = CROSS_VARIANTS[variant]
    tol = tolerance_for(dtype)
    out = {"variant": variant, "schedule": name, "dtype": dtype, "tolerance": tol.max_rel_err,
           "tolerance_reason": tol.reason, "max_rel_err_loss": None, "max_rel_err_grads": None, "ok": False,
           "error": None}
    if jax_res is None or torch_res is None:
        out["error"] = "a framework's case did not complete; nothing to compare"
        return out
    ga, gb = jax_res.grads, torch_res.grads
    if variant == "frozen":
        ga, gb = split_trainable(cfg, ga), split_trainable(cfg, gb)
    out["max_rel_err_loss"] = max_rel_err({"loss": jax_res.loss}, {"loss": torch_res.loss})
    out["max_rel_err_grads"] = max_rel_err(ga, gb)
    out["ok"] = out["max_rel_err_loss"] <= tol.max_rel_err and out["max_rel_err_grads"] <= tol.max_rel_err
    return out


def case_count(suite) -> int:
    """Number of cases :func:`run_stress` runs for ``suite``."""
    modes = sum(1 for f, _ in FRAMEWORK_MODES if f in suite.frameworks)
    return len(VARIANTS) * modes * len(suite.schedule_objects())


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
        gpt = self.variant in ("bf16", "frozen")
        case = new_case(framework, mode, name, plan, self.case_cfg, self.suite.preset.name)
        case.update(variant=self.variant, model=self.suite.preset.name if gpt else "user-stack")
        return case

    def label(self, framework, mode, name):
        return f"{self.variant} {framework}/{mode} {name}"

    def run(self, framework, mode, plan, *, again):
        suite = dataclasses.replace(self.suite, timing_repeats=1) if again else self.suite
        return _run(self.variant, framework, mode, plan, suite, self.cfg, self.params, self.tokens, self.base)

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
    schedules = suite.schedule_objects()
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
        gpt = variant in ("bf16", "frozen")
        case_cfg = cfg if gpt else TransformerConfig(n_layer=base.n_layer)
        modes = [(f, m) for f, m in FRAMEWORK_MODES if f in suite.frameworks]
        results = run_cases(report, schedules, modes,
                            _StressCases(variant, suite, cfg, case_cfg, params, tokens, base), callbacks)
        if variant in CROSS_VARIANTS and {"jax", "torch"} <= set(suite.frameworks):
            for name, _ in schedules:
                jax_res = results.get(("jax", "jit", name)) or results.get(("jax", "eager", name))
                report["cross_framework"].append(_cross(variant, name, jax_res, results.get(("torch", "eager", name)), cfg))
    return report
