"""jaxremat's neutral spec, the remat language: schedules, policies, plans, the cost model, activation names.

Imports neither JAX nor PyTorch; both renderers and the parity harness build on it. Model configs,
parameter layouts, initialisation and the per-tensor activation accounts live on the model side,
:mod:`jaxremat.models`.
"""

from .cost import peak_units, recomputed_blocks, stored_boundaries
from .lint import RematPolicyWarning
from .names import ACTIVATION_NAMES, check_names
from .plan import RematPlan, check_default_policy, parse_plan, segment_policy
from .policies import MAXTEXT_ALIASES, POLICIES, POLICY_NAMES, Policy, parse_policy
from .segment_plan import PLAN_GRAMMAR, PlanSegment, SegmentPlan, parse_segment_plan, segment_plan
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
    "ACTIVATION_NAMES", "DEFAULT_SCHEDULES", "MAXTEXT_ALIASES", "PLAN_GRAMMAR", "POLICIES", "POLICY_NAMES",
    "SCHEDULE_NAMES", "EveryK", "Full", "Nested", "NoRemat", "PlanSegment", "Policy", "RematPlan",
    "RematPolicyWarning", "Schedule", "Segment", "SegmentPlan", "Segments", "Sqrt", "check_default_policy",
    "check_names", "every_k", "full", "nested", "none", "parse_plan", "parse_policy", "parse_schedule",
    "parse_segment_plan", "peak_units", "recomputed_blocks", "segment_plan", "segment_policy", "segments", "sqrt",
    "stored_boundaries",
]
