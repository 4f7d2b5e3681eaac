"""Named remat policies: what a checkpointed block keeps, declared once for both frameworks.

A schedule (:mod:`jaxremat.spec.schedules`) decides which *segments* are recomputed; a policy
decides what a checkpointed segment keeps *inside* itself anyway, so that the recompute can skip
work. A :class:`Policy` is a frozen, hashable value over the activation names of
:mod:`jaxremat.spec.names` and two op classes (matrix products with and without batch
dimensions). Each framework renders it once: JAX to a ``jax.checkpoint`` policy
(:func:`jaxremat.policies.to_jax_policy`), PyTorch to a selective-checkpoint policy function
(:mod:`torchref.policies`).

Kept vs offloaded: a kept activation stays in device memory until its backward pass; an
offloaded one is copied to host memory in the forward pass and back in the backward pass
(JAX ``save_and_offload_only_these_names``, device -> pinned_host).

Sources: JAX ``jax.checkpoint_policies`` (``dots_saveable``, ``dots_with_no_batch_dims_saveable``,
``save_only_these_names``, ``save_and_offload_only_these_names``); MaxText's ``remat_policy``
values (``layers/decoders.py``), whose names are accepted as aliases with MaxText's meaning;
selective recomputation of the attention core: Korthikanti et al. 2022, arXiv:2205.05198, section 5.
"""

from __future__ import annotations

import dataclasses

from .names import ACTIVATION_NAMES, ATTENTION_NAMES, MLP_NAMES, check_names
from .grammar import split_call

DOT_KINDS = (None, "all", "no_batch")
"""Op-class selectors: every matrix product, or only those without batch dimensions."""

DOT_NAMES = ("qkv_proj", "attn_scores", "attn_out", "out_proj", "mlp_hidden", "mlp_out")
"""Names whose value is produced by a matrix product (in the transformer blocks)."""
BATCHED_DOT_NAMES = ("attn_scores", "attn_out")
"""Of those, the ones with batch dimensions (per-head products over (B, H))."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """What a checkpointed segment keeps (or offloads) inside itself; everything else is recomputed.

    Attributes:
        name: the policy's name (``save_dots``, ``attention_only``, ...).
        save_names: activation names kept in device memory.
        offload_names: activation names moved to host memory until the backward pass.
        save_dots: ``"all"`` keeps the output of every matrix product, ``"no_batch"`` only of those
            without batch dimensions (JAX's ``dots_with_no_batch_dims_saveable`` meaning), None none.
        offload_dots: ``"no_batch"`` offloads the products without batch dimensions, or None.
        save_everything: keep every residual, as without remat (JAX ``everything_saveable``).
        description: one line for tables and ``--help``.

    Raises:
        ValueError: an unknown activation name (the message lists the known ones), a name both
            saved and offloaded, an unknown ``save_dots``/``offload_dots`` value, or
            ``save_everything`` combined with anything else.
    """

    name: str
    save_names: frozenset = frozenset()
    offload_names: frozenset = frozenset()
    save_dots: str | None = None
    offload_dots: str | None = None
    save_everything: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        for field in ("save_names", "offload_names"):
            if isinstance(getattr(self, field), str):
                raise ValueError(f"policy {self.name!r}: {field} must be a set of activation names, "
                                 f"e.g. frozenset({{{getattr(self, field)!r}}}), not a string")
        object.__setattr__(self, "save_names", frozenset(check_names(self.save_names, f"policy {self.name!r}")))
        object.__setattr__(self, "offload_names", frozenset(check_names(self.offload_names, f"policy {self.name!r}")))
        both = self.save_names & self.offload_names
        if both:
            raise ValueError(
                f"policy {self.name!r}: {', '.join(sorted(both))} both saved and offloaded; an activation is "
                "either kept on the device or moved to the host, pick one"
            )
        if self.save_dots not in DOT_KINDS or self.offload_dots not in (None, "no_batch"):
            raise ValueError(f"policy {self.name!r}: save_dots must be one of {DOT_KINDS} and offload_dots "
                             f"None or 'no_batch'; got {self.save_dots!r}, {self.offload_dots!r}")
        if self.save_dots and self.offload_dots:
            raise ValueError(f"policy {self.name!r}: dots cannot be both saved and offloaded")
        both = self.kept_names & self.offloaded_names
        if both:
            raise ValueError(f"policy {self.name!r}: {', '.join(sorted(both))} both kept (by name or as a matrix "
                             "product) and offloaded; pick one")
        if self.save_everything and (self.save_names or self.offload_names or self.save_dots or self.offload_dots):
            raise ValueError(f"policy {self.name!r}: save_everything keeps everything; it takes no other setting")

    @property
    def kept_names(self) -> frozenset:
        """Names this policy keeps on the device inside a checkpointed block (dots resolved to names)."""
        if self.save_everything:
            return frozenset(ACTIVATION_NAMES)
        return self.save_names | frozenset(_dot_names(self.save_dots))

    @property
    def offloaded_names(self) -> frozenset:
        """Names this policy moves to host memory inside a checkpointed block."""
        return self.offload_names | frozenset(_dot_names(self.offload_dots))

    @property
    def saves_nothing(self) -> bool:
        """True when a checkpointed block keeps nothing but its input (full recompute)."""
        return not (self.save_everything or self.kept_names or self.offloaded_names)


def _dot_names(kind: str | None) -> tuple[str, ...]:
    if kind == "all":
        return DOT_NAMES
    if kind == "no_batch":
        return tuple(n for n in DOT_NAMES if n not in BATCHED_DOT_NAMES)
    return ()


def _p(name, description, **kw) -> Policy:
    return Policy(name, description=description, **{k: frozenset(v) if k.endswith("_names") else v
                                                      for k, v in kw.items()})


POLICIES: dict[str, Policy] = {p.name: p for p in (
    _p("save_nothing", "keep only the block input; recompute the whole block (jax nothing_saveable)"),
    _p("save_everything", "keep every residual, as without remat (jax everything_saveable)", save_everything=True),
    _p("save_dots", "keep every matrix-product output, incl. per-head scores and context (jax dots_saveable)",
       save_dots="all"),
    _p("save_dots_no_batch", "keep the projections' outputs, recompute the per-head products "
       "(jax dots_with_no_batch_dims_saveable)", save_dots="no_batch"),
    _p("save_qkv_proj", "keep the fused query/key/value projection", save_names={"qkv_proj"}),
    _p("save_out_proj", "keep the attention out-projection", save_names={"out_proj"}),
    _p("save_dots_except_mlp", "keep the attention projections (qkv and out), recompute the MLP's",
       save_names={"qkv_proj", "out_proj"}),
    _p("attention_only", "recompute only the attention sublayer; keep what the MLP's backward needs "
       "(selective recomputation, Korthikanti et al. 2022)", save_names={"mlp_norm", "mlp_hidden", "mlp_act"}),
    _p("mlp_only", "recompute only the MLP sublayer; keep what the attention's backward needs",
       save_names={"attn_norm", "qkv_proj", "attn_probs", "attn_out", "out_proj"}),
    _p("qkv_proj_offloaded", "offload the qkv projection to host memory (MaxText qkv_proj_offloaded)",
       offload_names={"qkv_proj"}),
    _p("minimal_offloaded", "offload the projections' outputs to host memory (MaxText minimal_offloaded, "
       "jax offload_dot_with_no_batch_dims)", offload_dots="no_batch"),
)}
"""Every named policy, by name."""

MAXTEXT_ALIASES: dict[str, str] = {
    "full": "save_nothing",
    "minimal": "save_dots_no_batch",
    "save_dot_except_mlp": "save_dots_except_mlp",
    "save_qkv_proj": "save_qkv_proj",
    "save_out_proj": "save_out_proj",
    "qkv_proj_offloaded": "qkv_proj_offloaded",
    "minimal_offloaded": "minimal_offloaded",
}
"""MaxText ``remat_policy`` values -> our policy with the same meaning (MaxText ``layers/decoders.py``)."""

POLICY_NAMES = tuple(POLICIES) + tuple(a for a in MAXTEXT_ALIASES if a not in POLICIES) + (
    "save_names(NAME,...)", "offload_names(NAME,...)")


def _names_arg(text: str, kind: str, arg: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in arg.split(","))
    if not any(names):
        raise ValueError(f"policy {text!r}: give at least one activation name, e.g. {kind}(qkv_proj)")
    if not all(names):
        raise ValueError(f"policy {text!r}: empty name in the list; remove the extra comma")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"policy {text!r}: {', '.join(twice)} listed twice; list each name once")
    return names


def parse_policy(text: "str | Policy | None") -> Policy:
    """A policy from its name, a MaxText alias, ``save_names(a,b)``/``offload_names(a,b)``, or a Policy.

    None gives ``save_nothing``. Parsing is strict: whitespace is allowed around parentheses
    and commas only, and each name is given once.

    Raises:
        ValueError: an unknown name (the message lists the valid ones), an unknown, empty or
            repeated activation name inside ``save_names(...)`` / ``offload_names(...)``, or a
            value that is neither a string nor a Policy.
    """
    if text is None:
        return POLICIES["save_nothing"]
    if isinstance(text, Policy):
        return text
    if not isinstance(text, str):
        raise ValueError(f"a policy is a name such as 'save_dots' or a Policy, got {text!r} ({type(text).__name__})")

    try:
        name, arg = split_call(text, "policy")
    except ValueError:
        raise ValueError(f"unknown policy {text!r}; valid policies: {', '.join(POLICY_NAMES)}") from None
    if arg is None and name in POLICIES:
        return POLICIES[name]
    if arg is None and name in MAXTEXT_ALIASES:
        return POLICIES[MAXTEXT_ALIASES[name]]
    if arg is not None and name in ("save_names", "offload_names"):
        names = _names_arg(text, name, arg)
        canonical = f"{name}({','.join(names)})"
        if name == "save_names":
            return Policy(canonical, save_names=frozenset(names), description="keep the named activations")
        return Policy(canonical, offload_names=frozenset(names), description="offload the named activations to host memory")
    raise ValueError(f"unknown policy {text!r}; valid policies: {', '.join(POLICY_NAMES)}")


__all__ = [
    "ACTIVATION_NAMES", "ATTENTION_NAMES", "BATCHED_DOT_NAMES", "DOT_NAMES", "MAXTEXT_ALIASES", "MLP_NAMES",
    "POLICIES", "POLICY_NAMES", "Policy", "parse_policy",
]
