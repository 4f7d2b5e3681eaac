"""Named policies rendered as PyTorch selective checkpointing: regions, what a block keeps, gradients."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from jaxremat.spec import parse_schedule
from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec.names import ACTIVATION_NAMES
from jaxremat.spec.plan import parse_plan
from jaxremat.spec.policies import POLICIES, Policy
from parity.checks.names import expected_names
from torchref.block_memory import block_saved
from torchref.model import GPT, Block
from torchref.names import activation, current_name
from torchref.policies import SelectiveCheckpoint, is_view_op
from torchref.render import forward_blocks, model_loss

CFG = TransformerConfig(vocab_size=64, n_layer=4, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
B, T = 2, 8


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((current_name(), func))
        return func(*args, **(kwargs or {}))


def test_names_every_region_holds_one_computing_op():
    block = Block(CFG)
    x = torch.randn(B, T, CFG.d_model, requires_grad=True)
    with _OpLog() as log:
        block(x)
    per_region = {}
    for name, op in log.ops:
        if name is not None and not is_view_op(op):
            per_region.setdefault(name, []).append(str(op))
    assert set(per_region) == set(ACTIVATION_NAMES) - {"block_input"}
    assert all(len(ops) == 1 for ops in per_region.values()), per_region


def test_names_unknown_region_is_an_error():
    with pytest.raises(ValueError, match="known names"):
        with activation("attn_prob"):
            pass


@pytest.mark.parametrize("name", [n for n in POLICIES if not POLICIES[n].save_everything])
def test_policy_block_keeps_declared_names(name):
    rows = [r for r in block_saved(CFG, B, T, name) if r["kind"] != "saved"]
    kept = sorted({r["name"] for r in rows if r["kind"] == "kept"})
    off = sorted({r["name"] for r in rows if r["kind"] == "offloaded"})
    assert {"kept": kept, "offloaded": off} == expected_names(POLICIES[name], "torch")
    assert len(rows) == len(kept) + len(off)


def test_policy_save_dots_keeps_every_product_by_op_class():
    rows = [r for r in block_saved(CFG, B, T, "save_dots") if r["kind"] == "kept"]
    ops = {r["name"]: r["op"] for r in rows}
    assert ops == {"qkv_proj": "aten.addmm.default", "attn_scores": "aten.bmm.default", "attn_out": "aten.bmm.default",
                   "out_proj": "aten.addmm.default", "mlp_hidden": "aten.addmm.default", "mlp_out": "aten.addmm.default"}


def test_policy_keeping_block_input_is_refused():
    with pytest.raises(ValueError, match="block_input"):
        SelectiveCheckpoint(Policy("mine", save_names=frozenset({"block_input"})))


def test_policy_selective_checkpoint_uses_torch_storage_layout():
    fwd, rec = SelectiveCheckpoint("save_dots").context_fn()
    assert fwd.storage is rec.storage  # offload needs the shared cache (torch 2.13 internals)


@pytest.fixture(scope="module")
def model():
    return GPT.from_params(CFG, init_params(CFG, seed=1))


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, CFG.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(0))


def _grads(model, tokens, plan_text):
    plan = parse_plan(plan_text)
    model.zero_grad(set_to_none=True)
    model_loss(model, tokens, plan.schedule, policy=plan.policy).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("plan", [f"full+{n}" for n in POLICIES if n != "save_nothing"]
                         + ["every_k(2)+save_qkv_proj", "sqrt+attention_only", "nested(every_k(2),every_k(1))+save_dots",
                            "nested(sqrt,sqrt)"])
def test_policy_grads_bitwise(model, tokens, plan):
    ref, got = _grads(model, tokens, "none"), _grads(model, tokens, plan)
    bad = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert not bad, f"{plan}: {bad}"


def test_policy_offload_goes_through_host_copies(model, tokens):
    sac = SelectiveCheckpoint("qkv_proj_offloaded")
    loss = model_loss(model, tokens, parse_schedule("full"), policy=sac)
    assert [r.offloaded for r in sac.records] == [True] * CFG.n_layer and sac.kept_bytes() == 0
    assert sac.offloaded_bytes() == CFG.n_layer * B * T * 3 * CFG.d_model * 4
    loss.backward()


def test_nested_outer_forward_caches_nothing(model, tokens):
    # Inner selective checkpoints follow the policy only in the outer recompute: the outer forward's
    # interior is thrown away, so caching there would hold memory for nothing.
    sac = SelectiveCheckpoint("save_dots")
    x = model.embed(tokens[:, :-1])
    out = forward_blocks(model.blocks, x, parse_schedule("nested(every_k(2),every_k(1))"), policy=sac)
    assert sac.records == []
    out.sum().backward()
    assert len(sac.records) == 6 * CFG.n_layer  # cached during the recompute, six products per block
