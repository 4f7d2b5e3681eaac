"""Plan lint in PyTorch: warn when a selective policy kept nothing it is meant to keep.

A :class:`torchref.policies.SelectiveCheckpoint` sees every ATen op of a checkpointed forward
pass; it counts the ops it saved and the activation regions (:func:`torchref.names.activation`)
the ops ran in. After a forward pass, :func:`check_selective` compares that with the policy:

* a name the policy keeps or offloads that no op ran under (an untagged user block, a typo-free
  but absent name) -> :class:`jaxremat.spec.lint.RematPolicyWarning` naming the names;
* nothing saved at all (e.g. ``save_dots`` on a block without ``mm``/``addmm``/``bmm``) -> the
  warning says the plan is full remat;
* products that ran as ``out=`` variants (``aten.addmm.out``, ``aten.bmm.out``: what the kernels of
  a block compiled by torch.compile's inductor call) -> the warning says so: the block did run
  products, but in a form no selective checkpoint can keep (torch refuses a cached tensor that an
  ``out=`` op wrote: "Tensor cached during selective activation checkpoint has been mutated"),
  and names the ways that work with compiled blocks.

The check reads what the forward pass did, so it is exact for the batch it ran on; a forward pass
under ``torch.no_grad()`` runs no checkpoint, so :func:`torchref.render.forward_blocks` does not
lint it.
:func:`check_no_effect` warns on a policy with a schedule that checkpoints nothing (``none``).
"""

from __future__ import annotations

import warnings

from jaxremat.spec.lint import RematPolicyWarning, no_effect_message, unmatched_message

__all__ = ["RematPolicyWarning", "check_no_effect", "check_selective"]

HOW_TO_TAG = "'with torchref.names.activation(name):' around the op that computes each"


def check_no_effect(schedule, policy, n_layer: int, where: str = "forward_blocks") -> None:
    """Warn (:class:`RematPolicyWarning`) when ``policy`` meets a schedule that checkpoints nothing."""
    message = no_effect_message(schedule, getattr(policy, "policy", policy), n_layer, where)
    if message:
        warnings.warn(message, RematPolicyWarning, stacklevel=3)


def check_selective(sac, where: str = "forward_blocks") -> list[str]:
    """Warn about what ``sac`` kept in the forward passes since :meth:`SelectiveCheckpoint.start_lint`.

    Args:
        sac: a :class:`torchref.policies.SelectiveCheckpoint` after a forward pass.
        where: the calling API, for the message.

    Returns:
        The messages warned (empty when the policy matched what it keeps).
    """
    p = sac.policy
    messages = []
    missing = sorted((p.save_names | p.offload_names) - sac.lint_seen)
    out_dots = ", ".join(f"{op} x{n}" for op, n in sorted(sac.lint_out_dots.items()))
    if missing:
        messages.append(unmatched_message(where, p.name, missing, sac.lint_saved > 0, HOW_TO_TAG)
                        + (f" (the block also ran products as out= variants, {out_dots}, as compiled code does: "
                           "ops inside compiled kernels are not seen in their regions)" if out_dots else ""))
    elif sac.lint_saved == 0 and out_dots and (p.save_dots or p.offload_dots):
        messages.append(
            f"{where}: policy {p.name!r} kept nothing: the block's matrix products ran as out= variants ({out_dots}), "
            "the form torch.compile's inductor kernels call, and a selective checkpoint cannot keep an out= result "
            "(torch refuses a cached tensor an out= op wrote), so every checkpointed segment is recomputed in full "
            "(as save_nothing); with compiled blocks use a plan without a policy (full, sqrt), compile with "
            "backend='aot_eager' (its products are plain ATen ops a policy keeps), or let the compiler choose what to "
            "keep (torch._functorch.config.activation_memory_budget, docs/torch-compile-budget.md)")
    elif sac.lint_saved == 0:
        what = {"all": "no matrix product (mm, addmm, bmm, baddbmm)",
                "no_batch": "no matrix product without batch dimensions (mm, addmm)"}
        kind = what.get(p.save_dots or p.offload_dots, "no op it keeps")
        messages.append(f"{where}: policy {p.name!r} kept nothing: the block ran {kind}, so every checkpointed "
                        "segment is recomputed in full (as save_nothing); choose a policy that matches the block")
    for m in messages:
        warnings.warn(m, RematPolicyWarning, stacklevel=3)
    return messages
