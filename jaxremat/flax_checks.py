"""Checks of a stacked Flax block before it runs as a stack: layer axis, carry, written state.

A stack's every variable carries a leading layer axis N. Handed a block that is *not* stacked,
the layer axis is read from the first axis of the block's own variables: square layers then run
silently as N "layers" made of one kernel's rows (a wrong result), other shapes fail deep inside
the scan with a broadcasting error. Two checks turn both into one clear error:

* declared shapes (NNX): Flax layers declare their per-layer variable shapes (``nnx.Linear``:
  ``kernel (in_features, out_features)``, ``nnx.Conv``, ``nnx.Embed``, the norms); a variable of
  exactly that shape has no layer axis. Linen: ``block.init`` gives each variable's per-layer
  shape (traced with ``jax.eval_shape``, nothing computed); a leaf of exactly that shape has none.
* one layer traced first (NNX): when layer 0 cannot be traced on its slice of the variables but
  the stack called as one block can, the stack is one block, unstacked.

Source: ``flax.nnx`` module attributes (flax 0.12); ``jax.eval_shape``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

BUILD_HINT = ("build the stack with nnx.vmap over the block constructor, e.g. "
              "nnx.split_rngs(splits=N)(nnx.vmap(make_block, in_axes=(0,), out_axes=0))(rngs), "
              "so that every variable (parameters and RNG keys/counters) has a leading axis N")
LINEN_HINT = ("stack each leaf on a leading layer axis N (linen_init_stack(block, key, x, N), or "
              "nn.scan/nn.vmap with variable_axes={'params': 0})")


class BlockContractError(ValueError):
    """A layer of the stack broke what a stacked call needs of it (it changed the carry's shapes or
    dtypes, or wrote a variable); raised as it is, never read as a sign of an unstacked stack."""


def check_stacked(tree: Any, what: str, hint: str) -> int:
    """The common leading axis N of every array leaf of ``tree``; ValueError naming the odd ones."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    if not flat:
        raise ValueError(f"{what} has no arrays; {hint}")
    lead = {jax.tree_util.keystr(p): (a.shape[0] if getattr(a, "ndim", 0) >= 1 else None) for p, a in flat}
    sizes = [s for s in lead.values() if s is not None]
    if len(set(sizes)) == 1 and None not in lead.values():
        return sizes[0]
    n = max(set(sizes), key=sizes.count) if sizes else None
    odd = {k: (jnp.shape(a)) for (p, a), k in zip(flat, lead) if lead[k] != n}
    raise ValueError(f"{what} is not stacked on one leading layer axis: most leaves have leading size {n}, "
                     f"but these do not (path: shape): {odd}; {hint}")


def check_carry(before: Any, after: Any) -> None:
    """:class:`BlockContractError` when a block changed the carry's structure, shapes or dtypes."""
    sig = lambda t: jax.tree.map(lambda a: (tuple(jnp.shape(a)), str(getattr(a, "dtype", type(a).__name__))), t)
    if jax.tree.structure(before) != jax.tree.structure(after) or sig(before) != sig(after):
        raise BlockContractError(f"the block must return a carry of the same structure, shapes and dtypes as its input; "
                         f"got {sig(before)} -> {sig(after)} (a stack of blocks threads one carry through "
                         "every layer: project to another shape before or after the stack)")


def _declared(m: nnx.Module) -> dict[str, tuple]:
    """Per-layer shapes a Flax NNX layer declares for its variables (empty for other modules)."""
    if isinstance(m, nnx.Linear):
        return {"kernel": (m.in_features, m.out_features), "bias": (m.out_features,)}
    if isinstance(m, nnx.Embed):
        return {"embedding": (m.num_embeddings, m.features)}
    if isinstance(m, (nnx.LayerNorm, nnx.RMSNorm, nnx.GroupNorm, nnx.BatchNorm)):
        return {k: (m.num_features,) for k in ("scale", "bias", "mean", "var")}
    if isinstance(m, nnx.Conv) and isinstance(m.kernel_size, tuple):
        return {"kernel": m.kernel_size + (m.in_features // m.feature_group_count, m.out_features),
                "bias": (m.out_features,)}
    return {}


def _unstacked_error(found: str, hint: str) -> ValueError:
    return ValueError(f"the stack is not stacked on one leading layer axis (it is one block): {found}, so its "
                      f"first axis would be read as the layers (a square layer would run as rows of one kernel); {hint}")


def check_declared_shapes(stack: nnx.Module) -> None:
    """ValueError when a Flax layer in ``stack`` holds a variable of its declared one-layer shape."""
    for path, module in nnx.iter_modules(stack):
        for name, shape in _declared(module).items():
            var = getattr(module, name, None)
            if not isinstance(var, nnx.Variable):
                continue
            actual = tuple(jnp.shape(var.get_value()))
            if actual == tuple(shape):
                where = ".".join(map(str, (*path, name)))
                raise _unstacked_error(f"{where} has shape {actual}, the shape {type(module).__name__} declares for "
                                       "one layer", BUILD_HINT)


def check_one_layer(layer_fn: Callable[[Any], Any], whole_fn: Callable[[Any], Any], state: Any, carry: Any) -> None:
    """Trace layer 0 (``layer_fn``); if it fails while the stack as one block works, say it is unstacked.

    Args:
        layer_fn: ``state -> carry``, layer 0 on its slice of ``state`` (traced with ``jax.eval_shape``).
        whole_fn: ``state -> carry``, the stack's module as one block, unsliced.
        state: the stack's state (arrays or tracers), passed to both.
        carry: the carry entering layer 0.

    Raises:
        BlockContractError: layer 0 changed the carry or wrote a variable (re-raised as it is).
        ValueError: the stack looks unstacked (chained to the layer's own error).
        Exception: the layer's own error, re-raised, when the stack does not run as one block either.
    """
    try:
        jax.eval_shape(layer_fn, state)
    except BlockContractError:  # the layer ran on its slice and broke the contract: say that, as it is
        raise
    except Exception as exc:
        try:
            out = jax.eval_shape(whole_fn, state)
            check_carry(carry, out)
        except Exception:
            raise exc from None
        raise _unstacked_error(f"one layer cut from it fails ({type(exc).__name__}: {str(exc)[:160]}) while the "
                               "whole stack runs as a single block", BUILD_HINT) from exc


def check_linen_shapes(variables: Any, expected: Any) -> None:
    """ValueError when a Linen leaf has the per-layer shape ``block.init`` gives (no layer axis).

    Args:
        variables: the stacked variables as given.
        expected: ``jax.eval_shape`` of ``block.init`` on one layer (same collections or more).
    """
    want = {jax.tree_util.keystr(p): tuple(a.shape) for p, a in jax.tree_util.tree_flatten_with_path(expected)[0]}
    for p, a in jax.tree_util.tree_flatten_with_path(variables)[0]:
        key, shape = jax.tree_util.keystr(p), tuple(jnp.shape(a))
        if key in want and shape == want[key]:
            raise _unstacked_error(f"variables{key} has shape {shape}, the shape block.init gives one layer",
                                   LINEN_HINT)
