"""``checkpoint_name`` tags in a jaxpr, with JAX's ``jax_remat3`` flag off (its default) or on.

With the flag off, ``jax.ad_checkpoint.checkpoint_name(x, "mlp")`` is a ``name`` equation with
``params["name"] == "mlp"``, and ``jax.checkpoint`` a ``checkpoint`` (``remat``) equation whose
``jaxpr`` parameter holds the region. With ``jax.config.update("jax_remat3", True)`` (the coming
default; jax 0.10.2 and 0.12.0.1 have it), both are ``call_hi_primitive`` equations whose one
parameter ``_prim`` is the operation: a ``CheckpointName`` (``.params["name"]``) or a
``RematTraced`` (``.params["jaxpr"]``, ``["policy"]``). A policy is still asked about a tag as
``policy(name_p, aval, name=...)`` (``CheckpointName.remat`` in ``jax/_src/ad_checkpoint.py``).

Source: ``jax.ad_checkpoint.checkpoint_name``, ``checkpoint_name3``, ``remat3``
(``jax/_src/ad_checkpoint.py``, jax 0.10.2 and 0.12.0.1).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import jax.extend.core
from jax.extend.core.primitives import name_p

__all__ = ["ask_policy", "sub_jaxprs", "tag_aware", "tag_name"]

_REMAT3_TAGS = ("CheckpointName", "CheckpointNameFwd")


def _hi_op(eqn: Any) -> Any:
    """The operation of a ``call_hi_primitive`` equation (``jax_remat3``), else None."""
    return eqn.params.get("_prim") if eqn.primitive.name == "call_hi_primitive" else None


def _tag(prim: Any, params: dict) -> str | None:
    """The tag an equation of ``prim`` with ``params`` applies: ``name_p``'s, or ``jax_remat3``'s ``CheckpointName``."""
    if prim.name == "name":
        return params["name"]
    op = params.get("_prim") if prim.name == "call_hi_primitive" else None
    return op.params["name"] if type(op).__name__ in _REMAT3_TAGS else None


def tag_name(eqn: Any) -> str | None:
    """The ``checkpoint_name`` tag ``eqn`` applies (``"mlp"``), or None when it is not a tag."""
    return _tag(eqn.primitive, eqn.params)


def sub_jaxprs(eqn: Any) -> Iterator[Any]:
    """The jaxprs in ``eqn``'s parameters (scan, cond, jit, checkpoint bodies; ``jax_remat3``'s region)."""
    yield from jax.extend.core.jaxprs_in_params(eqn.params)
    op = _hi_op(eqn)
    inner = getattr(op, "params", {}).get("jaxpr") if op is not None else None
    if inner is not None:
        yield getattr(inner, "jaxpr", inner)


def tag_aware(policy: Callable) -> Callable:
    """``policy`` as the ``saveable`` of ``partial_eval_jaxpr_custom``, asked about a tag as ``jax.checkpoint`` asks.

    Under ``jax_remat3`` a tag is a ``call_hi_primitive`` equation, and ``partial_eval_jaxpr_custom`` hands the
    policy that primitive and its ``_prim`` parameter; a name policy (``save_only_these_names``) answers False
    to it, so the tag was never kept (jax 0.12.0.1). Asked ``policy(name_p, *avals, name=...)`` instead, as
    ``CheckpointName.remat`` asks it inside ``jax.checkpoint``.
    """
    def saveable(prim, *avals, **params):
        name = _tag(prim, params)
        return policy(prim, *avals, **params) if name is None else policy(name_p, *avals, name=name)

    return saveable


def ask_policy(policy: Callable, eqn: Any) -> Any:
    """``policy``'s answer for ``eqn``, a tag asked as ``jax.checkpoint`` asks it under either flag."""
    return tag_aware(policy)(eqn.primitive, *[v.aval for v in eqn.invars], **eqn.params)
