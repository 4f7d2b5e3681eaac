"""Segment plans in PyTorch: a SelectiveCheckpoint per segment, bitwise with ``none``, caching what each names."""

import warnings

import numpy as np
import pytest
import torch

from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec import RematPolicyWarning, none, parse_plan, parse_schedule
from torchref.model import GPT
from torchref.policies import SelectiveCheckpoint
from torchref.render import forward_blocks, model_loss

CFG = TransformerConfig(vocab_size=64, n_layer=5, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
TOKENS = torch.from_numpy(np.random.default_rng(0).integers(0, CFG.vocab_size, (2, CFG.max_seq_len + 1)))
PLANS = ["plan(2+save_dots,1+attention_only,2:store)", "plan(1+qkv_proj_offloaded,2*2+save_everything)",
         "plan(3+save_dots,2)+attention_only"]


def _run(cfg, schedule, policy=None):
    model = GPT.from_params(cfg, init_params(cfg, seed=1))
    torch.manual_seed(0)
    loss = model_loss(model, TOKENS, schedule, policy=policy)
    loss.backward()
    return loss.detach().numpy(), model.to_params(grads=True)


def _assert_bitwise(a, b):
    assert a[0].tobytes() == b[0].tobytes(), (a[0], b[0])
    bad = [k for k in a[1] if a[1][k].tobytes() != b[1][k].tobytes()]
    assert not bad, f"not bitwise: {bad}"


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("text", PLANS)
def test_segment_plan_bitwise_equal_to_none(text, dropout):
    cfg = CFG.replace(dropout=dropout)
    plan = parse_plan(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematPolicyWarning)  # every segment's policy matches the block
        got = _run(cfg, plan.schedule, SelectiveCheckpoint(plan.policy))
    _assert_bitwise(got, _run(cfg, none))


def test_each_segment_caches_its_own_policys_names_into_the_callers_records():
    plan = parse_plan("plan(2+save_qkv_proj,1+attention_only,2:store)")
    sac = SelectiveCheckpoint(plan.policy)
    _run(CFG, plan.schedule, sac)
    per_name = {}
    for r in sac.records:
        per_name[r.name] = per_name.get(r.name, 0) + 1
    # qkv_proj in the two layers of the first segment; attention_only's names in the third layer
    assert per_name == {"qkv_proj": 2, "mlp_norm": 1, "mlp_hidden": 1, "mlp_act": 1}
    assert sac.kept_bytes() == sum(r.bytes for r in sac.records) > 0


def test_policy_argument_is_the_default_and_a_conflict_is_refused():
    sac = SelectiveCheckpoint("save_qkv_proj")
    _run(CFG, parse_schedule("plan(2+attention_only,3)"), sac)
    assert sorted({r.name for r in sac.records}) == ["mlp_act", "mlp_hidden", "mlp_norm", "qkv_proj"]
    assert sum(r.name == "qkv_proj" for r in sac.records) == 3  # the second segment's three layers
    blocks = GPT.from_params(CFG, init_params(CFG, seed=1)).blocks
    x = torch.zeros(2, 8, 16)
    with pytest.raises(ValueError, match="forward_blocks: policy 'save_qkv_proj' was given, but every checkpointed"):
        forward_blocks(blocks, x, "plan(2+attention_only,3:store)", policy="save_qkv_proj")
    with pytest.raises(ValueError, match="sum to 4 blocks but the stack has n_layer=5"):
        forward_blocks(blocks, x, "plan(2+attention_only,2:store)")
    with pytest.raises(ValueError, match="give the policy once"):
        forward_blocks(blocks, x, "plan(2+attention_only,3)+save_dots", policy="save_qkv_proj")


def test_an_unmatched_segment_policy_warns_with_its_name():
    blocks = [torch.nn.Linear(4, 4) for _ in range(3)]
    with pytest.warns(RematPolicyWarning, match="policy 'save_qkv_proj' keeps qkv_proj"):
        forward_blocks(blocks, torch.ones(2, 4, requires_grad=True), "plan(1+save_qkv_proj,1+save_dots,1)")
