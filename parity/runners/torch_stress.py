"""The PyTorch halves of the stress variants: the frozen GPT and the user-style block stack.

What each variant is, and how it is checked, is framework-neutral and lives with the case set
(:mod:`parity.cases.stress_frozen`, :mod:`parity.cases.stress_user`); this module runs them in PyTorch.

* frozen: ``requires_grad_(False)`` on the embeddings and the first half of the blocks (frozen
  parameters get no ``.grad``; AdamW skips them). With the embeddings frozen, no block input
  requires a gradient: the non-reentrant checkpoint keeps the gradients of the parameters inside
  the first checkpointed segment, where the reentrant variant would drop them (PyTorch docs,
  ``torch.utils.checkpoint``).
* user stack: ``nn.BatchNorm1d`` (momentum 0.1, Flax's 0.9) and a step counter buffer, run by
  :func:`torchref.render.forward_blocks`; the CPU generator is restored for the recompute
  (``preserve_rng_state=True``); plain SGD.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as tnn
import torch.nn.functional as F

from jaxremat.spec.plan import RematPlan
from torchref.model import GPT
from torchref.render import forward_blocks, model_loss

from parity.cases.stress_frozen import frozen_layers
from parity.cases.stress_user import UserStack
from parity.inputs.train import AdamWConfig
from parity.runners.result import RunResult
from parity.runners.torch_runner import adamw, token_tensor


def run_frozen(cfg, params, tokens, plan: RematPlan, hparams: AdamWConfig) -> RunResult:
    """Loss, gradients and trained weights of the frozen GPT in PyTorch (``requires_grad_(False)``).

    Returns:
        :class:`parity.runners.result.RunResult` with ``loss``, ``grads`` (zeros where frozen),
        ``trained``, ``mode`` (``"eager"``) and ``frozen_grads_none`` (every frozen parameter got
        no ``.grad``); ``memory`` None: not measured.
    """
    def build():
        m = GPT.from_params(cfg, params)
        m.wte.requires_grad_(False), m.wpe.requires_grad_(False)
        for b in list(m.blocks)[:frozen_layers(cfg)]:
            b.requires_grad_(False)
        return m

    toks = token_tensor(tokens)
    model = build()
    loss = model_loss(model, toks, plan)
    loss.backward()
    frozen = [p for p in model.parameters() if not p.requires_grad]
    grads = model.to_params(grads=True, missing_grad="zeros")
    loss_np = loss.detach().numpy().copy()
    frozen_grads_none = all(p.grad is None for p in frozen) and bool(frozen)
    model = build()
    opt = adamw(model.parameters(), hparams)
    for _ in range(hparams.steps):
        opt.zero_grad(set_to_none=True)
        model_loss(model, toks, plan).backward()
        opt.step()
    return RunResult(loss=loss_np, grads=grads, trained=model.to_params(), mode="eager",
                     frozen_grads_none=frozen_grads_none)


class UserBlock(tnn.Module):
    """The PyTorch mirror of the user stack's JAX block (``nn.BatchNorm1d``, momentum 0.1 = Flax's 0.9)."""

    def __init__(self, stack: UserStack):
        super().__init__()
        self.stack = stack
        self.bn = tnn.BatchNorm1d(stack.d_model, eps=1e-5, momentum=0.1) if stack.running_stats else None
        self.fc1 = tnn.Linear(stack.d_model, stack.d_ff)
        self.fc2 = tnn.Linear(stack.d_ff, stack.d_model)
        if stack.running_stats:
            self.register_buffer("count", torch.zeros((), dtype=torch.float32))

    def forward(self, x):  # (B, T, D) -> (B, T, D)
        B, T, D = x.shape
        h = x
        if self.bn is not None:
            h = self.bn(x.reshape(B * T, D)).reshape(B, T, D)
            self.count.add_(1.0)
        m = F.gelu(F.linear(h, self.fc1.weight, self.fc1.bias), approximate="tanh") @ self.fc2.weight.t()
        if self.stack.noise:
            m = m * (1.0 + self.stack.noise * torch.randn_like(m))
        m = m + self.fc2.bias
        if self.stack.dropout:
            m = F.dropout(m, self.stack.dropout, training=True)
        return x + m


def run_user_stack(stack: UserStack, plan: RematPlan) -> RunResult:
    """Train the stack in PyTorch under ``plan``; see :mod:`parity.cases.stress_user`.

    Returns:
        :class:`parity.runners.result.RunResult` as the JAX half's, ``mode`` ``"eager"``; its
        ``state`` adds ``num_batches_tracked`` (N,) int64 (BatchNorm's own counter).
    """
    with torch.random.fork_rng(devices=[]):
        blocks = torch.nn.ModuleList(UserBlock(stack) for _ in range(stack.n_layer))
    p = stack.params()
    with torch.no_grad():
        for i, b in enumerate(blocks):
            if b.bn is not None:
                b.bn.weight.copy_(torch.from_numpy(p["bn.scale"][i])), b.bn.bias.copy_(torch.from_numpy(p["bn.bias"][i]))
            b.fc1.weight.copy_(torch.from_numpy(p["w1"][i].T.copy())), b.fc1.bias.copy_(torch.from_numpy(p["b1"][i]))
            b.fc2.weight.copy_(torch.from_numpy(p["w2"][i].T.copy())), b.fc2.bias.copy_(torch.from_numpy(p["b2"][i]))
    opt = torch.optim.SGD(blocks.parameters(), lr=stack.lr)
    out = {}
    for i, x in enumerate(stack.batches()):
        torch.manual_seed(stack.seed * 1000 + i)
        opt.zero_grad(set_to_none=True)
        loss = forward_blocks(blocks, torch.from_numpy(x), plan).square().mean()
        loss.backward()
        if i == 0:
            out["loss"], out["grads"] = loss.detach().numpy().copy(), _canonical(blocks, stack, grads=True)
        opt.step()
    state = {} if not stack.running_stats else {
        "running_mean": np.stack([b.bn.running_mean.numpy() for b in blocks]),
        "running_var": np.stack([b.bn.running_var.numpy() for b in blocks]),
        "count": np.stack([b.count.numpy() for b in blocks]),
        "num_batches_tracked": np.stack([b.bn.num_batches_tracked.numpy() for b in blocks])}
    return RunResult(loss=out["loss"], grads=out["grads"], trained=_canonical(blocks, stack, grads=False),
                     mode="eager", state=state)


def _canonical(blocks, stack: UserStack, *, grads: bool) -> dict[str, np.ndarray]:
    """The torch weights (or gradients) in the canonical layout of :meth:`parity.cases.stress_user.UserStack.params`."""
    def get(t, transpose=False):
        v = (t.grad if grads else t).detach().numpy()
        return np.ascontiguousarray(v.T if transpose else v).copy()

    out = {"w1": np.stack([get(b.fc1.weight, True) for b in blocks]), "b1": np.stack([get(b.fc1.bias) for b in blocks]),
           "w2": np.stack([get(b.fc2.weight, True) for b in blocks]), "b2": np.stack([get(b.fc2.bias) for b in blocks])}
    if stack.running_stats:
        out["bn.scale"] = np.stack([get(b.bn.weight) for b in blocks])
        out["bn.bias"] = np.stack([get(b.bn.bias) for b in blocks])
    return out
