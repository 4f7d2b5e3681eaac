"""What the doctor differentiates: a user's loss or train step turned into one program of flat arguments.

* :func:`flatten_modules`: ``flax.nnx`` modules among the arguments become their state
  (``nnx.split``) and are merged back inside (``nnx.merge``), so the program takes pytrees of arrays.
* :func:`program_kind`: ``fn`` is a **loss** when it returns a float scalar (or ``(scalar, aux)``)
  and differentiates nothing itself; else a **train step**. Whether ``fn`` differentiates itself is
  seen while it is traced once (``jax.eval_shape``): a backward pass (JAX's transposition,
  ``jax._src.interpreters.ad.backward_pass3``, watched for that trace) or a remat region
  differentiated in that trace belongs to a ``jax.grad`` inside ``fn`` (an NNX step that returns
  only its loss is a step).
* :class:`Program`: the program's arguments as one flat list of leaves. A loss is differentiated
  in the float leaves of ``args[argnums]`` (integer leaves, PRNG keys, counters stay constants,
  as ``nnx.grad`` over ``nnx.Param`` s does); :meth:`Program.value_and_grad` is the program the
  doctor traces and compiles, :meth:`Program.loss_of` the loss of those leaves alone.
"""

from __future__ import annotations

# Deferred imports: flax.nnx loads only when an argument is an NNX module.

import contextlib
import dataclasses
import sys
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from jax._src.interpreters import ad as _ad

from .regions import recording

__all__ = ["Program", "flatten_modules", "make_program", "program_kind"]


def flatten_modules(fn: Callable, args: tuple) -> tuple[Callable, Callable, tuple]:
    """``(loss_fn, step_fn, args')``: NNX modules among ``args`` replaced by their state, merged back inside.

    ``step_fn`` also returns the modules' state after the call (``nnx.state``): an NNX train step
    updates its model in place and may return only its loss, and without its updated state as an
    output the whole backward pass would be dead code to XLA. Without NNX modules both are ``fn``.
    """
    if "flax.nnx" not in sys.modules:  # no NNX module can be among the arguments
        return fn, fn, args
    from flax import nnx

    split = [nnx.split(a) if isinstance(a, nnx.Module) else None for a in args]
    if not any(split):
        return fn, fn, args

    def merge(states):
        return [nnx.merge(s[0], state) if s else state for s, state in zip(split, states)]

    def loss_fn(*states):
        return fn(*merge(states))

    def step_fn(*states):
        merged = merge(states)
        return fn(*merged), [nnx.state(m) for s, m in zip(split, merged) if s]

    loss_fn.__name__ = step_fn.__name__ = getattr(fn, "__name__", "fn")
    return loss_fn, step_fn, tuple(s[1] if s else a for s, a in zip(split, args))


def _dtype(leaf: Any) -> Any:
    return getattr(leaf, "dtype", None) or jnp.result_type(leaf)


def _is_loss_value(value: Any) -> bool:
    return (isinstance(value, jax.ShapeDtypeStruct) and value.shape == ()
            and jnp.issubdtype(value.dtype, jnp.inexact))


@contextlib.contextmanager
def _backward_passes() -> Iterator[list]:
    """Count JAX's backward passes (transpositions) while the context is open."""
    original, count = _ad.backward_pass3, []

    def counted(*args, **kwargs):
        count.append(1)
        return original(*args, **kwargs)

    _ad.backward_pass3 = counted
    try:
        yield count
    finally:
        _ad.backward_pass3 = original


def program_kind(fn: Callable, *args) -> tuple[str, bool]:
    """``("loss", has_aux)`` or ``("step", False)`` (see the module docstring). Traces ``fn`` once."""
    with recording(stop=program_kind.__code__) as recorder, _backward_passes() as backward:
        out = jax.eval_shape(fn, *args)
    if recorder.regions or backward:
        return "step", False
    if _is_loss_value(out):
        return "loss", False
    if isinstance(out, (tuple, list)) and len(out) == 2 and _is_loss_value(out[0]):
        return "loss", True
    return "step", False


@dataclasses.dataclass(frozen=True)
class Program:
    """A loss or step over one flat list of argument leaves.

    Attributes:
        fn: the user's function (NNX modules already flattened).
        treedef: the structure of its argument tuple.
        leaves: the argument leaves (arrays or ``jax.ShapeDtypeStruct`` s).
        diff: positions in ``leaves`` a loss is differentiated in (empty for a step).
        kind: ``"loss"`` or ``"step"``.
        has_aux: the loss returns ``(loss, aux)``.
    """

    fn: Callable
    treedef: Any
    leaves: tuple
    diff: tuple[int, ...]
    kind: str
    has_aux: bool

    def call(self, *leaves):
        """``fn`` on the arguments rebuilt from ``leaves``."""
        return self.fn(*jax.tree_util.tree_unflatten(self.treedef, leaves))

    def loss_of(self, diff_leaves: list, leaves: tuple):
        """The loss with ``leaves[diff]`` replaced by ``diff_leaves``."""
        full = list(leaves)
        for i, leaf in zip(self.diff, diff_leaves):
            full[i] = leaf
        return self.call(*full)

    def value_and_grad(self, *leaves):
        """``jax.value_and_grad`` of the loss in its differentiated leaves (a step: the step itself)."""
        if self.kind == "step":
            return self.call(*leaves)
        return jax.value_and_grad(lambda d: self.loss_of(d, leaves), has_aux=self.has_aux)(
            [leaves[i] for i in self.diff])


def make_program(fn: Callable, args: tuple, argnums: tuple[int, ...], has_aux: bool | None) -> Program:
    """The :class:`Program` of ``fn(*args)`` (NNX modules among ``args`` flattened, :func:`flatten_modules`).

    Raises:
        ValueError: an argnum out of range, or a loss with no float leaf in ``args[argnums]``.
    """
    if any(not 0 <= i < len(args) for i in argnums):
        raise ValueError(f"argnums {argnums} out of range for {len(args)} arguments")
    fn, step_fn, args = flatten_modules(fn, args)
    kind, aux = program_kind(fn, *args)
    fn = step_fn if kind == "step" else fn
    leaves, treedef = jax.tree_util.tree_flatten(args)
    diff: list[int] = []
    start = 0
    for i, arg in enumerate(args):
        n = len(jax.tree_util.tree_leaves(arg))
        if i in argnums:
            diff += [j for j in range(start, start + n) if jnp.issubdtype(_dtype(leaves[j]), jnp.inexact)]
        start += n
    if kind == "loss" and not diff:
        raise ValueError(f"the loss has no float array to differentiate in arguments {argnums}")
    return Program(fn, treedef, tuple(leaves), tuple(diff) if kind == "loss" else (), kind,
                   aux if has_aux is None else has_aux)
