"""What a ``jax.checkpoint`` policy keeps, read from the policy itself and from its answers.

A policy is a callable ``policy(primitive, *avals, **params)`` answering, per operation of the
checkpointed function, ``True`` / ``Saveable`` (keep the output), ``Offloadable(src, dst)`` (keep
it in memory kind ``dst``) or ``False`` / ``Recompute``. The doctor asks three things of it:

* :func:`describe_policy`: a name for people (``save_only_these_names('mlp')``), the same for
  equal policies built twice (it is part of a region's identity across traces);
* :func:`policy_names`: the ``checkpoint_name`` tags it saves and offloads. Candidate names are
  read from the policy's fields and closure (JAX's own policies keep them there:
  ``SaveOnlyTheseNames.saveable_names`` in JAX 0.10, the closure of ``save_only_these_names`` in
  JAX 0.12, the closure of ``save_and_offload_only_these_names``, both halves of
  ``save_from_both_policies``), then each is confirmed by asking the policy about
  a ``name`` operation carrying it, so that ``save_any_names_but_these('x')`` does not count
  ``'x'`` as kept. A policy that hides its names elsewhere (a set literal inside a lambda) yields none;
* :func:`region_answers`: its answers over every operation of a region (sub-programs included).

Source: ``jax.checkpoint_policies`` (``jax/_src/ad_checkpoint.py``, jax 0.10.2 and 0.12.0.1), the ``Offloadable``
answer (``jax._src.interpreters.partial_eval``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Iterator

import jax
import numpy as np
from jax.extend.core.primitives import name_p

from ..tags import ask_policy, sub_jaxprs, tag_name

__all__ = ["HOST_MEMORY_KIND", "RegionAnswers", "describe_policy", "policy_names", "region_answers",
           "region_eqns", "region_tags"]

HOST_MEMORY_KIND = "pinned_host"
"""The one offload destination JAX 0.10.2 places in host memory (``jax._src.core.mem_kind_to_space``
maps every other kind, ``"unpinned_host"`` included, to device memory)."""

_MAX_DEPTH = 4
_PROBE_AVAL = jax.core.ShapedArray((1,), np.float32)


def _parts(policy: Any) -> dict[str, Any]:
    """A policy's fields: dataclass fields, ``functools.partial`` arguments, closure variables."""
    parts: dict[str, Any] = {}
    if dataclasses.is_dataclass(policy) and not isinstance(policy, type):
        parts.update({f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)})
    if isinstance(policy, functools.partial):
        parts.update({f"arg{i}": a for i, a in enumerate(policy.args)}, **policy.keywords, func=policy.func)
    if inspect.isfunction(policy) and policy.__closure__:
        try:
            parts.update(inspect.getclosurevars(policy).nonlocals)
        except (ValueError, TypeError):  # a closure cell not yet filled
            pass
    return parts


def _jax_helper(policy: Any) -> str | None:
    """The ``jax.checkpoint_policies`` helper whose inner function ``policy`` is (JAX 0.12 builds
    ``save_only_these_names`` and ``save_any_names_but_these`` as closures, JAX 0.10 as classes)."""
    qualname = getattr(policy, "__qualname__", "")
    if inspect.isfunction(policy) and policy.__module__ == "jax._src.ad_checkpoint" and ".<locals>." in qualname:
        return qualname.split(".<locals>.")[0]
    return None


def _is_names(value: Any) -> bool:
    return (isinstance(value, (set, frozenset, tuple, list)) and len(value) > 0
            and all(isinstance(s, str) for s in value))


def describe_policy(policy: Callable | None, depth: int = 0) -> str:
    """A short, stable name of a ``jax.checkpoint`` policy: the JAX helper that built it and its arguments.

    Args:
        policy: a policy callable, or None (``jax.checkpoint`` without a policy keeps nothing).

    Returns:
        e.g. ``"nothing_saveable"``, ``"dots_with_no_batch_dims_saveable"``,
        ``"save_only_these_names('mlp')"``,
        ``"save_and_offload_only_these_names(save=(), offload=('mlp',) to 'pinned_host')"``,
        ``"save_from_both_policies(dots_saveable, save_only_these_names('x'))"``; else the
        callable's qualified name.
    """
    if policy is None:
        return "nothing_saveable"
    cls = type(policy).__name__
    if cls == "DotsSaveable":
        return "dots_with_no_batch_dims_saveable" if policy.only_if_no_batch_dims else "dots_saveable"
    parts = _parts(policy)
    helper = _jax_helper(policy)
    if cls == "SaveOnlyTheseNames" or helper == "save_only_these_names":
        names = policy.saveable_names if cls == "SaveOnlyTheseNames" else parts["names_which_can_be_saved"]
        return f"save_only_these_names({', '.join(map(repr, sorted(names)))})"
    if cls == "SaveAnyNamesButThese" or helper == "save_any_names_but_these":
        names = policy.names if cls == "SaveAnyNamesButThese" else parts["names_not_to_save"]
        return f"save_any_names_but_these({', '.join(map(repr, sorted(names)))})"
    if depth < _MAX_DEPTH and {"policy_1", "policy_2"} <= set(parts):
        return (f"save_from_both_policies({describe_policy(parts['policy_1'], depth + 1)}, "
                f"{describe_policy(parts['policy_2'], depth + 1)})")
    if "names_which_can_be_offloaded" in parts:
        save, off = sorted(parts["names_which_can_be_saved"]), sorted(parts["names_which_can_be_offloaded"])
        return (f"save_and_offload_only_these_names(save={tuple(save)}, offload={tuple(off)} "
                f"to {parts.get('offload_dst')!r})")
    if "offload_dst" in parts:
        return f"offload_dot_with_no_batch_dims(to {parts['offload_dst']!r})"
    if dataclasses.is_dataclass(policy):
        return repr(policy)
    return getattr(policy, "__qualname__", None) or getattr(policy, "__name__", None) or repr(policy)


def _candidates(policy: Any, depth: int = 0) -> set[str]:
    if depth > _MAX_DEPTH:
        return set()
    out: set[str] = set()
    for value in _parts(policy).values():
        if _is_names(value):
            out |= set(value)
        elif callable(value) and not isinstance(value, type):
            out |= _candidates(value, depth + 1)
    return out


def _kind(answer: Any) -> str:
    """``"save"``, ``"offload"`` or ``"recompute"`` for a policy's answer."""
    if isinstance(answer, bool):
        return "save" if answer else "recompute"
    name = type(answer).__name__
    return {"SaveableType": "save", "Offloadable": "offload"}.get(name, "recompute")


def policy_names(policy: Callable | None) -> tuple[frozenset[str], frozenset[str]]:
    """``(saved, offloaded)``: the ``checkpoint_name`` tags ``policy`` keeps on device and offloads.

    A name counts when it appears in the policy's fields or closure (see the module docstring) and
    the policy, asked about a ``name`` operation carrying it, answers save or offload. A policy
    that raises on that question (``save_from_both_policies`` joining an offloading policy) keeps
    the names its fields give.
    """
    if policy is None:
        return frozenset(), frozenset()
    saved, offloaded = set(), set()
    for name in _candidates(policy):
        try:
            kind = _kind(policy(name_p, _PROBE_AVAL, name=name))
        except Exception:  # a policy that cannot answer for a lone name: trust its fields
            kind = "save"
        if kind == "save":
            saved.add(name)
        elif kind == "offload":
            offloaded.add(name)
    return frozenset(saved), frozenset(offloaded)


def region_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and of the sub-programs in its equations (scan, cond, jit, remat)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in sub_jaxprs(eqn):
            yield from region_eqns(sub)


def region_tags(jaxpr: Any) -> frozenset[str]:
    """The ``checkpoint_name`` tags carried by operations of a region (at any depth)."""
    return frozenset(tag_name(e) for e in region_eqns(jaxpr) if tag_name(e) is not None)


@dataclasses.dataclass(frozen=True)
class RegionAnswers:
    """A policy's answers over one region's operations.

    Attributes:
        kept_ops: operations it keeps (saves or offloads).
        offload_dsts: the memory kinds of its ``Offloadable`` answers.
        dots: matrix products (``dot_general``) in the region.
        batched_dots: those with batch dimensions.
    """

    kept_ops: int
    offload_dsts: frozenset[str]
    dots: int
    batched_dots: int


def region_answers(policy: Callable | None, jaxpr: Any) -> RegionAnswers:
    """Ask ``policy`` about every operation of a region (as ``jax.checkpoint`` would; see the module docstring)."""
    kept, dsts, dots, batched = 0, set(), 0, 0
    for eqn in region_eqns(jaxpr):
        if eqn.primitive.name == "dot_general":
            (_, _), (lhs_b, rhs_b) = eqn.params["dimension_numbers"]
            dots, batched = dots + 1, batched + bool(lhs_b or rhs_b)
        if policy is None:
            continue
        try:
            answer = ask_policy(policy, eqn)
        except Exception:  # a policy that cannot judge this operation does not keep it
            continue
        kind = _kind(answer)
        kept += kind != "recompute"
        if kind == "offload":
            dsts.add(str(answer.dst))
    return RegionAnswers(kept, frozenset(dsts), dots, batched)
