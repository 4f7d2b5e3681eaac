"""jaxremat: activation rematerialization (gradient checkpointing) schedules for JAX/Flax.

The library, importable from here: schedules and plans (:func:`parse_plan`, :func:`parse_schedule`,
:func:`parse_policy`, :data:`POLICIES`, ``none``/``full``/``every_k``/``sqrt``/``segments``/
``nested``), the JAX renderers (:func:`remat_scan` for any stacked layer function;
:func:`remat_stack`, :class:`RematStack`, :func:`linen_remat_stack` for Flax NNX and Linen blocks;
:func:`to_jax_policy`), the plan lint (:func:`check_plan`), the compiled-saving check
(:func:`survival_check`), the one-call planners (:func:`plan_scan`, :func:`plan_stack`:
the least-recompute plan within a budget, checked on the compiled program), the remat doctor for any loss or train step (:func:`doctor`,
:class:`Diagnosis`; ``python -m jaxremat.doctor``), the memory measurements (:func:`saved_residuals`,
:func:`compiled_memory`, :func:`compiled_stats`, ...) and the estimate without allocating
(``jaxremat.estimate(fn, *abstract_args, plans=...)``: the module :mod:`jaxremat.estimate`, callable
as its function :func:`jaxremat.estimate.estimate`). ``__all__`` lists every public name;
``jaxremat.render``, ``jaxremat.flax``, ``jaxremat.memory`` and the other submodules are reached
as attributes too.

Every name is imported on first use (PEP 562 module ``__getattr__``, table :data:`_NAMES`), for two
reasons: the PyTorch reference imports ``jaxremat.spec`` (which imports neither JAX nor PyTorch)
and must not load JAX by doing so, and ``import jaxremat`` stays cheap. The spec's names
(``jaxremat.parse_plan``) load no framework; a JAX name (``jaxremat.remat_scan``) loads JAX then.
Nothing here imports PyTorch.
"""

from __future__ import annotations

import importlib
import pkgutil

# public name -> module that defines it (relative to this package)
_NAMES = {
    # the remat language (jaxremat.spec: no JAX, no PyTorch)
    **dict.fromkeys(("Schedule", "Segment", "NoRemat", "Full", "EveryK", "Segments", "Sqrt", "Nested",
                     "none", "full", "every_k", "sqrt", "segments", "nested", "parse_schedule",
                     "SCHEDULE_NAMES", "DEFAULT_SCHEDULES"), ".spec.schedules"),
    **dict.fromkeys(("Policy", "POLICIES", "POLICY_NAMES", "MAXTEXT_ALIASES", "parse_policy"), ".spec.policies"),
    **dict.fromkeys(("RematPlan", "parse_plan", "check_default_policy", "segment_policy"), ".spec.plan"),
    **dict.fromkeys(("PlanSegment", "SegmentPlan", "segment_plan", "parse_segment_plan", "PLAN_GRAMMAR"),
                    ".spec.segment_plan"),
    **dict.fromkeys(("ACTIVATION_NAMES", "ATTENTION_NAMES", "MLP_NAMES"), ".spec.names"),
    **dict.fromkeys(("peak_units", "recomputed_blocks", "stored_boundaries"), ".spec.cost"),
    "RematPolicyWarning": ".spec.lint",
    # JAX renderers
    "remat_scan": ".render",
    **dict.fromkeys(("remat_stack", "RematStack", "linen_remat_stack", "linen_init_stack", "plan_stack"), ".flax"),
    "BlockContractError": ".flax_checks",
    "to_jax_policy": ".policies",
    "check_plan": ".lint",
    # sharding (meshes and parameter/batch shardings of the stacked GPT)
    **dict.fromkeys(("make_mesh", "parse_mesh", "param_shardings", "batch_sharding", "check_divides"), ".sharding"),
    # measurements
    **dict.fromkeys(("survival_check", "Survival"), ".survival"),
    **dict.fromkeys(("plan_scan", "FittedPlan"), ".fit"),
    **dict.fromkeys(("doctor", "Diagnosis"), ".doctor"),
    **dict.fromkeys(("ResidualRecord", "saved_residuals", "saved_activation_bytes", "compiled_memory",
                     "compiled_stats", "device_peak_bytes", "gpu_available"), ".memory"),
    "PlanEstimate": ".estimate",
}

__all__ = sorted([*_NAMES, "estimate"])  # estimate: the submodule, callable as its function (jaxremat.estimate)


def _submodules() -> set[str]:
    """The submodules and subpackages of this package (``render``, ``flax``, ``spec``, ...), from its folder."""
    return {m.name for m in pkgutil.iter_modules(__path__)}


def __getattr__(name: str):
    """Import a public name (or a submodule) on first use and keep it in the package namespace."""
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name], __name__), name)
    elif not name.startswith("_") and name in _submodules():
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES, *_submodules()})
