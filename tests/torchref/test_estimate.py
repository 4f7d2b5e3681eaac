"""torchref.estimate: a training step under fake tensors has the real step's MemTracker peak."""

import pytest
import torch
from torch import nn

import torchref
from jaxremat.models import TransformerConfig
from torchref.estimate import NOT_ACTIVATION, PlanEstimate, estimate_step
from torchref.model import GPT
from torchref.render import model_loss

GPT_SMALL = TransformerConfig(vocab_size=256, n_layer=8, d_model=64, n_head=4, d_ff=256, max_seq_len=64)


def build():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT(GPT_SMALL), (torch.randint(0, 256, (4, 65)),)


def gpt_loss(model, plan, tokens):
    return model_loss(model, tokens, plan.schedule, policy=plan.policy)


def test_fake_step_peak_equals_the_real_steps_memtracker_peak_at_gpt_small(plan="every_k(2)"):
    fake = estimate_step(build, plan, gpt_loss)
    real = estimate_step(build, plan, gpt_loss, fake=False, tracker="memtracker")
    assert fake.peak_bytes == real.peak_bytes  # margin 0 bytes, measured
    assert [fake.breakdown[k] for k in NOT_ACTIVATION] == [real.breakdown[k] for k in NOT_ACTIVATION]
    assert fake.breakdown["ACT+TEMP"] == sum(v for k, v in real.breakdown.items() if k not in NOT_ACTIVATION)
    assert fake.gradient_bytes > 0  # the peak is in the backward pass, some gradients allocated
    assert fake.parameter_bytes == sum(p.numel() * 4 for p in GPT(GPT_SMALL).parameters())
    assert fake.optimizer_bytes == 2 * fake.parameter_bytes + 4 * len(list(GPT(GPT_SMALL).parameters()))
    assert fake.activation_bytes == fake.peak_bytes - fake.parameter_bytes - fake.buffer_bytes - \
        fake.gradient_bytes - fake.optimizer_bytes > 0
    assert "FakeTensorMode" in fake.backend and "real tensors + MemTracker" in real.backend


def test_estimate_takes_a_user_stack_and_remat_lowers_its_peak():
    def block():  # keeps its input, the 128-wide hidden and its tanh: a checkpoint keeps the input only
        return nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 32))

    rows = torchref.estimate(lambda: nn.Sequential(*(block() for _ in range(6))), [(16, 8, 32)],
                             plans=["none", "full"])
    assert [r.plan for r in rows] == ["none", "full"] and all(isinstance(r, PlanEstimate) for r in rows)
    assert rows[1].activation_bytes < rows[0].activation_bytes
    assert rows[0].parameter_bytes == 6 * (2 * 32 * 128 + 128 + 32) * 4


def test_estimate_refuses_bad_plans_before_any_step():
    built = []
    with pytest.raises(ValueError, match="unknown"):
        torchref.estimate(lambda: built.append(1) or nn.Sequential(nn.Linear(2, 2)), [(1, 2)], plans=["sqrtt"])
    assert built == []


def test_gpt_check_inputs_skips_values_of_fake_tensors_only():
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = GPT(GPT_SMALL)
    with pytest.raises(ValueError, match="lie in"):
        model.check_inputs(torch.full((1, 4), 256))
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.check_inputs(torch.full((1, 4), 256))  # no values to check: shapes and dtypes only
