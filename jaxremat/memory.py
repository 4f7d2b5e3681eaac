"""What a remat schedule keeps, measured three ways: saved residuals, XLA buffers, device peak.

* :func:`saved_residuals` -- the residuals JAX's autodiff keeps from the forward pass for the
  backward pass, from the private helper behind ``jax.ad_checkpoint.print_saved_residuals``
  (``jax._src.ad_checkpoint.saved_residuals(f, *args)`` in jax 0.10.2, which returns
  ``(aval, description)`` pairs). This is a jaxpr-level count, before XLA.
* :func:`compiled_memory` -- XLA's buffer assignment of the compiled program
  (``jax.jit(f).lower(*args).compile().memory_analysis()``): argument, output, alias and temp
  bytes. This is what the compiler plans; it sees fusion, buffer reuse and any remat undone.
* :func:`device_peak_bytes` -- the allocator's high-water mark on a GPU
  (``jax.Device.memory_stats()["peak_bytes_in_use"]``); GPU only.

The counts can disagree (XLA fuses, reuses and may rematerialize on its own); report them side
by side, never one in place of another.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np
from jax._src import ad_checkpoint as _ad_checkpoint
from jax._src import api_util as _api_util
from jax._src import core as _core
from jax._src import source_info_util as _source_info_util

from .scan_params import scan_layout
from .tags import tag_name

__all__ = [
    "ResidualRecord", "compiled_memory", "compiled_stats", "device_peak_bytes", "saved_activation_bytes",
    "saved_residuals", "gpu_available",
]

# Primitives whose output holds the same values as their (first) input, only laid out
# differently: a residual produced by a chain of these from an input costs no activation memory.
_VIEW_PRIMITIVES = frozenset({
    "reshape", "squeeze", "expand_dims", "slice", "split", "transpose", "copy", "copy_p",
    "dynamic_slice", "reduce_precision",
})


@dataclasses.dataclass(frozen=True)
class ResidualRecord:
    """One residual kept by the forward pass for the backward pass.

    Attributes:
        shape: array shape.
        dtype: numpy dtype name, e.g. ``"float32"``.
        bytes: ``prod(shape) * itemsize`` (bytes).
        description: JAX's own words, e.g. ``"output of scan from model.py:120 (...)"`` or
            ``"from the argument params['wte']"``.
        is_argument: True when the residual is one of the function's inputs (an argument or a
            closed-over array), or a layout-only view of one (reshape, slice, split, squeeze,
            transpose, a broadcast that only adds unit axes, ...; e.g. a segment's parameter
            slice, or a LayerNorm weight broadcast to ``(1, 1, D)``, also when a scan stacks it per
            layer), or a literal constant (a scalar JAX lists without remat and inlines under
            ``jax.checkpoint``). Such residuals are parameters, data or constants, not activations.
        name: the activation name (``checkpoint_name`` tag) the residual carries: the tag itself,
            or the tag that a matrix product's output feeds within a bias add (``h @ W + b``
            tagged ``qkv_proj`` gives its ``dot_general`` output that name). None when untagged,
            or for a scan's stacked residuals (names live inside the scan body).
        memory: ``"device"`` or ``"host"`` (an offloaded residual, memory space pinned_host).
    """

    shape: tuple[int, ...]
    dtype: str
    bytes: int
    description: str
    is_argument: bool
    name: str | None = None
    memory: str = "device"


# This file's tracing wrappers (``flat_fn`` and the ``vjp`` lambda of :func:`_residual_jaxpr`) are not the user's
# code: a residual's description names the first frame outside JAX and this file, as JAX's own helper, whose
# wrappers live in JAX, names it (``"output of cos from "`` when ``fn`` is ``jnp.sin`` itself).
_source_info_util.register_exclusion(__file__)


def _residual_jaxpr(fn: Callable, args: tuple) -> tuple[_core.Jaxpr, list]:
    """The jaxpr of ``vjp(fn)`` restricted to its residual outputs (as the JAX helper builds it)."""
    in_leaves, in_tree = jax.tree_util.tree_flatten(args)

    def flat_fn(*leaves):
        return fn(*jax.tree_util.tree_unflatten(in_tree, leaves))

    closed, out_shape = jax.make_jaxpr(lambda *a: jax.vjp(flat_fn, *a), return_shape=True)(*in_leaves)
    num_res = jax.tree_util.tree_structure(out_shape[1]).num_leaves
    jaxpr = closed.jaxpr
    return jaxpr, list(jaxpr.outvars[len(jaxpr.outvars) - num_res:])


def _is_view(eqn) -> bool:
    """True for a layout-only equation: a view primitive, a broadcast that only adds unit axes, or a
    one-entry in-place add (:func:`jaxremat.layer_pass.tie`: ``x + -0.0`` at one index, same bits)."""
    name = eqn.primitive.name
    if name in _VIEW_PRIMITIVES:
        return True
    if name == "scatter-add" and len(eqn.invars) == 3 and int(np.prod(eqn.invars[2].aval.shape)) == 1:
        return True
    if name == "broadcast_in_dim" and eqn.invars and not isinstance(eqn.invars[0], _core.Literal):
        return int(np.prod(eqn.invars[0].aval.shape)) == int(np.prod(eqn.outvars[0].aval.shape))
    return False


def _scalar_of_inputs(eqn, ins: list[bool]) -> bool:
    """0-d outputs computed from flagged inputs (and literals) only: a scalar of the parameters, such as
    the predicate of :func:`jaxremat.layer_pass.isolate` (JAX keeps a ``cond``'s index for its
    backward pass under ``jax.checkpoint``), not an activation."""
    return (bool(eqn.outvars) and all(getattr(v.aval, "shape", None) == () for v in eqn.outvars)
            and all(f or isinstance(v, _core.Literal) for v, f in zip(eqn.invars, ins)) and any(ins))


def _propagate_from_input(jaxpr: _core.Jaxpr, in_flags: list[bool]) -> dict:
    """Var -> True when it is an input of ``jaxpr`` (flagged in ``in_flags``), a constant, or a
    layout-only view of one, following sub-jaxprs (scan bodies, ``jit``, checkpoint, calls).

    A scan's stacked output is flagged when its body emits a view of a constant or of a scanned
    input (e.g. a LayerNorm weight broadcast to ``(1, 1, D)`` per layer): a parameter, not an
    activation, though JAX lists it among the residuals. Carries are never flagged. So are 0-d
    values computed from flagged values only (:func:`_scalar_of_inputs`).
    """
    flags = {v: True for v in jaxpr.constvars}
    flags.update({v: bool(f) for v, f in zip(jaxpr.invars, in_flags)})

    def flag(v) -> bool:
        return not isinstance(v, _core.Literal) and flags.get(v, False)

    for eqn in jaxpr.eqns:
        ins = [flag(v) for v in eqn.invars]
        if _is_view(eqn):
            outs = [bool(ins and ins[0])] * len(eqn.outvars)
        elif _scalar_of_inputs(eqn, ins):
            outs = [True] * len(eqn.outvars)
        else:
            outs = _sub_jaxpr_outputs(eqn, ins)
        flags.update({o: f for o, f in zip(eqn.outvars, outs) if f})
    return flags


def _sub_jaxpr_outputs(eqn, ins: list[bool]) -> list[bool]:
    """Per output of ``eqn``: whether it is a view of an input, looking inside its sub-jaxpr."""
    sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    inner = getattr(sub, "jaxpr", sub)
    none = [False] * len(eqn.outvars)
    if not isinstance(inner, _core.Jaxpr) or len(inner.invars) != len(ins):
        return none
    if eqn.primitive.name == "scan":
        lay = scan_layout(eqn)
        ins = [f and not lay.consts <= i < lay.xs_start for i, f in enumerate(ins)]
        inner_flags = _propagate_from_input(inner, ins)
        outs = [not isinstance(v, _core.Literal) and inner_flags.get(v, False) for v in inner.outvars]
        return [False] * lay.carry_out + outs[lay.carry_out:] if len(outs) == len(eqn.outvars) else none
    if len(inner.outvars) != len(eqn.outvars):
        return none
    inner_flags = _propagate_from_input(inner, ins)
    return [not isinstance(v, _core.Literal) and inner_flags.get(v, False) for v in inner.outvars]


# Primitives between a matrix product and the tag of the value it produces (``h @ W + b``).
_TAG_PASS_THROUGH = frozenset({"add", "add_any", "convert_element_type", "reduce_precision"})


def _described(fn: Callable, args: tuple, jaxpr: _core.Jaxpr, outvars: list) -> list[tuple[Any, str]]:
    """(aval, description) per residual: JAX's ``saved_residuals`` on the jaxpr :func:`_residual_jaxpr` traced
    (the public helper traces ``vjp(fn)`` the same way; one trace serves both lists)."""
    debug = _api_util.debug_info("saved_residuals", fn, args, {})
    restricted = jaxpr.replace(outvars=outvars, debug_info=debug._replace(result_paths=None))
    return _ad_checkpoint._saved_residuals(restricted, debug.arg_names or ("unknown",) * len(jaxpr.invars))


def _argument_flags(jaxpr: _core.Jaxpr, outvars: list) -> list[tuple[Any, bool, str | None]]:
    """(aval, is_argument, name) per residual, in the order JAX's ``_saved_residuals`` lists them."""
    subst = {e.outvars[0]: e.invars[0] for e in jaxpr.eqns if e.primitive.name == "reduce_precision"}
    literals = [v for v in outvars if isinstance(v, _core.Literal)]
    res_vars = {subst.get(v, v) for v in outvars if not isinstance(v, _core.Literal)}

    from_input = _propagate_from_input(jaxpr, [True] * len(jaxpr.invars))

    producer = {o: e for e in jaxpr.eqns for o in e.outvars}
    consumers: dict = {}
    for e in jaxpr.eqns:
        for i in e.invars:
            if not isinstance(i, _core.Literal):
                consumers.setdefault(i, []).append(e)

    def name_of(v) -> str | None:
        e = producer.get(v)
        while (e is not None and e.primitive.name in ("device_put", "reduce_precision")
               and not isinstance(e.invars[0], _core.Literal)):
            v, e = e.invars[0], producer.get(e.invars[0])  # an offload copies a tagged value (jax_remat3: rounded first)
        if e is not None and tag_name(e) is not None:
            return tag_name(e)
        frontier = [v]
        for _ in range(4):  # dot -> (reduce_precision) -> bias add -> tag
            nxt = []
            for u in frontier:
                for c in consumers.get(u, []):
                    if tag_name(c) is not None:
                        return tag_name(c)
                    if c.primitive.name in _TAG_PASS_THROUGH:
                        nxt.extend(c.outvars)
            frontier = nxt
        return None

    flags = [(v.aval, False, None) for v in literals]
    flags += [(v.aval, True, None) for v in jaxpr.constvars if v in res_vars]
    flags += [(v.aval, True, None) for v in jaxpr.invars if v in res_vars]
    flags += [(v.aval, from_input.get(v, False), name_of(v)) for e in jaxpr.eqns for v in e.outvars if v in res_vars]
    return flags


def saved_residuals(fn: Callable, *args) -> list[ResidualRecord]:
    """The residuals ``jax.vjp(fn, *args)`` keeps, one :class:`ResidualRecord` each.

    Args:
        fn: function of ``args`` (pytrees of arrays) returning arrays; close over anything that
            is not differentiated (tokens, static config, schedule).
        *args: example arguments (concrete arrays or ``jax.ShapeDtypeStruct`` s).

    Returns:
        Records in JAX's order: literals, closed-over constants, arguments, then outputs of
        equations in program order. A scan's stacked residuals appear once each, with the layer
        axis leading.

    Raises:
        RuntimeError: the argument classification and JAX's list disagree in length or shape
            (the private JAX helper changed).

    Source: ``jax._src.ad_checkpoint.saved_residuals`` (behind
    ``jax.ad_checkpoint.print_saved_residuals``): its tracing of ``jax.vjp(fn)`` and its descriptions
    (``_saved_residuals``), on one trace that the argument flags read too.
    """
    jaxpr, outvars = _residual_jaxpr(fn, args)  # traced once: for JAX's descriptions and for the flags
    described = _described(fn, args, jaxpr, outvars)
    flags = _argument_flags(jaxpr, outvars)
    if len(described) != len(flags) or any(
        tuple(a.shape) != tuple(b[0].shape) for (a, _), b in zip(described, flags)
    ):
        raise RuntimeError("jax._src.ad_checkpoint.saved_residuals changed its order; update jaxremat.memory")
    records = []
    for (aval, text), (_, is_input, name) in zip(described, flags):
        nbytes = int(np.prod(aval.shape, dtype=np.int64)) * int(aval.dtype.itemsize)  # keys: 8 B each
        is_arg = is_input or text.startswith("from the argument") or text in ("from a constant", "from a literal")
        memory = "host" if "host" in str(getattr(aval, "memory_space", "")).lower() else "device"
        records.append(ResidualRecord(tuple(aval.shape), str(aval.dtype), nbytes, text, is_arg, name, memory))
    return records


def saved_activation_bytes(fn: Callable, *args) -> int:
    """Bytes of the residuals that are not inputs (see :attr:`ResidualRecord.is_argument`)."""
    return sum(r.bytes for r in saved_residuals(fn, *args) if not r.is_argument)


def compiled_memory(jitted_fn: Callable, *args) -> dict:
    """XLA's compiled buffer sizes for ``jitted_fn(*args)`` (compiles; does not run).

    Args:
        jitted_fn: a ``jax.jit`` -ed function (a plain function is wrapped in ``jax.jit``).
        *args: example arguments.

    Returns:
        dict with ``argument_bytes``, ``output_bytes``, ``alias_bytes``, ``temp_bytes``,
        ``generated_code_bytes``, ``peak_bytes = argument + output + temp - alias`` (bytes) and
        ``source`` (e.g. ``"XLA compiled memory_analysis (cpu)"``).

    Source: ``jax.stages.Compiled.memory_analysis()``.
    """
    jitted = jitted_fn if hasattr(jitted_fn, "lower") else jax.jit(jitted_fn)
    return compiled_stats(jitted.lower(*args).compile())


def compiled_stats(compiled: Any) -> dict:
    """:func:`compiled_memory` 's dict for an already compiled program (``jax.stages.Compiled``).

    Use it to read the buffer sizes of the very executable that runs, without compiling twice.
    """
    stats = compiled.memory_analysis()
    out = {
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
        "generated_code_bytes": int(stats.generated_code_size_in_bytes),
    }
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    out["source"] = f"XLA compiled memory_analysis ({jax.default_backend()})"
    return out


def gpu_available() -> bool:
    """True when JAX's default backend is a GPU."""
    return jax.default_backend() == "gpu"


def device_peak_bytes(fn: Callable, *args) -> dict:
    """Run ``fn(*args)`` once on the GPU and read the allocator's statistics.

    ``peak_bytes_in_use`` is a high-water mark since the process started (JAX offers no reset),
    so run the largest configuration last, or one configuration per process.

    Returns:
        dict with ``peak_bytes`` (allocator high-water mark, bytes), ``bytes_in_use_before``
        (bytes held before the call) and ``source``.

    Raises:
        RuntimeError: the default backend is not a GPU.

    Source: ``jax.Device.memory_stats()`` (PJRT allocator statistics).
    """
    if not gpu_available():
        raise RuntimeError(f"device_peak_bytes needs a GPU backend; default backend is {jax.default_backend()!r}")
    device = jax.devices()[0]
    before = int(device.memory_stats().get("bytes_in_use", 0))
    jax.block_until_ready(fn(*args))
    stats = device.memory_stats()
    return {
        "peak_bytes": int(stats["peak_bytes_in_use"]),
        "bytes_in_use_before": before,
        "source": f"jax.Device.memory_stats()['peak_bytes_in_use'] ({device.device_kind})",
    }
