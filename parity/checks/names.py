"""What each framework keeps inside one checkpointed block, checked against the policy's declaration.

The declaration is the policy's own name sets (:class:`jaxremat.spec.policies.Policy`
``kept_names`` / ``offloaded_names``). What each framework really keeps is measured per block
(:meth:`parity.runners.framework.Framework.kept_names`: JAX's saved residuals with their
``checkpoint_name`` tags, PyTorch's selective-checkpoint cache). Each framework has one documented
reason to differ from the declaration, its :attr:`parity.runners.framework.FrameworkInfo.not_read_in_block`:

* JAX keeps a tagged value only when the backward pass (with its recompute) reads it. Inside a
  block nothing reads ``mlp_out`` (the block's output is the next segment's boundary), so JAX
  drops it from any declaration.
* PyTorch's selective checkpoint caches every op output the policy names, read or not, so it
  keeps the declaration exactly.

``save_everything`` declares no names: it is checked by keeping the same bytes as ``none``.
"""

from __future__ import annotations

from jaxremat.models import get_model
from jaxremat.spec.plan import RematPlan
from jaxremat.spec.policies import Policy

from parity.runners.framework import FRAMEWORKS, get_framework
from parity.runners.result import RunResult

NOT_READ_IN_BLOCK = FRAMEWORKS["jax"].not_read_in_block
"""What JAX's checkpointed GPT block never keeps (``mlp_out``): :attr:`parity.runners.framework.FrameworkInfo.not_read_in_block`."""


def expected_names(policy: Policy, framework: str) -> dict[str, list[str]] | None:
    """``{"kept": [...], "offloaded": [...]}`` the framework should keep per block, or None (save_everything)."""
    if policy.save_everything:
        return None
    drop = FRAMEWORKS[framework].not_read_in_block
    return {"kept": sorted(policy.kept_names - drop), "offloaded": sorted(policy.offloaded_names - drop)}


def measured_names(framework: str, cfg, batch: int, seq: int, policy: Policy) -> dict:
    """Per-block names kept and offloaded under ``policy``, with shapes (:meth:`parity.runners.framework.Framework.kept_names`).

    Returns:
        ``{"kept": [...], "offloaded": [...], "tensors": [{"name", "shape", "bytes", "memory"}]}``;
        for JAX, every non-argument residual must carry a name (an unnamed one is listed as None).
    """
    return get_framework(framework).kept_names(cfg, batch, seq, policy)


def check_kept_names(case: dict, framework: str, cfg, batch: int, seq: int, plan: RematPlan, res: RunResult,
                     ref: RunResult, cache: dict) -> None:
    """Record in ``case`` what one checkpointed block keeps under the plan's policy and whether it is as declared.

    ``save_everything`` must keep exactly the bytes of ``none``; every other policy must keep (and
    offload) the activation names :func:`expected_names` gives. A segment plan whose segments follow
    several policies is checked policy by policy: ``block_names`` and ``expected_names`` are then
    lists with one entry per policy (``{"policy": name, ...}``) and ``names_ok`` holds when every
    entry is as declared; its ``save_everything`` segments are checked by the cost model only (the
    plan keeps less than ``none`` elsewhere). ``cache`` keeps each (framework, cfg, policy)
    measurement for the next case.
    """
    policies = [p for p in plan.policies if not p.saves_nothing]
    if not policies:
        return
    if not get_model(cfg.arch).block_names_measurable:  # block_memory builds the GPT block only
        case["expected_names"] = "not measured for this architecture"
        return
    if len(plan.policies) == 1 and policies[0].save_everything:
        case["names_ok"] = res.memory.saved_bytes == ref.memory.saved_bytes
        case["expected_names"] = "the same saved bytes as none"
        return
    checked = []
    for policy in (p for p in policies if not p.save_everything):
        key = (framework, cfg, policy)
        if key not in cache:
            cache[key] = measured_names(framework, cfg, batch, seq, policy)
        measured, expected = cache[key], expected_names(policy, framework)
        ok = measured["kept"] == expected["kept"] and measured["offloaded"] == expected["offloaded"]
        checked.append((policy.name, measured, expected, ok))
    if len(plan.policies) == 1:
        _, case["block_names"], case["expected_names"], case["names_ok"] = checked[0]
        return
    case["block_names"] = [{"policy": name, **measured} for name, measured, _, _ in checked]
    case["expected_names"] = [{"policy": name, **expected} for name, _, expected, _ in checked]
    case["names_ok"] = all(ok for *_, ok in checked)
