"""User-style block stacks for the stress cases: state updated in the forward pass, and randomness.

A user's own block, written the way users write them, run under every schedule in both frameworks:

    y = x + drop(W2 gelu(norm(x) W1 + b1) * (1 + sigma * n) + b2)

* ``norm``: BatchNorm over the B*T rows with running statistics (``running_stats``: Flax
  ``linen.BatchNorm`` with its ``batch_stats`` collection carried through
  :func:`jaxremat.render.remat_scan` ``with_outputs=True``; ``torch.nn.BatchNorm1d`` under
  :func:`torchref.render.forward_blocks`), plus a per-layer step counter; or the identity.
* ``drop``: inverted dropout at rate ``p``; ``n``: standard normal noise, a second random op in
  the same checkpointed segment (JAX: per-layer keys as scanned ``xs``; torch: the CPU generator,
  restored by ``preserve_rng_state=True`` for the recompute).

Weights are one canonical numpy dict (matrices ``(in, out)``, layers stacked on axis 0) so both
frameworks start from the same bits. Training is plain SGD (``p - lr * g``), ``steps`` steps on
``steps`` fixed batches; every run reports the first step's loss and gradients, the trained
weights, and the state after training (running statistics and counters). Each framework runs
it with :meth:`parity.runners.framework.Framework.run_user_stack` (:mod:`parity.runners.jax_stress`,
:mod:`parity.runners.torch_stress`).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class UserStack:
    """Shape and options of a user-style stack.

    Attributes:
        n_layer: blocks N. d_model: width D. d_ff: hidden width F. batch, seq: B and T of a batch.
        running_stats: BatchNorm with running statistics and a step counter (else no norm).
        dropout: dropout rate p in [0, 1). noise: scale sigma of the multiplicative normal noise.
        steps: SGD steps. lr: SGD learning rate. seed: seed of weights, batches and randomness.
    """

    n_layer: int = 4
    d_model: int = 64
    d_ff: int = 256
    batch: int = 4
    seq: int = 32
    running_stats: bool = False
    dropout: float = 0.0
    noise: float = 0.0
    steps: int = 3
    lr: float = 0.1
    seed: int = 0

    @property
    def random(self) -> bool:
        return self.dropout > 0 or self.noise > 0

    def params(self) -> dict[str, np.ndarray]:
        """Canonical float32 weights: ``bn.scale``/``bn.bias`` (N, D, with running stats), ``w1`` (N, D, F), ``b1`` (N, F),
        ``w2`` (N, F, D), ``b2`` (N, D)."""
        rng = np.random.default_rng(self.seed)
        N, D, F = self.n_layer, self.d_model, self.d_ff
        f = lambda s, std: rng.normal(0.0, std, s).astype(np.float32)  # noqa: E731
        out = {"bn.scale": 1 + f((N, D), 0.1), "bn.bias": f((N, D), 0.1), "w1": f((N, D, F), D ** -0.5),
               "b1": f((N, F), 0.1), "w2": f((N, F, D), F ** -0.5), "b2": f((N, D), 0.1)}
        return out if self.running_stats else {k: v for k, v in out.items() if not k.startswith("bn.")}

    def batches(self) -> np.ndarray:
        """(steps, B, T, D) float32 inputs, one batch per step."""
        rng = np.random.default_rng(self.seed + 1)
        return rng.normal(size=(self.steps, self.batch, self.seq, self.d_model)).astype(np.float32)
