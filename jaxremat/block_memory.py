"""What one transformer block keeps for its backward pass, tensor by tensor, in JAX.

The per-block view behind the policy checks (which activation names a policy keeps) and the
per-layer activation account: the same block math as :func:`jaxremat.model.block_forward`, run
once on a ``(B, T, D)`` input, its residuals listed by :func:`jaxremat.memory.saved_residuals`
(with their ``checkpoint_name`` tags). Parameters and the block input are arguments, not
activations, and are left out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .memory import ResidualRecord, saved_residuals
from .model import block_forward
from .policies import to_jax_policy
from .models.config import TransformerConfig
from .models.block import BLOCK_PARAM_NAMES
from .models.params import param_shapes
from .spec.policies import Policy


def block_residuals(cfg: TransformerConfig, batch: int, seq: int, policy: "Policy | str | None" = None,
                    *, dropout: bool = False) -> list[ResidualRecord]:
    """Residuals of one block (non-argument ones), without remat or under ``jax.checkpoint(policy)``.

    Args:
        cfg: model configuration (its dtype is used; float64 needs ``jax.enable_x64``).
        batch: B; seq: T (<= ``cfg.max_seq_len``).
        policy: None for the block without remat; otherwise a policy (name or
            :class:`~jaxremat.spec.policies.Policy`) for a checkpointed block, whose residuals are
            what the policy keeps (``save_nothing`` keeps none).
        dropout: draw dropout masks with a fixed key (only matters when ``cfg.dropout > 0``).

    Returns:
        :class:`~jaxremat.memory.ResidualRecord` s in program order, ``is_argument`` ones removed.

    Raises:
        ValueError: unknown policy or bad sizes.
    """
    if batch < 1 or not 1 <= seq <= cfg.max_seq_len:
        raise ValueError(f"need batch >= 1 and 1 <= seq <= {cfg.max_seq_len}, got batch={batch}, seq={seq}")
    dtype = jnp.dtype(cfg.dtype)
    shapes = param_shapes(cfg)
    bp = {k: jax.ShapeDtypeStruct(shapes[k][1:], dtype) for k in BLOCK_PARAM_NAMES}
    x = jax.ShapeDtypeStruct((batch, seq, cfg.d_model), dtype)
    key = jax.random.key(0) if dropout and cfg.dropout > 0 else None

    def block(p, h):
        return block_forward(p, h, cfg, dropout_key=key)

    if policy is not None:
        block = jax.checkpoint(block, policy=to_jax_policy(policy), prevent_cse=False)
    records = saved_residuals(lambda p, h: jnp.sum(block(p, h)), bp, x)
    return [r for r in records if not r.is_argument]
