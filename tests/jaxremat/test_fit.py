"""One-call planners: plan_scan / plan_stack fit a stack to a budget on the compiled program, gradients bitwise."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxremat import plan_scan
from jaxremat.spec.fit import fit_plan
from jaxremat.spec.planner import BlockOption

N, D = 6, 16


def _block(p, h, _):
    return h + jnp.tanh(h @ p["w"]) @ p["v"]


@pytest.fixture(scope="module")
def stack():
    rng = np.random.default_rng(0)  # numpy's draws: jax.random.normal compiles its sampler once per shape
    return {"w": jnp.asarray(0.1 * rng.standard_normal((N, D, 4 * D), np.float32)),
            "v": jnp.asarray(0.1 * rng.standard_normal((N, 4 * D, D), np.float32))}


def test_plan_scan_fits_the_budget_on_the_compiled_program_bitwise(stack):
    fit = plan_scan(_block, stack, jnp.ones((8, D)), budget="60%", policies=["save_nothing"])
    assert fit.peak_bytes <= fit.budget_bytes == int(0.6 * fit.none_peak_bytes)
    assert fit.grads_bitwise_equal is True and fit.ratio <= 0.6
    assert sum(s.length for s in fit.plan.segments) == N and fit.attempts[-1][0] == fit.plan.name


def test_a_budget_no_plan_meets_names_the_least_reached(stack):
    with pytest.raises(ValueError, match=r"no plan was measured within the budget 1B .*the least reached is \d+ bytes"):
        plan_scan(_block, stack, jnp.ones((8, D)), budget=1, policies=["save_nothing"])


@pytest.mark.parametrize("budget, message", [("lots", "budget"), (0, "budget must be > 0"), (1.5, "budget must be")])
def test_bad_budgets_are_refused(budget, message):
    with pytest.raises(ValueError, match=message):
        fit_plan([], 4, 8, budget, lambda p: 100, lambda p: True)


def test_fit_plan_replans_below_a_plan_measured_over_the_budget():
    store = BlockOption("store", False, kept_bytes=100, working_bytes=100)
    ckpt = BlockOption("save_nothing", True, "save_nothing", kept_bytes=0, working_bytes=100, recompute_flops=1.0)

    def measure(plan):  # this "device" holds 150 bytes more than the chain predicts for every plan but none
        from jaxremat.spec.planner import chain_costs
        if plan == "none":
            return 800
        segs = [(s.length, "save_nothing" if s.checkpointed else "store") for s in plan.segments]
        return chain_costs([[store, ckpt]] * 8, segs, 10)[0] + 150

    fit = fit_plan([store, ckpt], 8, 10, "50%", measure, lambda p: True)
    assert fit.peak_bytes <= fit.budget_bytes == 400 and len(fit.attempts) >= 2
    assert fit.attempts[0][2] > 400  # the first plan, planned with none's offset (0), went over
