"""Activation names in PyTorch: a region marks where a named activation is produced.

The JAX model tags values with ``jax.ad_checkpoint.checkpoint_name``; PyTorch has no tag that a
selective-checkpoint policy can see, since the policy sees only ATen ops and their inputs. So the
torch model runs the one op that produces a named activation inside ``with activation(name):``,
and the policy (:mod:`torchref.policies`) asks :func:`current_name` which region the op is in.
The policy is therefore keyed on *where the op sits in the block*, never on tensor shapes (a
shape-keyed policy confuses the ``(B*T, D)`` outputs of different projections).

Rule for model code: a region holds exactly one op that computes (views such as ``view``,
``transpose``, ``t`` are free), e.g. ``torch.addmm(b, x.view(-1, D), W).view(B, T, -1)``;
it is checked for every named region of the GPT block
(``tests/torchref/test_policies.py::test_names_every_region_holds_one_computing_op``) and of the
encoder block (``tests/torchref/test_encoder.py::test_encoder_block_runs_one_computing_op_per_named_region``).

The names come from :data:`jaxremat.spec.names.ACTIVATION_NAMES`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from jaxremat.spec.names import ACTIVATION_NAMES

_state = threading.local()


def current_name() -> str | None:
    """The innermost open activation region on this thread, or None outside any region."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def activation(name: str) -> Iterator[None]:
    """Mark the ops run inside as producing the activation ``name``.

    Raises:
        ValueError: ``name`` is not in :data:`jaxremat.spec.names.ACTIVATION_NAMES`.
    """
    if name not in ACTIVATION_NAMES:
        raise ValueError(f"unknown activation name {name!r}; known names: {', '.join(ACTIVATION_NAMES)}")
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()
