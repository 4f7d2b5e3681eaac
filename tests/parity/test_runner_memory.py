"""parity.runners.jax_memory / torch_memory: the one measurement path per framework, and its callers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxremat.memory import compiled_stats, gpu_available, saved_residuals
from jaxremat.model import loss_fn
from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec import parse_schedule
from jaxremat.spec.plan import parse_plan
from parity.cases import sweep
from parity.runners.framework import FRAMEWORK_NAMES, Framework, RunOptions, get_framework
from parity.runners.jax_memory import measure_jax
from parity.runners.result import Memory
from parity.runners.torch_memory import measure_torch
from torchref.model import GPT
from torchref.render import model_loss

CFG = TransformerConfig(vocab_size=64, n_layer=2, d_model=16, n_head=2, d_ff=32, max_seq_len=8)
TOKENS = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, CFG.max_seq_len + 1))


def test_measure_jax_counts_residuals_and_the_compiled_peak():
    params = {k: jnp.asarray(v) for k, v in init_params(CFG).items()}
    tok = jnp.asarray(TOKENS, jnp.int32)
    sched = parse_schedule("full")

    def loss(p):
        return loss_fn(p, tok, CFG, sched)

    mem = measure_jax(loss, params)
    assert isinstance(mem, Memory) and mem.saved_names is None
    records = saved_residuals(loss, params)
    assert mem.saved_bytes == sum(r.bytes for r in records if not r.is_argument) > 0
    stats = compiled_stats(jax.jit(jax.value_and_grad(loss)).lower(params).compile())
    assert mem.peak_bytes == stats["peak_bytes"] and mem.peak_breakdown["temp_bytes"] == stats["temp_bytes"]
    param_bytes = sum(v.nbytes for v in params.values())
    assert mem.peak_activation_bytes == stats["peak_bytes"] - 2 * param_bytes
    assert "of jit(value_and_grad(loss_fn))" in mem.peak_source and "arguments" in mem.peak_activation_source


@pytest.mark.skipif(not gpu_available(), reason="the device peak reads GPU allocator statistics; no GPU backend")
def test_measure_jax_reads_the_device_peak_on_a_gpu():
    params = {k: jnp.asarray(v) for k, v in init_params(CFG).items()}
    tok = jnp.asarray(TOKENS, jnp.int32)
    step = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, tok, CFG, parse_schedule("none"))))
    mem = measure_jax(lambda p: loss_fn(p, tok, CFG, parse_schedule("none")), params, device_step=lambda: step(params))
    assert mem.device_peak["peak_bytes"] > mem.device_peak["bytes_in_use_before"] >= 0


def _torch_model_and_step(plan_text):
    plan = parse_plan(plan_text)
    model = GPT.from_params(CFG, init_params(CFG))
    tok = torch.from_numpy(TOKENS.astype(np.int64))

    def step():
        model.zero_grad(set_to_none=False)
        model_loss(model, tok, plan.schedule, policy=plan.policy).backward()

    step()  # allocates the gradients
    return model, tok, plan, step


def test_measure_torch_counters_agree_on_the_peak_activation():
    """The suite's MemTracker and the sweep's live-bytes counter give the same activation peak."""
    model, tok, plan, step = _torch_model_and_step("full")

    def forward(sac, on_input):
        return model_loss(model, tok, plan.schedule, policy=sac, on_checkpoint_input=on_input)

    fixed = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters())]
    exclude = [*model.parameters(), *model.buffers()]
    tracked = measure_torch(forward, step, exclude=exclude, tracked=(model,), policy=plan.policy)
    live = measure_torch(forward, step, exclude=exclude, tracked=(model,), policy=plan.policy,
                         counter="live_bytes", fixed=fixed)
    assert tracked.saved_bytes == live.saved_bytes > 0 and tracked.residuals == live.residuals
    assert tracked.peak_activation_bytes == live.peak_activation_bytes > 0
    assert live.peak_bytes == live.peak_activation_bytes + sum(t.untyped_storage().nbytes() for t in fixed)
    assert tracked.peak_source == "torch MemTracker (cpu)" and live.peak_source.startswith("torchref.live_bytes")
    with pytest.raises(ValueError, match="counter"):
        measure_torch(forward, step, exclude=exclude, counter="nvml")


def test_measure_torch_counts_the_outputs_a_policy_caches():
    model, tok, plan, step = _torch_model_and_step("full+save_qkv_proj")

    def forward(sac, on_input):
        return model_loss(model, tok, plan.schedule, policy=sac, on_checkpoint_input=on_input)

    exclude = [*model.parameters(), *model.buffers()]
    kept = measure_torch(forward, step, exclude=exclude, tracked=(model,), policy=plan.policy)
    bare = measure_torch(forward, step, exclude=exclude, tracked=(model,), policy=None)
    assert kept.saved_names == ("qkv_proj",) and bare.saved_names == ()
    assert kept.saved_bytes > bare.saved_bytes  # the cached projections are kept for backward


def test_sweep_and_runner_measure_through_the_same_path():
    """A sweep case's JAX numbers are measure_jax's numbers for the same program (tokens an argument)."""
    cfg = CFG.replace(n_layer=2)
    tokens = (sweep.token_batch(2, 8) % cfg.vocab_size)
    case = get_framework("jax").measure_plan(cfg, tokens, parse_plan("sqrt"), repeats=1)
    params = {k: jnp.asarray(v) for k, v in init_params(cfg).items()}
    tok = jnp.asarray(tokens, jnp.int32)

    def loss(p, t):
        return loss_fn(p, t, cfg, parse_schedule("sqrt"))

    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, tok).compile()
    mem = measure_jax(lambda p: loss(p, tok), params, compiled)
    assert (case["saved_bytes"], case["peak_bytes"], case["peak_activation_bytes"]) == \
        (mem.saved_bytes, mem.peak_bytes, mem.peak_activation_bytes)


def test_every_framework_has_every_verb_of_the_protocol_with_its_parameters():
    import inspect

    verbs = {n: inspect.signature(f) for n, f in vars(Framework).items() if inspect.isfunction(f) and not n.startswith("_")}
    assert {"run_plan", "run_user_stack", "measure_plan", "kept_names", "planner_chain", "no_saving_cause"} <= set(verbs)
    for name in FRAMEWORK_NAMES:
        fw = get_framework(name)
        assert fw.info.name == name
        for verb, sig in verbs.items():
            got = inspect.signature(getattr(type(fw), verb))
            assert list(got.parameters) == list(sig.parameters), (name, verb)
    with pytest.raises(ValueError, match="eagerly"):
        get_framework("torch").run_plan("jit", CFG, init_params(CFG), TOKENS, parse_plan("none"), RunOptions(hparams=None))


@pytest.mark.parametrize("plan", ["full+save_dots", "full+save_qkv_proj"])
def test_sweep_counts_what_a_torch_policy_keeps_as_the_runner_does(plan):
    """A PyTorch sweep case under a policy counts the tensors the policy keeps (the suite runner's number).

    Measured before the one measurement path: the sweep gave every policy plan ``full``'s saved bytes.
    """
    from parity.inputs.train import AdamWConfig

    plan = parse_plan(plan)
    tokens = sweep.token_batch(2, 8) % CFG.vocab_size
    torch_fw = get_framework("torch")
    case = torch_fw.measure_plan(CFG, tokens, plan, repeats=1)
    full = torch_fw.measure_plan(CFG, tokens, parse_plan("full"), repeats=1)
    res = torch_fw.run_plan("eager", CFG, init_params(CFG), tokens, plan, RunOptions(hparams=AdamWConfig(),
                                                                                     timing_repeats=1))
    assert case["saved_bytes"] == res.memory.saved_bytes > full["saved_bytes"]
