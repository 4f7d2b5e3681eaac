"""torchref.lint: a policy that keeps nothing it names in the blocks it runs warns
(RematPolicyWarning), in the forward pass that shows it; the model's own blocks never warn."""

import warnings

import pytest
import torch
import torch.nn as nn

from jaxremat.spec import full
from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.plan import parse_plan
from jaxremat.spec.policies import POLICIES
from torchref.lint import RematPolicyWarning
from torchref.model import GPT
from torchref.names import activation
from torchref.policies import SelectiveCheckpoint
from torchref.render import forward_blocks, model_loss

D = 8


class MLPBlock(nn.Module):
    """A user block without activation regions: ``x + W2 gelu(W1 x)``; ``tag`` marks its hidden layer."""

    def __init__(self, tag: bool = False):
        super().__init__()
        self.fc1, self.fc2, self.tag = nn.Linear(D, 4 * D), nn.Linear(4 * D, D), tag

    def forward(self, x):
        if self.tag:
            with activation("mlp_hidden"):
                h = self.fc1(x)
        else:
            h = self.fc1(x)
        return x + self.fc2(torch.nn.functional.gelu(h))


class ScaleBlock(nn.Module):
    """No matrix product at all: ``x + tanh(x * w)``."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(D))

    def forward(self, x):
        return x + torch.tanh(x * self.w)


def _run(blocks, plan, policy=None):
    """``plan`` as schedule and policy values (plan strings are tested in test_render_args.py)."""
    x = torch.randn(4, D)
    p = parse_plan(plan)
    policy = policy if policy is not None else (None if p.policy.saves_nothing else p.policy)
    forward_blocks(blocks, x, p.schedule, policy=policy).sum().backward()


def _no_warning(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematPolicyWarning)
        fn()


@pytest.mark.parametrize("plan", ["full+save_qkv_proj", "every_k(2)+attention_only", "full+save_names(mlp_act)",
                                  "full+offload_names(mlp_hidden)"])
def test_name_policy_on_an_untagged_block_warns(plan):
    with pytest.warns(RematPolicyWarning, match=r"marks no value with th.*keeps nothing.*torchref.names.activation"):
        _run([MLPBlock() for _ in range(3)], plan)


def test_partly_tagged_block_warns_for_the_missing_names_only():
    with pytest.warns(RematPolicyWarning, match=r"keeps mlp_act, mlp_norm, but .*those names keep nothing") as rec:
        _run([MLPBlock(tag=True) for _ in range(3)], "full+attention_only")
    assert "mlp_hidden" not in str(rec[0].message).split("but")[0].split("keeps", 1)[1]


def test_tagged_block_with_its_names_does_not_warn():
    _no_warning(lambda: _run([MLPBlock(tag=True) for _ in range(3)], "full+save_names(mlp_hidden)"))


@pytest.mark.parametrize("plan", ["full+save_dots", "sqrt+save_dots_no_batch", "full+minimal"])
def test_dot_policy_on_a_block_without_products_warns(plan):
    with pytest.warns(RematPolicyWarning, match=r"kept nothing: the block ran no matrix product"):
        _run([ScaleBlock() for _ in range(4)], plan)


def test_dot_policy_on_a_block_with_products_does_not_warn():
    _no_warning(lambda: _run([MLPBlock() for _ in range(3)], "full+save_dots"))


@pytest.mark.parametrize("schedule,policy", [("none", "save_dots"), ("segments(1)", "attention_only"),
                                             ("nested(sqrt,sqrt)", "save_dots"), ("none", SelectiveCheckpoint("save_dots"))])
def test_policy_on_a_schedule_that_checkpoints_nothing_warns(schedule, policy):
    """nested(sqrt,sqrt) at N=3: sqrt gives segments(2) = [2 checkpointed, 1 not]; the inner sqrt over
    2 blocks is segments(1), which checkpoints nothing, so the policy acts nowhere."""
    with pytest.warns(RematPolicyWarning, match=r"has no effect: schedule .* checkpoints no segment at n_layer=3"):
        _run([MLPBlock() for _ in range(3)], schedule, policy=policy)


def test_unknown_name_is_an_error_before_any_work():
    with pytest.raises(ValueError, match=r"unknown activation name\(s\) 'qkv'"):
        _run([MLPBlock() for _ in range(2)], "full+save_names(qkv)")


@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"save_nothing"}))
def test_model_blocks_never_warn(policy):
    cfg = TransformerConfig(vocab_size=32, n_layer=2, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
    model = GPT.from_params(cfg, init_params(cfg, seed=0))
    tokens = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(0))
    _no_warning(lambda: model_loss(model, tokens, full, policy=policy).backward())


class OutMatmul(torch.autograd.Function):
    """``tanh(x @ w)`` computed into a buffer of its own (``torch.mm(..., out=)``), as torch.compile's
    inductor kernels do (they call ``aten.addmm.out`` / ``aten.bmm.out`` inside the compiled function)."""

    @staticmethod
    def forward(ctx, x, w):
        buf = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype)
        y = torch.tanh(torch.mm(x, w, out=buf))
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, y = ctx.saved_tensors
        gz = g * (1 - y * y)
        return gz @ w.T, x.T @ gz


class OutBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D)

    def forward(self, x):
        return x + OutMatmul.apply(x, self.w)


@pytest.mark.parametrize("plan", ["full+save_dots", "sqrt+minimal"])
def test_products_run_as_out_variants_warn_that_they_ran_and_cannot_be_kept(plan):
    with pytest.warns(RematPolicyWarning) as rec:
        _run([OutBlock() for _ in range(3)], plan)
    (message,) = [str(w.message) for w in rec]
    assert "ran as out= variants (aten.mm.out x" in message and "no matrix product" not in message
    assert "backend='aot_eager'" in message and "activation_memory_budget" in message


def test_policy_under_no_grad_does_not_warn():
    # no checkpoint runs under no_grad, so the policy sees no op: nothing to warn about
    with torch.no_grad():
        _no_warning(lambda: forward_blocks([MLPBlock() for _ in range(3)], torch.randn(4, D), "full+save_dots"))


def test_blocks_compiled_with_aot_eager_keep_their_products_bitwise():
    torch.manual_seed(0)
    blocks = [torch.compile(MLPBlock(), backend="aot_eager") for _ in range(2)]
    x = torch.randn(4, D)
    grads = {}
    for plan in ("none", "full+save_dots"):
        sac = SelectiveCheckpoint("save_dots") if plan != "none" else None
        _no_warning(lambda: forward_blocks(blocks, x, parse_plan(plan).schedule, policy=sac).square().sum().backward())
        grads[plan] = [p.grad.clone() for b in blocks for p in b.parameters()]
        for b in blocks:
            b.zero_grad(set_to_none=True)
    assert [r.op for r in sac.records] == ["aten.addmm.default"] * 4  # fc1, fc2 of each block
    assert all(torch.equal(a, b) for a, b in zip(grads["full+save_dots"], grads["none"]))
