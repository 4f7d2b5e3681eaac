"""Render a neutral :class:`jaxremat.spec.policies.Policy` as a ``jax.checkpoint`` policy.

The names are the ``checkpoint_name`` tags of the model (:mod:`jaxremat.spec.names`); the op
classes map to JAX's own policies. Offload goes from ``"device"`` to ``"pinned_host"`` memory
(on a CPU backend both are host memory, and the same code path runs).

Not used: ``jax.checkpoint_policies.save_anything_except_these_names``, which in current JAX
releases saves everything (it ignores the names); no policy here depends on it.

Source: ``jax.checkpoint_policies`` (``jax/_src/ad_checkpoint.py``).
"""

from __future__ import annotations

from typing import Callable

import jax

from .spec.policies import Policy, parse_policy

cp = jax.checkpoint_policies

OFFLOAD_SRC = "device"
OFFLOAD_DST = "pinned_host"


def policy_name(policy: "str | Policy | Callable") -> str:
    """A policy's name for messages: a name as given, a spec policy's ``name``, a callable's ``__name__``."""
    if isinstance(policy, str):
        return policy
    return getattr(policy, "name", None) or getattr(policy, "__name__", None) or repr(policy)


def to_jax_policy(policy: "str | Policy | Callable | None") -> "Callable | None":
    """A ``jax.checkpoint`` policy for a spec policy, a policy name, or a raw JAX policy.

    Args:
        policy: None or ``"save_nothing"`` (keep nothing inside a checkpointed segment), a name
            accepted by :func:`jaxremat.spec.policies.parse_policy` (MaxText aliases included), a
            :class:`~jaxremat.spec.policies.Policy`, or a callable already usable as a
            ``jax.checkpoint`` policy (returned unchanged).

    Returns:
        A callable for ``jax.checkpoint(..., policy=...)``, or None for "save nothing".

    Raises:
        ValueError: unknown policy or activation name.
    """
    if callable(policy) and not isinstance(policy, Policy):
        return policy
    p = parse_policy(policy)
    if p.save_everything:
        return cp.everything_saveable
    parts = []
    if p.save_dots == "all":
        parts.append(cp.dots_saveable)
    elif p.save_dots == "no_batch":
        parts.append(cp.dots_with_no_batch_dims_saveable)
    if p.offload_dots == "no_batch":
        parts.append(cp.offload_dot_with_no_batch_dims(OFFLOAD_SRC, OFFLOAD_DST))
    if p.offload_names:
        parts.append(cp.save_and_offload_only_these_names(
            names_which_can_be_saved=sorted(p.save_names), names_which_can_be_offloaded=sorted(p.offload_names),
            offload_src=OFFLOAD_SRC, offload_dst=OFFLOAD_DST))
    elif p.save_names:
        parts.append(cp.save_only_these_names(*sorted(p.save_names)))
    if not parts:
        return None
    out = parts[0]
    for extra in parts[1:]:
        out = cp.save_from_both_policies(out, extra)
    return out
