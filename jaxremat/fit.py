"""One call to fit a stack of layers to a memory budget, checked on the compiled program.

:func:`plan_scan` (a layer function with stacked parameters, as :func:`jaxremat.remat_scan` takes it) and
:func:`jaxremat.flax.plan_stack` (a Flax NNX stack, as :func:`jaxremat.flax.remat_stack` takes it) do
what the expert path of docs/planner.md does by hand, and check the answer where it matters (the loop:
:func:`jaxremat.spec.fit.fit_plan`):

1. the menu of one layer (:func:`jaxremat.planner.block_options`: store, or checkpoint under each policy);
2. the budget: bytes, or a percentage of ``none``'s compiled temporary bytes (``"50%"``); the memory a
   plan changes is XLA's temporary buffers of ``jit(grad(loss))`` (kept activations and the backward
   pass's working buffers; parameters and gradients are the program's arguments and outputs);
3. the least-recompute plan the planner (:func:`jaxremat.spec.planner.plan_for_budget`) predicts within
   the budget, less ``none``'s compiled offset from its prediction, compiled and measured; over the
   budget, the target is lowered by the overshoot and the planner asked again (:data:`MAX_ATTEMPTS`);
4. the plan's gradients against ``none``'s on the given input, byte for byte.

Source: the planner is Beaumont et al. 2019/2021 (Rotor)'s dynamic program over a chain
(:mod:`jaxremat.spec.planner`); the memory is ``jax.stages.Compiled.memory_analysis()``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .memory import compiled_memory
from .planner import DEFAULT_MENU, block_options
from .render import remat_scan
from .spec.fit import FittedPlan, fit_plan
from .spec.planner import Budget

__all__ = ["FittedPlan", "fit_jax", "plan_scan"]


def _abstract_layer(stacked: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), stacked)


def _n_layer(stacked: Any) -> int:
    sizes = {a.shape[0] for a in jax.tree.leaves(stacked)}
    if len(sizes) != 1:
        raise ValueError(f"stacked parameters must share one leading layer axis; got sizes {sorted(sizes)}")
    return sizes.pop()


def _bytes(tree: Any) -> int:
    return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree))


def _grad_fn(run: Callable[[Any, Any], Any], loss: Callable[[Any], Any], plan) -> Callable:
    return jax.jit(jax.grad(lambda params, x: loss(run(params, x, plan))))


def _sum(y: Any) -> jax.Array:
    return sum(jnp.sum(a) for a in jax.tree.leaves(y))


def _same_bytes(a: Any, b: Any) -> bool:
    return all(np.asarray(p).tobytes() == np.asarray(q).tobytes() for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def fit_jax(run: Callable[[Any, Any, Any], Any], layer: Callable[[Any, Any], Any], stacked: Any, x: Any,
            budget, policies: Sequence, loss: Callable[[Any], Any] | None) -> FittedPlan:
    """:func:`fit_plan` on a JAX stack: ``run(stacked, x, plan) -> y``, ``layer(one_layer_params, x) -> x``."""
    loss = loss or _sum
    n = _n_layer(stacked)
    menu = block_options(layer, _abstract_layer(stacked), x, policies)
    grads = {}

    def measure(plan) -> int:
        return compiled_memory(_grad_fn(run, loss, plan), stacked, x)["temp_bytes"]

    def bitwise(plan) -> bool:
        for p in ("none", plan):
            grads[str(p)] = grads.get(str(p)) or _grad_fn(run, loss, p)(stacked, x)
        return _same_bytes(grads["none"], grads[str(plan)])

    return fit_plan(menu, n, _bytes(x), budget, measure, bitwise)


def plan_scan(block_fn: Callable[[Any, Any, Any], Any], stacked_params: Any, x: Any, budget: "int | str | Budget",
              *, policies: Sequence = DEFAULT_MENU, loss: Callable[[Any], Any] | None = None) -> FittedPlan:
    """The least-recompute plan for ``remat_scan(block_fn, stacked_params, x, plan)`` within ``budget``, checked.

    Args:
        block_fn: ``(layer_params, carry, layer_xs) -> carry``, as :func:`jaxremat.remat_scan` takes it
            (called with ``layer_xs=None``).
        stacked_params: the parameters, every leaf with a leading layer axis N (arrays: the gradients are compared).
        x: the stack's input (an array or pytree of arrays, e.g. (B, T, D) float32).
        budget: bytes (int), ``"2GiB"``, or ``"50%"`` of ``none``'s compiled temporary bytes.
        policies: the checkpoint options of the menu (:data:`jaxremat.planner.DEFAULT_MENU`).
        loss: ``y -> scalar`` the gradients are taken of (default: the sum of ``y``).

    Returns:
        :class:`FittedPlan`: ``plan`` within the budget on the compiled program, and whether its gradients
        are bitwise equal to ``none``'s.

    Raises:
        ValueError: a bad budget or policy, parameters without a common layer axis, or no plan measured
            within the budget (the message names the least reached and its plan).
    """
    def run(params, h, plan):
        return remat_scan(block_fn, params, h, plan)

    return fit_jax(run, lambda p, h: block_fn(p, h, None), stacked_params, x, budget, policies, loss)
