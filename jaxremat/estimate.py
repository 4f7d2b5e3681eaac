"""Memory of a training step under each remat plan, at any size, without allocating the model.

:func:`estimate` compiles ``jax.value_and_grad`` of a loss for the present backend from abstract
arguments (``jax.ShapeDtypeStruct``: a shape and a dtype, no data) and reads XLA's buffer
assignment of the compiled program (``jax.stages.Compiled.memory_analysis()``, as
:func:`jaxremat.memory.compiled_stats`): nothing of the model's size is ever allocated, so a
1.3B-parameter model at B=8, T=2048 is estimated on a laptop in a few seconds per plan. The
figures are the ones a concrete compile of the same program gives, byte for byte (the compiler
sees shapes and dtypes only; ``tests/jaxremat/test_estimate.py`` checks it), for the backend the
program is compiled for (``jax.default_backend()``): on a CPU, XLA:CPU's buffer assignment, which
differs from a GPU's (fusion, cuDNN attention), so compile on the device you plan for when you can.

What the figures cover: the arguments (parameters and inputs), the outputs (the loss and one
gradient per parameter) and XLA's temporary buffers (the activations kept for the backward pass,
the backward's working buffers, layout copies): ``peak_bytes = argument + output + temp - alias``.
Optimizer state is not part of a ``value_and_grad`` program; add it yourself (AdamW: two float32
moments per parameter).

Source: ``jax.jit(f).lower(*avals).compile().memory_analysis()`` (JAX "Ahead-of-time lowering and
compilation"); Chen et al. 2016 (arXiv:1604.06174) for the plans.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import types
from typing import Any, Callable, Sequence

import jax
import numpy as np

from .memory import compiled_stats
from .spec.plan import RematPlan, parse_plan

__all__ = ["DEFAULT_PLANS", "PlanEstimate", "abstract", "compile_plan", "estimate"]

DEFAULT_PLANS = ("none", "every_k(2)", "sqrt", "full", "full+attention_only")
"""The plans estimated when none are given: no remat, every second block, Chen et al.'s sqrt(N)
segments, every block, and every block recomputing its attention only (Korthikanti et al. 2022)."""


@dataclasses.dataclass(frozen=True)
class PlanEstimate:
    """XLA's compiled memory of ``value_and_grad`` of a loss under one plan (bytes).

    Attributes:
        plan: the plan's canonical name (``"every_k(2)"``, ``"full+attention_only"``).
        argument_bytes: the arguments (parameters and inputs).
        output_bytes: the outputs (the loss and the gradients).
        alias_bytes: outputs that reuse an argument's buffer (0 without donation).
        temp_bytes: XLA's temporary buffers: what the plan changes (kept activations, the
            backward's working buffers).
        peak_bytes: ``argument + output + temp - alias``: what the executable holds at most.
        compile_time_s: seconds to lower and compile (``time.perf_counter``).
        backend: where the figures come from, e.g. ``"XLA compiled memory_analysis (cpu)"``.
    """

    plan: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    peak_bytes: int
    compile_time_s: float
    backend: str


def abstract(tree: Any) -> Any:
    """``tree`` with every array (or ``jax.ShapeDtypeStruct``) as a ``jax.ShapeDtypeStruct``: shapes
    and dtypes only, nothing that holds data."""
    def one(a):
        if isinstance(a, jax.ShapeDtypeStruct):
            return a
        return jax.ShapeDtypeStruct(np.shape(a), jax.numpy.result_type(a))
    return jax.tree_util.tree_map(one, tree)


def compile_plan(fn: Callable, plan: RematPlan, args: tuple, argnums: int | Sequence[int] = 0) -> tuple[Any, float]:
    """``(compiled, seconds)``: ``jit(value_and_grad(lambda *a: fn(plan, *a)))`` lowered for ``args`` and compiled."""
    t0 = time.perf_counter()
    step = jax.jit(jax.value_and_grad(lambda *a: fn(plan, *a), argnums=argnums))
    compiled = step.lower(*args).compile()
    return compiled, time.perf_counter() - t0


def estimate(fn: Callable, *abstract_args: Any, plans: Sequence[str | RematPlan] = DEFAULT_PLANS,
             argnums: int | Sequence[int] = 0) -> list[PlanEstimate]:
    """Compiled memory of one loss-and-gradient step of ``fn`` under each plan, nothing allocated.

    Example (a 24-layer stack of 2048-wide blocks at B=8, T=2048, about 3 s per plan on a CPU)::

        def loss(plan, params, x):
            y = jaxremat.remat_scan(block, params, x, plan.schedule, policy=plan.policy)
            return jnp.mean(y ** 2)
        params = {"w": jax.ShapeDtypeStruct((24, 2048, 2048), jnp.float32)}
        x = jax.ShapeDtypeStruct((8, 2048, 2048), jnp.float32)
        for row in jaxremat.estimate(loss, params, x, plans=["none", "every_k(2)", "sqrt"]):
            print(row.plan, row.peak_bytes / 2**30, "GiB")

    Args:
        fn: ``fn(plan, *args) -> 0-d loss``; ``plan`` is a :class:`jaxremat.spec.plan.RematPlan`
            whose ``schedule`` and ``policy`` go to :func:`jaxremat.remat_scan` (or the schedule
            argument of :func:`jaxremat.remat_stack`, :func:`jaxremat.model.loss_fn`).
        *abstract_args: the arguments, pytrees of ``jax.ShapeDtypeStruct`` (shape and dtype of
            each array, e.g. ``(24, 2048, 8192)`` float32 stacked weights); arrays are accepted and
            replaced by their shape and dtype.
        plans: plan names (``"none"``, ``"every_k(2)"``, ``"sqrt+save_dots"``,
            ``"plan(3*2+save_dots,18:store)"``) or :class:`jaxremat.spec.plan.RematPlan` values;
            all are parsed before the first compile.
        argnums: the argument(s) differentiated (default the first, the parameters).

    Returns:
        One :class:`PlanEstimate` per plan, in the order given.

    Raises:
        ValueError: an empty list, an unknown plan, or one invalid for the stack (raised by ``fn``
            while tracing, e.g. ``segments(30)`` on 24 layers).
    """
    if isinstance(plans, (str, RematPlan)) or not len(plans):
        raise ValueError(f"plans must be a non-empty list of plan names, e.g. {list(DEFAULT_PLANS)}, got {plans!r}")
    parsed = [parse_plan(p) for p in plans]
    args = tuple(abstract(a) for a in abstract_args)
    rows = []
    for plan in parsed:
        compiled, seconds = compile_plan(fn, plan, args, argnums)
        stats = compiled_stats(compiled)
        rows.append(PlanEstimate(plan.name, stats["argument_bytes"], stats["output_bytes"], stats["alias_bytes"],
                                 stats["temp_bytes"], stats["peak_bytes"], seconds, stats["source"]))
    return rows


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`estimate`: ``jaxremat.estimate(fn, ...)`` works whether the package
    attribute is the module (after ``import jaxremat.estimate``) or reached through ``jaxremat``'s lazy names,
    and ``jaxremat.estimate.PlanEstimate`` works too."""

    def __call__(self, *args, **kwargs):
        return estimate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
