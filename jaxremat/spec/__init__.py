"""jaxremat's neutral spec, the remat language: schedules, policies, plans, the cost model, activation names.

Imports neither JAX nor PyTorch; both renderers and the parity harness build on it. Model configs,
parameter layouts, initialisation and the per-tensor activation accounts live on the model side,
:mod:`jaxremat.models`.
"""

from .cost import peak_units, recomputed_blocks, stored_boundaries
from .lint import RematPolicyWarning
from .names import ACTIVATION_NAMES, check_names
from .plan import RematPlan, parse_plan
from .policies import MAXTEXT_ALIASES, POLICIES, POLICY_NAMES, Policy, parse_policy
from .schedules import (
    DEFAULT_SCHEDULES,
    SCHEDULE_NAMES,
    EveryK,
    Full,
    Nested,
    NoRemat,
    Schedule,
    Segment,
    Segments,
    Sqrt,
    every_k,
    full,
    nested,
    none,
    parse_schedule,
    segments,
    sqrt,
)

__all__ = [
    "ACTIVATION_NAMES", "DEFAULT_SCHEDULES", "MAXTEXT_ALIASES", "POLICIES", "POLICY_NAMES", "SCHEDULE_NAMES",
    "EveryK", "Full", "Nested", "NoRemat", "Policy", "RematPlan", "RematPolicyWarning", "Schedule", "Segment",
    "Segments", "Sqrt", "check_names", "every_k", "full", "nested", "none", "parse_plan", "parse_policy",
    "parse_schedule", "peak_units", "recomputed_blocks", "segments", "sqrt", "stored_boundaries",
]
