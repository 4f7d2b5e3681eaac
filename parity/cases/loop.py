"""The one case loop every case set runs: the no-remat reference first, then each plan against it.

For each framework and mode, :func:`run_cases` runs ``none`` (the reference) and a second time
(run-to-run determinism: the reference is checked against itself), then every other plan, each
checked against the reference by the case set's ``check``. A case that raises is recorded with
``status: "error"``, its message and a short traceback, and the loop goes on; a plan whose
reference failed is an error too (nothing to compare against). After each case the callbacks
see it (progress display, partial reports kept on Ctrl-C).

Case sets (:mod:`parity.cases.suite`'s quick and full suites, :mod:`parity.cases.stress`, the depth
sweep's :class:`parity.cases.sweep.SweepCases`) give the loop what differs between them: how a case
is run, and what is checked. A case set that measures rather than compares (the sweep) says so with
two optional attributes: ``rerun_reference = False`` (no determinism re-run of ``none``) and
``requires_reference = False`` (a plan still runs when ``none`` failed: at depth, ``none`` may be the
case that does not fit in memory).
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from typing import Any, Callable, Iterable, Protocol

from jaxremat.spec.plan import RematPlan

REFERENCE_NOTE = "a second run of none (run-to-run determinism)"


@dataclasses.dataclass(frozen=True)
class Callbacks:
    """What the caller sees while the loop runs (each may be None).

    Attributes:
        on_case: called with each finished case dict.
        on_start: called with a short label before each case starts.
        on_partial: called with the report so far after each case.
    """

    on_case: Callable[[dict], None] | None = None
    on_start: Callable[[str], None] | None = None
    on_partial: Callable[[dict], None] | None = None


class CaseSet(Protocol):
    """What a case set gives :func:`run_cases` for one group of cases (one dtype, one variant, one depth...).

    Optional attributes (read with defaults): ``rerun_reference`` (True: run ``none`` twice and pass
    the second run to ``check`` as ``again``) and ``requires_reference`` (True: a plan whose ``none``
    failed is an error; False: it runs, and ``check`` gets ``ref=None``).
    """

    def new_case(self, framework: str, mode: str, name: str, plan: RematPlan) -> dict:
        """The case dict before it runs (``status: "error"`` until checked)."""

    def label(self, framework: str, mode: str, name: str) -> str:
        """A short label of the case for the progress display."""

    def run(self, framework: str, mode: str, plan: RematPlan, *, again: bool) -> Any:
        """Run one plan; ``again`` is the reference's determinism re-run (one timed step is enough)."""

    def check(self, case: dict, framework: str, mode: str, plan: RematPlan, res: Any, ref: Any,
              again: Any | None) -> None:
        """Fill ``case`` from ``res`` against ``ref``; for the reference, ``again`` is its second run."""


def run_cases(report: dict, plans: Iterable[tuple[str, RematPlan]], modes: Iterable[tuple[str, str]],
              case_set: CaseSet, callbacks: Callbacks = Callbacks()) -> dict[tuple[str, str, str], Any]:
    """Run every plan in every (framework, mode) of ``modes``; append each case to ``report["cases"]``.

    Args:
        report: the report being built; ``report["cases"]`` is appended to.
        plans: ``[(canonical name, plan)]`` with ``none`` first (the reference).
        modes: the (framework, mode) pairs to run (:func:`parity.runners.framework.framework_modes`).
        case_set: how a case runs and what is checked (:class:`CaseSet`).
        callbacks: progress and partial-report callbacks.

    Returns:
        ``{(framework, mode, name): result}`` of every case that completed (for cross-framework rows).
    """
    plans = list(plans)
    rerun = getattr(case_set, "rerun_reference", True)
    requires = getattr(case_set, "requires_reference", True)
    results: dict[tuple[str, str, str], Any] = {}
    for framework, mode in modes:
        ref = None
        for name, plan in plans:
            case = case_set.new_case(framework, mode, name, plan)
            if callbacks.on_start:
                callbacks.on_start(case_set.label(framework, mode, name))
            t0 = time.perf_counter()
            try:
                if name != "none" and ref is None and requires:
                    raise RuntimeError("the no-remat reference case failed; nothing to compare against")
                res = case_set.run(framework, mode, plan, again=False)
                if name == "none":
                    ref = res
                    again = case_set.run(framework, mode, plan, again=True) if rerun else None
                    case_set.check(case, framework, mode, plan, res, ref, again)
                    case["compared_with"] = REFERENCE_NOTE if rerun else None
                else:
                    case_set.check(case, framework, mode, plan, res, ref, None)
                    case["compared_with"] = "none"
                results[(framework, mode, name)] = res
            except Exception as exc:  # recorded, and the loop goes on
                case["status"] = "error"
                case["error"] = f"{type(exc).__name__}: {exc}"
                case["traceback"] = traceback.format_exc(limit=8)
            case["case_wall_s"] = time.perf_counter() - t0
            report["cases"].append(case)
            if callbacks.on_case:
                callbacks.on_case(case)
            if callbacks.on_partial:
                callbacks.on_partial(report)
    return results
