"""The PyTorch planner menus (torchref.planner): measured on the block, checked against the account."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from jaxremat.models.config import TransformerConfig
from jaxremat.models.gpt import activation as am
from jaxremat.spec.planner import NoPlanFits
from torchref.block_memory import block_saved
from torchref.model import Block
from torchref.planner import DEFAULT_MENU, block_options, gpt_block_options, plan_gpt

CFG = TransformerConfig(arch="gpt", vocab_size=64, n_layer=4, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
B, T = 2, 8


@pytest.fixture(scope="module")
def menu():
    return gpt_block_options(CFG, B, T)


def test_store_keeps_the_accounts_layer_bytes(menu):
    assert [o.name for o in menu] == ["store", *DEFAULT_MENU]
    assert menu[0].kept_bytes == am.layer_bytes("torch", CFG, B, T)


@pytest.mark.parametrize("policy", ["save_dots", "attention_only", "mlp_only"])
def test_a_policy_keeps_what_its_selective_checkpoint_caches(menu, policy):
    by = {o.name: o for o in menu}
    kept = sum(r["bytes"] for r in block_saved(CFG, B, T, policy) if r["kind"] == "kept")
    assert by[policy].kept_bytes == kept > 0


def test_save_nothing_recomputes_exactly_one_forward(menu):
    torch.manual_seed(0)
    block, x = Block(CFG), torch.randn(B, T, CFG.d_model)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        block(x)
    by = {o.name: o for o in menu}
    assert by["save_nothing"].recompute_flops == counter.get_total_flops() > 0
    assert by["save_dots"].recompute_flops == 0  # every matrix product is cached; the rest is not counted


def test_a_users_own_module_gets_a_measured_menu():
    block = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    opts = block_options(block, torch.randn(4, 8), ["save_nothing"])
    assert opts[0].kept_bytes > 0 and opts[1].kept_bytes == 0
    assert opts[1].recompute_flops == 2 * 4 * 8 * 32 * 2


def test_plan_and_errors():
    none = am.predict_peak_activation_bytes("torch", CFG, B, T, __import__("jaxremat").parse_schedule("none"))
    r = plan_gpt(CFG, B, T, int(0.8 * none))
    assert r.peak_bytes <= int(0.8 * none)
    with pytest.raises(NoPlanFits):
        plan_gpt(CFG, B, T, 10)
    with pytest.raises(ValueError, match="block_input"):
        gpt_block_options(CFG, B, T, [__import__("jaxremat").parse_policy("save(block_input)")])


def test_the_encoder_chain_is_measured_on_its_block():
    from jaxremat.models.config import TransformerConfig as Config
    from jaxremat.spec.planner import chain_costs
    from torchref.planner import encoder_chain, model_chain, plan_model

    bert = Config(arch="bert", vocab_size=64, n_layer=4, d_model=16, n_head=2, d_ff=32, max_seq_len=8,
                  layer_norm_eps=1e-12, dropout=0.0)
    chain = model_chain(bert, 4, 8)
    menu = chain["options_per_block"][0]
    assert menu[0].name == "store" and menu[0].kept_bytes > menu[2].kept_bytes > 0 == menu[1].kept_bytes
    assert chain["fixed_bytes"] == 0 and chain["boundary_bytes"] == 4 * 8 * 16 * 4
    store_all = chain_costs(chain["options_per_block"], [(4, "store")], chain["boundary_bytes"])[0]
    r = plan_model(bert, 4, 8, store_all // 2)
    assert r.peak_bytes <= store_all // 2 and r.recompute_flops > 0
    with pytest.raises(ValueError, match="encoder_chain plans the BERT"):
        encoder_chain(bert.replace(arch="gpt"), 4, 8)
