"""``jaxremat.doctor(fn, *args)``: check the remat of a user's own loss or train step.

Steps (docs/doctor.md has the why of each):

1. Decide what to differentiate (:mod:`jaxremat.doctor.program`): a loss is checked as
   ``jax.value_and_grad`` in the float leaves of ``args[argnums]``, a train step that
   differentiates inside as it is; ``flax.nnx`` modules among ``args`` are split into their state.
2. Trace the program once with every remat region recorded where JAX differentiates it
   (:mod:`jaxremat.doctor.regions`), and count each region's recompute runs in the program.
3. Per region, read the policy's names and answers (:mod:`jaxremat.doctor.policy_probe`) and the
   residual bytes one call keeps under its policy, ``nothing_saveable`` and ``everything_saveable``
   (:func:`jaxremat.doctor.measure.kept_per_call`): ``policy-name-missing``, ``policy-dropped``,
   ``offload-not-host`` (traced).
4. Look for wasteful stacked scan outputs (:mod:`jaxremat.doctor.stacked`): ``stacked-output``.
5. Unless ``compile=False``: compile the program once (temp bytes, matrix products, host
   buffers), and once more per region whose policy promises a saving, with that region at
   ``everything_saveable``: ``remat-not-surviving`` when the compiled temp bytes do not show the
   promised saving (:func:`jaxremat.doctor.checks.not_surviving`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from ..survival import MIN_PROMISED
from . import checks
from .diagnosis import Diagnosis, Problem, Region
from .measure import compile_stats, kept_per_call, trace_program, vjp_forward
from .policy_probe import policy_names, region_answers, region_tags
from .program import Program, make_program
from .regions import RegionRecord, region_calls
from .stacked import parameter_copies, unread_outputs

__all__ = ["MIN_PROMISED_OF_TEMP", "doctor"]

_EVERYTHING = jax.checkpoint_policies.everything_saveable
MIN_PROMISED_OF_TEMP = 0.01
"""A region's compiled saving is measured when its traced saving is at least this fraction of the
program's compiled temp bytes (and :data:`jaxremat.survival.MIN_PROMISED` of what
``everything_saveable`` keeps in it); smaller ones are within XLA's scheduling noise."""


def _region(record: RegionRecord, calls: int) -> Region:
    saved, offloaded = policy_names(record.policy)
    kept, host = kept_per_call(record, record.policy)
    nothing = kept if record.policy is None else kept_per_call(record, None)[0]
    everything = kept_per_call(record, _EVERYTHING)[0]
    device = kept if jax.default_backend() == "cpu" else kept - host  # on a CPU, host memory is device memory
    return Region(record.index + 1, record.policy_name, record.position, record.site, record.function,
                  tuple(sorted(region_tags(record.jaxpr))), tuple(sorted(saved)), tuple(sorted(offloaded)), calls,
                  kept, host, everything, nothing, max(0, everything - device) * calls)


def _compiled_saving(program: Program, region: Region, record: RegionRecord, base: dict) -> Region:
    """``region`` with its compiled saving: the program compiled with it at ``everything_saveable``, less
    ``base``'s temp bytes; unchanged (None) when it recomputes nothing or promises too little."""
    promised = region.promised_saving_bytes
    if (region.calls == 0 or promised < MIN_PROMISED * region.everything_bytes_per_call * region.calls
            or promised < MIN_PROMISED_OF_TEMP * base["temp_bytes"]):
        return region
    traced, _ = trace_program(program.value_and_grad, program.leaves, {record.key: _EVERYTHING})
    variant = compile_stats(traced)
    return dataclasses.replace(region, compiled_saving_bytes=variant["temp_bytes"] - base["temp_bytes"])


def _stacked(program: Program, traced_jaxpr) -> list:
    if program.kind == "loss":
        jaxpr, residuals = vjp_forward(program)
        return parameter_copies(jaxpr) + unread_outputs(jaxpr, residuals)
    return parameter_copies(traced_jaxpr)


def doctor(fn: Callable, *args, argnums: int | tuple[int, ...] = 0, has_aux: bool | None = None,
           compile: bool = True) -> Diagnosis:
    """Check the remat of a loss or train step: does each region keep what its policy names, survive
    compilation, offload to host; does a scan stack what nobody reads.

    Args:
        fn: a loss (returns a float scalar, or ``(scalar, aux)``), differentiated here with
            ``jax.value_and_grad`` in the float leaves of ``args[argnums]``; or a whole train step
            that calls ``jax.grad`` / ``jax.value_and_grad`` / ``nnx.grad`` inside, checked as it
            is. Any JAX function: ``jax.checkpoint`` over ``lax.scan``, ``nnx.remat`` +
            ``nnx.scan``, Linen ``nn.remat`` / ``nn.remat_scan``, :func:`jaxremat.remat_scan`,
            :func:`jaxremat.remat_stack`, Python loops. May be ``jax.jit``-ed.
        *args: its arguments: pytrees of arrays or ``jax.ShapeDtypeStruct`` s (nothing is
            allocated or run), or ``flax.nnx`` modules (split into their state here).
        argnums: the arguments a loss is differentiated in (their float leaves).
        has_aux: the loss returns ``(loss, aux)``; None decides from its output.
        compile: compile the program (once, and once more per region whose policy promises a
            saving) to check ``remat-not-surviving`` and compiled offload; False checks the traced
            program only.

    Returns:
        :class:`jaxremat.doctor.Diagnosis`: ``problems`` (empty when none is found), ``regions``,
        ``compiled``; ``str()`` is the table.

    Raises:
        ValueError: ``argnums`` out of range, or a loss with no float leaf there; JAX's ``jax_remat3``
            flag is on (its ``jax.checkpoint`` is another primitive, whose regions the doctor cannot see).
        Whatever tracing ``fn`` raises (a wrong argument shape, a non-array argument).

    Each trace runs in a trace context of its own (:mod:`jaxremat.doctor.regions`), so that every
    region is differentiated again under the doctor's eye; no JAX cache is cleared. Source:
    ``jax.checkpoint`` policies (``jax/_src/ad_checkpoint.py``).
    """
    if jax.config.jax_remat3:
        raise ValueError("jaxremat.doctor reads the regions of JAX's default jax.checkpoint, and jax_remat3 is on: "
                         "diagnose with it off (jax.config.update('jax_remat3', False), or JAX_REMAT3=0)")
    name = getattr(fn, "__name__", type(fn).__name__)
    program = make_program(fn, args, (argnums,) if isinstance(argnums, int) else tuple(argnums), has_aux)
    traced, records = trace_program(program.value_and_grad, program.leaves)
    calls = region_calls(traced.jaxpr)
    regions = [_region(r, calls.get(r.index, 0)) for r in records]
    answers = [region_answers(r.policy, r.jaxpr) for r in records]
    problems: list[Problem] = []
    for region, ans in zip(regions, answers):
        problems += checks.name_missing(region) + checks.policy_dropped(region, ans, "vmap" in region.position)
    compiled = None
    if compile:
        compiled = compile_stats(traced)
        regions = [_compiled_saving(program, g, r, compiled) for g, r in zip(regions, records)]
        problems += [p for g in regions for p in checks.not_surviving(g, compiled)]
    for region, ans in zip(regions, answers):
        problems += checks.offload_not_host(region, ans, compiled)
    for found in _stacked(program, traced.jaxpr):
        problems += checks.stacked_output(found)
    program_name = f"value_and_grad({name})" if program.kind == "loss" else name
    return Diagnosis(program_name, tuple(regions), tuple(problems), compiled, tuple(_notes(regions, answers, compiled)))


def _notes(regions: list[Region], answers: list, compiled: dict | None) -> list[str]:
    notes = []
    if not regions:
        notes.append("no jax.checkpoint region is differentiated in this program (Flax's nn.remat_scan with one "
                     "length checkpoints nothing; jaxremat.remat_scan's reverse loop recomputes without one unless "
                     "given a policy; a checkpoint whose inputs carry no gradient is not differentiated)")
    if compiled and compiled["backend"] == "cpu" and any(a.offload_dsts for a in answers):
        notes.append("on cpu, host and device memory are one: the compiled offload check runs on a GPU or TPU backend")
    return notes
