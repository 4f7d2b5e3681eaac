"""Training hyper-parameters shared by both frameworks (optax.adamw / torch.optim.AdamW)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class AdamWConfig:
    """Decoupled-weight-decay Adam (Loshchilov & Hutter 2019, arXiv:1711.05101).

    Mirrors ``optax.adamw(learning_rate, b1, b2, eps, weight_decay)`` and
    ``torch.optim.AdamW(lr, betas=(b1, b2), eps, weight_decay)``; weight decay applies to every
    parameter in both. ``steps`` is the number of optimizer steps of a parity training run.
    """

    learning_rate: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    steps: int = 3
