"""The size of the terms a loss is the difference of: the scale its rounding error is measured on.

Both training objectives of the harness end in a cross-entropy: row ``i`` of the logits ``z``
(``(R, C)``: GPT next-token logits, R = B*T, C = vocabulary; BERT contrastive similarities
``20 * cos``, R = C = pairs) contributes ``logsumexp(z_i) - z_i[t_i]``, and the loss is the mean
over rows. When the model predicts well the two terms nearly cancel: the contrastive loss of
all-MiniLM-L6-v2 on the bundled pairs is 0.02, the difference of terms near 16.5. Float32 cannot
hold a term of 16.5 closer than half its ULP (2^-20 = 9.5e-7), so neither framework can know that
loss to better than about eps * 16.5 absolute, however well it computes: an error relative to the
loss itself (0.02) is ill-conditioned. :func:`loss_term_scale` gives the mean of ``|logsumexp(z_i)|
+ |z_i[t_i]|`` (the sum of the absolute values of the summed terms, over the row count), the
quantity the cross-framework loss check (:func:`parity.checks.compare.cross_check`) divides by. It is at
least ``|loss|`` (triangle inequality), and close to it when the terms do not cancel (a GPT at
initialisation: logsumexp about log V, the target logit near 0).

The logits are taken from the PyTorch reference's own loss function (the arguments of its
``torch.nn.functional.cross_entropy`` call, recorded with a ``TorchFunctionMode``), so the scale
is that of the exact objective the frameworks are compared on.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from jaxremat.models import TransformerConfig, get_model
from jaxremat.spec import parse_schedule


class _RecordCrossEntropy(TorchFunctionMode):
    """Records the ``(input, target)`` of every ``F.cross_entropy`` call made under it."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.cross_entropy:
            self.calls.append((args[0].detach(), args[1].detach()))
        return func(*args, **kwargs)


def _loss_fn(cfg: TransformerConfig):
    spec = get_model(cfg.arch)
    return spec.load("torch_model"), spec.load("torch_loss")


def loss_term_scale(cfg: TransformerConfig, params: dict[str, np.ndarray], tokens: np.ndarray) -> float:
    """Mean over the loss's rows of ``|logsumexp(z_i)| + |z_i[t_i]|``, in float64.

    Args:
        cfg: model configuration (GPT: next-token cross-entropy; BERT: contrastive loss).
        params: canonical parameters in ``cfg.dtype``.
        tokens: the batch the loss is computed on (``(B, T+1)`` for GPT, ``(B, T)`` padded ids for BERT).

    Returns:
        The scale in the loss's units (nats), > 0.

    Raises:
        ValueError: bad parameters or tokens (as the model raises them), or the loss function made
            no single cross-entropy call (an objective this module does not know).
    """
    Model, loss_fn = _loss_fn(cfg.replace(dropout=0.0))
    model = Model.from_params(cfg.replace(dropout=0.0), params)
    tokens_t = torch.from_numpy(np.array(tokens, dtype=np.int64, order="C", copy=True))
    rec = _RecordCrossEntropy()
    with torch.no_grad(), rec:
        loss_fn(model, tokens_t, parse_schedule("none"))
    if len(rec.calls) != 1:
        raise ValueError(f"expected the loss to make one cross_entropy call, it made {len(rec.calls)}")
    logits, targets = rec.calls[0]
    z = logits.to(torch.float64).reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    terms = torch.logsumexp(z, dim=-1).abs() + z.gather(1, t[:, None]).squeeze(1).abs()
    return float(terms.mean())
