"""The remat regions of a differentiated JAX program, read where JAX differentiates them.

A remat region is one ``jax.checkpoint`` call site (also ``jax.remat``, ``nnx.remat``, Linen
``nn.remat`` / ``nn.remat_scan``, jaxremat's renderers): a ``remat2`` equation whose ``jaxpr`` is
the checkpointed function and whose ``policy`` decides what its differentiation keeps. JAX asks the
policy while it differentiates the equation, about the jaxpr it differentiates: batched when a
``jax.vmap`` sits inside the differentiation, traced inside a ``jax.custom_vjp`` rule when the
checkpoint is called there, and gone from the program afterwards (the forward part is inlined;
the recompute stays as a ``remat2`` equation with ``differentiated=True`` in the backward pass).
So each region is recorded at that moment:

* :func:`recording` replaces, while a program is traced, the JVP rule of ``remat2`` in
  ``jax._src.interpreters.ad.primitive_jvps`` (a private table of jax 0.10.2) with one that
  records the region (:class:`RegionRecord`: its jaxpr, input types, which inputs carry a
  tangent, policy, the Python call stack) and calls JAX's own rule with the policy wrapped in a
  :class:`TaggedPolicy` that answers as the policy does and carries the region's number;
* :func:`region_calls` counts, in the traced program, the equations JAX left tagged with each
  region, times the trip counts of the scans around them: how many times the region's recompute runs;
* ``swaps`` replace a region's policy in one trace (the doctor compiles the program with one
  region at ``everything_saveable`` to see what that region's remat changes in compiled memory).

A region is identified across traces by its user call site, the checkpointed function, its
policy's description and its input types; a Python loop calling one checkpointed function N times
is one region with N calls. JAX's trace caches would skip the JVP rule for a function traced or
differentiated before (a jitted train step traced twice); every cache key holds JAX's *trace
context*, so :func:`recording` sets a config state of its own in that context, ``jaxremat_doctor_trace``
(``jax._src.config.int_state(..., include_in_trace_context=True)``), to a fresh value: each recording
traces anew, and no cache is cleared (compiled executables of the user's session are kept).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import itertools
import os
import sysconfig
from typing import Any, Callable, Iterator

import flax
import jax
import jax.extend.core
from jax._src import config as _config
from jax._src.interpreters import ad as _ad
from jax.extend.core.primitives import remat_p

from .policy_probe import describe_policy

__all__ = ["RegionRecord", "Recorder", "TaggedPolicy", "eqn_site", "recording", "region_calls"]

_LIBRARY_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (jax, flax)) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # jaxremat itself
    os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep,
)
_TRACE_KEY_NAME = "jaxremat_doctor_trace"
_TRACE_KEY = _config.config_states.get(_TRACE_KEY_NAME) or _config.int_state(
    _TRACE_KEY_NAME, 0, "jaxremat.doctor: a fresh value per recorded trace, so that JAX's trace caches miss",
    include_in_trace_context=True)
_TRACES = itertools.count(1)
_JAXLIB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(jax.__file__))) + os.sep + "jaxlib" + os.sep


@dataclasses.dataclass(eq=False)
class TaggedPolicy:
    """A region's policy as JAX uses it in the doctor's traces: the same answers, plus the region's number.

    Attributes:
        region: the region's index in :attr:`Recorder.regions`.
        policy: the policy that answers (the user's, or a swapped one); None keeps nothing.
    """

    region: int
    policy: Callable | None

    def __call__(self, prim: Any, *args: Any, **params: Any) -> Any:
        return (self.policy or jax.checkpoint_policies.nothing_saveable)(prim, *args, **params)


@dataclasses.dataclass
class RegionRecord:
    """One remat region as JAX differentiated it.

    Attributes:
        index: position in the order regions were first differentiated.
        key: the region's identity across traces (call site, function, policy, input types).
        jaxpr: the checkpointed function's jaxpr (``jax.extend.core.Jaxpr``, no constants), as the
            policy sees it (batched under a ``jax.vmap`` inside the differentiation).
        in_avals: its input types (shapes and dtypes).
        tangent_in: per input, whether it carries a tangent (is differentiated).
        policy: the user's policy (None: keep nothing).
        policy_name: :func:`jaxremat.doctor.policy_probe.describe_policy` of it.
        position: the transformations around the call, outermost first: ``"scan(24)"``,
            ``"cond"``, ``"while_loop"``, ``"vmap"``, ``"custom_vjp"``, ``"custom_vjp fwd"``,
            ``"custom_vjp bwd"``, ``"region #k"`` (an enclosing remat region).
        site: ``"path:line"`` of the innermost frame of user code (not JAX, Flax, jaxremat or the
            standard library) on the call stack, or ``""``.
        function: where the checkpointed function is defined (``jaxpr.debug_info.func_src_info``).
    """

    index: int
    key: tuple
    jaxpr: Any
    in_avals: tuple
    tangent_in: tuple[bool, ...]
    policy: Callable | None
    policy_name: str
    position: tuple[str, ...]
    site: str
    function: str


def _is_library(path: str) -> bool:
    if path.startswith("<"):  # "<string>" (python -c), "<stdin>" are user code; "<frozen ...>" is not
        return path.startswith("<frozen")
    path = os.path.abspath(path)
    return path.startswith(_LIBRARY_DIRS) or path.startswith(_JAXLIB_DIR)


def _short_path(path: str) -> str:
    if path.startswith("<"):
        return path
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def eqn_site(eqn: Any) -> str:
    """``"path:line"`` of the innermost user-code frame JAX recorded for an equation, or ``""``."""
    traceback = getattr(getattr(eqn, "source_info", None), "traceback", None)
    for frame in getattr(traceback, "frames", ()):
        if not _is_library(frame.file_name):
            return f"{_short_path(frame.file_name)}:{frame.line_num}"
    return ""


_AD_RULES = ("jvp", "linearize", "partial_eval")  # JAX's differentiation rules for scan, while, cond


def _frame_label(frame: Any, jaxpr: Any) -> tuple[str, bool] | None:
    """``(label, is_rule)``: the transformation a library frame stands for, or None.

    ``is_rule`` marks a differentiation rule's frame (``_scan_linearize``, ``_cond_jvp``, ...): it
    stands for the scan or cond whose equation is being differentiated, which is the user's call
    just outside it when there is one (the two are then one position).
    """
    code, path = frame.f_code, frame.f_code.co_filename.replace(os.sep, "/")
    name = code.co_name
    differentiating = any(k in name for k in _AD_RULES)
    if code is Recorder.rule.__code__ and frame.f_locals.get("jaxpr") is not jaxpr:
        record = frame.f_locals.get("record")
        return None if record is None else (f"region #{record.index + 1}", False)
    if path.endswith("lax/control_flow/loops.py"):
        if name == "scan" or (name.startswith("_scan_") and differentiating and "length" in frame.f_locals):
            return f"scan({frame.f_locals.get('length')})", name != "scan"
        if name == "while_loop" or (name.startswith("_while_") and differentiating):
            return "while_loop", name != "while_loop"
        return None
    if path.endswith("lax/control_flow/conditionals.py"):
        if name in ("cond", "switch") or (name.startswith("_cond_") and differentiating):
            return "cond", name not in ("cond", "switch")
        return None
    if path.endswith("_src/custom_derivatives.py"):
        if name == "__call__":
            return type(frame.f_locals.get("self")).__name__, False
        label = {"_flatten_fwd": "custom_vjp fwd", "_flatten_bwd": "custom_vjp bwd"}.get(name)
        return None if label is None else (label, False)
    if path.endswith("_src/api.py") and name == "vmap_f":
        return "vmap", False
    return None


def _call_stack(jaxpr: Any, stop: Any) -> tuple[tuple[str, ...], str]:
    """``(position, site)`` from the live Python stack, up to the doctor's trace frame ``stop``."""
    frames, site = [], ""
    frame = inspect.currentframe()
    while frame is not None and frame.f_code is not stop:
        path = frame.f_code.co_filename
        if not site and not _is_library(path):
            site = f"{_short_path(path)}:{frame.f_lineno}"
        if _is_library(path):
            frames.append(frame)
        frame = frame.f_back
    labels: list[tuple[str, bool]] = []
    for frame in reversed(frames):  # outermost first
        found = _frame_label(frame, jaxpr)
        if found is None:
            continue
        label, is_rule = found
        if is_rule and labels and labels[-1] == (label, False):
            labels[-1] = (label, True)  # the rule differentiating the call just outside: one position
        elif label.startswith("custom_vjp ") and labels and labels[-1][0] == "custom_vjp":
            labels[-1] = found  # the rule's side of the custom_vjp called just outside
        else:
            labels.append(found)
    return tuple(label for label, _ in labels), site


class Recorder:
    """The JVP rule of ``remat2`` that records regions; one per traced program (see :func:`recording`).

    Attributes:
        regions: the :class:`RegionRecord` s, in the order JAX first differentiated them.
        swaps: ``{region key: policy}`` used in place of the user's policy in this trace.
    """

    def __init__(self, original: Callable, swaps: dict[tuple, Callable | None], stop: Any):
        self.regions: list[RegionRecord] = []
        self.swaps = swaps
        self._original, self._stop, self._by_key = original, stop, {}

    def rule(self, primals, tangents, *, jaxpr, prevent_cse, differentiated, policy):
        """JAX's ``remat_jvp`` with the region recorded and its policy tagged (and maybe swapped)."""
        record = None
        if not isinstance(policy, TaggedPolicy):  # a tagged one was recorded where it was first differentiated
            record = self._record(primals, tangents, jaxpr, policy)
            policy = TaggedPolicy(record.index, self.swaps.get(record.key, policy))
        return self._original(primals, tangents, jaxpr=jaxpr, prevent_cse=prevent_cse,
                              differentiated=differentiated, policy=policy)

    def _record(self, primals, tangents, jaxpr, policy) -> RegionRecord:
        position, site = _call_stack(jaxpr, self._stop)
        in_avals = tuple(jax.typeof(p) for p in primals)
        info = getattr(jaxpr, "debug_info", None)
        function = getattr(info, "func_src_info", None) or ""
        name = describe_policy(policy)
        key = (site, function, name, position, tuple(a.str_short() for a in in_avals))
        tangent_in = tuple(type(t).__name__ != "Zero" for t in tangents)
        record = self._by_key.get(key)
        if record is None:
            record = RegionRecord(len(self.regions), key, jaxpr, in_avals, tangent_in, policy, name, position, site,
                                  function)
            self._by_key[key] = record
            self.regions.append(record)
        # a scan differentiates its body until the carry's tangents settle: an input may gain one
        record.tangent_in = tuple(a or b for a, b in zip(record.tangent_in, tangent_in))
        return record


@contextlib.contextmanager
def recording(swaps: dict[tuple, Callable | None] | None = None, stop: Any = None) -> Iterator[Recorder]:
    """Within the context, every ``jax.checkpoint`` JAX differentiates is recorded (see the module docstring).

    Args:
        swaps: ``{region key: policy}`` to differentiate those regions under another policy.
        stop: the code object of the caller's frame; the call stack read for positions ends there.

    Yields:
        The :class:`Recorder`; its ``regions`` fill as the caller traces (under a fresh trace
        context, see the module docstring).
    """
    original = _ad.primitive_jvps[remat_p]
    recorder = Recorder(original, dict(swaps or {}), stop)
    _ad.primitive_jvps[remat_p] = recorder.rule
    try:
        with _TRACE_KEY(next(_TRACES)):
            yield recorder
    finally:
        _ad.primitive_jvps[remat_p] = original


def region_calls(jaxpr: Any) -> dict[int, int]:
    """``{region index: runs}``: the tagged ``remat2`` equations JAX left in a program, per region.

    Counted as :func:`jaxremat.custom_vjp.count_named_runs` counts tags: a ``scan`` body once per
    iteration (its ``length``), a ``cond`` its largest branch, a ``while`` body once (its trip count is
    not in the program), any other sub-program once per call. Only recompute equations
    (``differentiated=True``) count; a region whose policy keeps all its backward pass reads has
    none (0 runs).

    Args:
        jaxpr: the traced program (``jax.extend.core.Jaxpr`` or ``ClosedJaxpr``).
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    runs: collections.Counter = collections.Counter()
    for eqn in jaxpr.eqns:
        policy = eqn.params.get("policy") if eqn.primitive is remat_p else None
        if isinstance(policy, TaggedPolicy) and eqn.params.get("differentiated"):
            runs[policy.region] += 1
        subs = [region_calls(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params)]
        if eqn.primitive.name == "cond":
            subs = [collections.Counter({k: max(s.get(k, 0) for s in subs) for s in subs for k in s})]
        times = eqn.params["length"] if eqn.primitive.name == "scan" else 1
        for sub in subs:
            runs.update({k: v * times for k, v in sub.items()})
    return dict(runs)
