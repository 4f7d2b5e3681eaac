"""jaxremat's neutral spec: configuration, schedules, cost model and parameter layout.

Imports neither JAX nor PyTorch; both renderers and the parity harness build on it.
"""

from .config import SUPPORTED_DTYPES, TransformerConfig
from .cost import peak_units, recomputed_blocks, stored_boundaries
from .params import BLOCK_PARAM_NAMES, check_params, init_params, param_shapes
from .train import AdamWConfig
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
    "AdamWConfig", "SUPPORTED_DTYPES", "TransformerConfig", "peak_units", "recomputed_blocks", "stored_boundaries",
    "BLOCK_PARAM_NAMES", "check_params", "init_params", "param_shapes", "DEFAULT_SCHEDULES",
    "SCHEDULE_NAMES", "EveryK", "Full", "Nested", "NoRemat", "nested", "Schedule", "Segment", "Segments", "Sqrt",
    "every_k", "full", "none", "parse_schedule", "segments", "sqrt",
]
