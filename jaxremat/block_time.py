"""The planner's time cost in JAX: each block option's forward and backward time, measured.

For every option of a block's menu (``store``, or checkpoint under a policy) a segment of ``L``
blocks is rendered by :func:`jaxremat.remat_scan` (``plan(L:store)``, ``plan(L+POLICY)``: remat of
a scanned segment survives XLA:CPU's compilation, of an unrolled block it does not) and compiled
twice with ``jax.jit``: its forward pass (the sum of its output) and its training step
(``value_and_grad`` of that sum with respect to the parameters and the input). Both are timed with
``jax.block_until_ready`` at two lengths, interleaved with every other option's over several rounds
(:func:`jaxremat.spec.option_time.measure_options`); the slope against the length is one block's
time, the intercept a segment's own (:mod:`jaxremat.spec.option_time`). The planner minimizes their
sum over a plan (:func:`jaxremat.spec.planner.plan_for_budget` with ``cost="time"``).

Parameters and inputs are random normal arrays (scaled by 0.02) of the block's shapes; a measurement
is kept per (model, batch, sequence, option, rounds) for the life of the process.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from .model import block_forward
from .models.block import BLOCK_PARAM_NAMES
from .models.config import TransformerConfig
from .models.params import param_shapes
from .planner import DEFAULT_MENU, gpt_chain
from .render import remat_scan
from .spec.option_time import DEFAULT_LENGTHS, DEFAULT_ROUNDS, OptionTime, measure_options, option_plan, timed_gpt_chain

__all__ = ["block_option_times", "gpt_option_times", "timed_chain"]

_MEASURED: dict = {}
"""(cfg, batch, seq, option name, rounds, lengths) -> OptionTime: the process's measurements."""


def _random(spec, key):
    return 0.02 * jax.random.normal(key, spec.shape, spec.dtype)


def _segment_calls(block: Callable, params: Any, x: Any) -> Callable[[str, int], tuple]:
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(0), len(leaves) + 1)
    h = _random(jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), keys[-1])

    def calls(name: str, length: int) -> tuple:
        stacked = jax.tree.unflatten(treedef, [_random(jax.ShapeDtypeStruct((length, *jnp.shape(a)), jnp.result_type(a)), k)
                                               for a, k in zip(leaves, keys)])
        plan = option_plan(name, length)
        loss = lambda s, c: jnp.sum(remat_scan(lambda lp, z, _: block(lp, z), s, c, plan))  # noqa: E731
        fwd = jax.jit(loss).lower(stacked, h).compile()
        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(stacked, h).compile()
        return (lambda: jax.block_until_ready(fwd(stacked, h)), lambda: jax.block_until_ready(step(stacked, h)))
    return calls


def block_option_times(block: Callable, params: Any, x: Any, names: Sequence[str], *,
                       rounds: int = DEFAULT_ROUNDS, lengths: Sequence[int] = DEFAULT_LENGTHS,
                       **kw) -> dict[str, OptionTime]:
    """Measure each option of ``names`` on segments of ``block`` (module docstring).

    Args:
        block: ``block(params, x) -> y``, y of x's shape (one layer of a stack).
        params: one layer's parameters (arrays or ``jax.ShapeDtypeStruct`` s: only shapes and dtypes are used).
        x: the block input (an array or ``jax.ShapeDtypeStruct``, e.g. (B, T, D) float32).
        names: option names: ``"store"`` or a policy name (``"save_nothing"``: plain ``jax.checkpoint``).
        rounds, lengths: as :func:`jaxremat.spec.option_time.measure_options`.
        **kw: ``min_sample_s``, ``clock`` (:func:`jaxremat.spec.option_time.time_rounds`).

    Returns:
        ``{name: OptionTime}`` (seconds per block, with spread).

    Raises:
        ValueError: an unknown policy name, or bad lengths or rounds.
    """
    return measure_options(_segment_calls(block, params, x), list(names), lengths=lengths, rounds=rounds, **kw)


def gpt_option_times(cfg: TransformerConfig, batch: int, seq: int, names: Sequence[str], *,
                     rounds: int = DEFAULT_ROUNDS, lengths: Sequence[int] = DEFAULT_LENGTHS) -> dict[str, OptionTime]:
    """:func:`block_option_times` on the GPT block (:func:`jaxremat.model.block_forward`) at (B, T);
    an option measured before in this process at the same model, shape, rounds and lengths is reused."""
    key = (cfg, int(batch), int(seq), int(rounds), tuple(lengths))
    todo = [n for n in names if key + (n,) not in _MEASURED]
    if todo:
        dtype = jnp.dtype(cfg.dtype)
        params = {k: jax.ShapeDtypeStruct(param_shapes(cfg)[k][1:], dtype) for k in BLOCK_PARAM_NAMES}
        x = jax.ShapeDtypeStruct((batch, seq, cfg.d_model), jnp.dtype(cfg.compute_dtype or cfg.dtype))
        block = lambda p, h: block_forward(p, h, cfg)  # noqa: E731
        for name, t in block_option_times(block, params, x, todo, rounds=rounds, lengths=lengths).items():
            _MEASURED[key + (name,)] = t
    return {n: _MEASURED[key + (n,)] for n in names}


def timed_chain(cfg: TransformerConfig, batch: int, seq: int, policies: Sequence = DEFAULT_MENU, *,
                rounds: int = DEFAULT_ROUNDS) -> dict:
    """:func:`jaxremat.planner.gpt_chain` with every option's measured ``step_time_s`` and
    ``segment_time_s`` set, and ``option_times`` (``{name: OptionTime}``) added: the chain
    :func:`jaxremat.spec.planner.plan_chain` plans on with ``cost="time"``.

    Raises:
        ValueError: a family other than GPT, bad sizes, or a bad menu.
    """
    return timed_gpt_chain(cfg, batch, seq, policies, rounds, gpt_chain, gpt_option_times)
