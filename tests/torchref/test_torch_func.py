"""Per-sample gradients with ``torch.func`` over ``forward_blocks``, written as users write them.

torch.func's transforms cannot run non-reentrant checkpoint (its saved-tensor hooks); every plan
that checkpoints is refused with one line saying why and what to use, ``none`` runs, and the
alternatives the message names give the same per-sample gradients.
"""

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.func import functional_call, grad, jvp, vmap

import torchref

N, B, D = 3, 4, 6
PLANS = ["full", "sqrt", "every_k(2)", "nested(sqrt,sqrt)", "full+save_dots", "plan(2+save_dots,1)"]


def _blocks() -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(nn.Sequential(nn.Linear(D, D), nn.Tanh()) for _ in range(N))


def _data():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(B, D, generator=gen), torch.randn(B, D, generator=gen)


def _per_sample_grads(blocks, plan):
    params = {k: v.detach() for k, v in blocks.named_parameters()}

    def loss(p, x, y):  # one sample: x, y of shape (D,)
        out = torchref.forward_blocks([lambda h, i=i: functional_call(blocks[i], _sub(p, i), (h,)) for i in range(N)],
                                      x[None], plan)
        return ((out - y[None]) ** 2).sum()

    x, y = _data()
    return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)


def _sub(p, i):
    return {k.split(".", 1)[1]: v for k, v in p.items() if k.startswith(f"{i}.")}


@pytest.mark.parametrize("plan", PLANS)
def test_per_sample_grads_under_a_checkpointing_plan_are_refused_with_what_to_use(plan):
    with pytest.raises(RuntimeError, match=r"checkpoints segments with torch\.utils\.checkpoint.*torch\.func\.grad"
                                           r".*schedule 'none'.*loop over the samples.*jaxremat\.remat_scan"):
        _per_sample_grads(_blocks(), plan)


def test_per_sample_grads_the_two_named_alternatives_agree():
    # torch.func under 'none', and a loop over the samples under a remat plan
    blocks = _blocks()
    by_func = _per_sample_grads(blocks, "none")
    x, y = _data()
    for i in range(B):
        blocks.zero_grad()
        ((torchref.forward_blocks(blocks, x[i:i + 1], "sqrt") - y[i:i + 1]) ** 2).sum().backward()
        for name, p in blocks.named_parameters():
            np.testing.assert_allclose(p.grad.numpy(), by_func[name][i].numpy(), rtol=1e-5, atol=1e-6)


def test_vmap_with_autograd_is_refused_and_vmap_under_no_grad_runs():
    blocks = _blocks()
    x, _ = _data()
    with pytest.raises(RuntimeError, match=r"under torch\.func\.vmap with autograd on.*torch\.no_grad\(\)"):
        vmap(lambda h: torchref.forward_blocks(blocks, h, "full"))(x[:, None])
    with torch.no_grad():
        got = vmap(lambda h: torchref.forward_blocks(blocks, h, "full"))(x[:, None])
        want = torchref.forward_blocks(blocks, x, "none")
    np.testing.assert_allclose(got[:, 0].numpy(), want.numpy(), rtol=1e-6, atol=0)


def test_jvp_runs_under_a_checkpointing_plan():
    blocks = _blocks()
    x, t = _data()
    outs = {plan: jvp(lambda h: torchref.forward_blocks(blocks, h, plan), (x,), (t,)) for plan in ("none", "full")}
    for a, b in zip(outs["full"], outs["none"]):
        assert torch.equal(a, b)
