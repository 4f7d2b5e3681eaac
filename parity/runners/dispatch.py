"""One entry point over both runners: run a plan in a framework and mode, with the suite's settings.

:func:`run_framework` calls :func:`parity.runners.jax_runner.run_schedule` or
:func:`parity.runners.torch_runner.run_schedule`. The runner modules are imported on first use
(deferred on purpose: a PyTorch-only run never loads JAX, a JAX-only run never loads torch).
"""

from __future__ import annotations

# Deferred imports: each runner module loads its framework: imported on first use, so a one-framework run
# never loads the other.

from jaxremat.spec.plan import RematPlan

from parity.runners.result import RunResult


def run_framework(framework: str, mode: str, cfg, params, tokens, plan: RematPlan, suite,
                  with_reverse_loop: bool) -> RunResult:
    """Run ``plan`` once in ``framework``/``mode`` with ``suite``'s optimizer, timing and seed.

    Args:
        framework: ``"jax"`` or ``"torch"``.
        mode: ``"jit"`` or ``"eager"`` (JAX op by op; PyTorch is always eager).
        cfg, params, tokens: the model configuration, canonical parameters and ``(B, T+1)`` tokens.
        plan: the remat plan (schedule and policy).
        suite: a :class:`parity.cases.suite.SuiteConfig` (``hparams``, ``timing_repeats``, ``seed``).
        with_reverse_loop: also run the hand-written reverse segment loop.

    Returns:
        The runner's :class:`parity.runners.result.RunResult` (see the two ``run_schedule`` docstrings).
    """
    if framework == "jax":
        from parity.runners import jax_runner

        # Op by op, JAX dispatches every primitive from Python (about a second per step here): that
        # mode checks the loss and gradients; training and step time are measured under jit.
        return jax_runner.run_schedule(
            cfg, params, tokens, plan.schedule, mode=mode, hparams=suite.hparams,
            timing_repeats=suite.timing_repeats, with_reverse_loop=with_reverse_loop, seed=suite.seed,
            with_training=mode != "eager", policy=plan.policy,
        )
    from parity.runners import torch_runner

    return torch_runner.run_schedule(
        cfg, params, tokens, plan.schedule, mode=mode, hparams=suite.hparams,
        timing_repeats=suite.timing_repeats, with_reverse_loop=with_reverse_loop, seed=suite.seed,
        policy=plan.policy,
    )
