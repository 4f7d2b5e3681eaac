"""torch.compile's activation memory budget with random ops: keep their draws, and check every gradient.

**The fault.** AOT Autograd's min-cut partitioner bans random ops (``native_dropout``, ``rand_like``,
``randn_like``) from recompute, and at ``torch._functorch.config.activation_memory_budget`` 1.0 it
keeps that ban. Below 1.0 its knapsack (``torch._functorch.partitioners.choose_saved_values_set``)
may recompute any banned node, random ones included; the backward graph then draws a new dropout
mask, and the gradients are silently wrong. Measured on gpt-tiny with dropout 0.1 against eager
``none`` (same weights, tokens and seed): max relative error 5.1e-7 at budget 1.0, then 0.90 (0.5),
1.01 (0.2), 1.08 (0.05), backend ``aot_eager_decomp_partition``.

**What torch offers.** ``torch._functorch.config.functionalize_rng_ops`` (the recompute replays a
Philox offset) is CUDA only: on CPU the compile fails ("CUDA not available"; torch 2.13).

**The remedy here.** :class:`RandomOpsPartition` (``random_ops="save"``) marks every random node of
the joint graph ``CheckpointPolicy.MUST_SAVE`` before calling
``min_cut_rematerialization_partition``: the knapsack never offers a ``MUST_SAVE`` node for
recompute, so the forward's draw is saved and the backward reads it. At every budget tried (1.0,
0.5, 0.2, 0.05) the gradients are then within :data:`GRADS_REL_BOUND` of eager ``none``; the price
is the saved draws (gpt-tiny, dropout 0.1, budget 0.5: 182,676 saved bytes against 139,540 when
they are recomputed). Tried and not chosen: ``MUST_RECOMPUTE``, which makes the partitioner
replay the CPU RNG state (``run_and_save_rng_state``, 5,056 bytes per random op): also correct,
but it saved more at every budget (207,828 at 0.5). ``random_ops="recompute"`` leaves torch's
partition as it is and counts the random ops its backward graph redraws.

**The check.** :func:`check_compiled_grads` runs eager ``none`` and the compiled loss on the same
weights and tokens after ``torch.manual_seed(seed)``, under
``torch._inductor.config.fallback_random=True`` so that the compiled forward draws its masks with
eager's ops in eager's order (without it the decomposed dropout draws other masks at every budget,
1.0 included: max relative error 1.22). A point passes when the gradients are bitwise equal or
within :data:`GRADS_REL_BOUND` (``max |compiled - eager| / max |eager|`` per array, the largest).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch._functorch.config
import torch._inductor.config
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import get_nop_func
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.compile_fx import compile_fx, select_decomp_table
from torch._inductor.custom_graph_pass import CustomPartitionerFn
from torch.utils.checkpoint import CheckpointPolicy

from jaxremat.models.config import TransformerConfig
from jaxremat.spec import parse_schedule

from .model import GPT
from .render import model_loss

__all__ = ["GRADS_REL_BOUND", "RANDOM_OPS", "GradCheck", "RandomOpsPartition", "check_compiled_grads", "check_text",
           "compile_backend", "compiled_problem", "grads_verdict", "max_ulp_distance"]

RANDOM_OPS = ("save", "recompute")
"""``"save"``: random ops' outputs are saved for the backward (:class:`RandomOpsPartition`);
``"recompute"``: torch's partition as it is (the budget may recompute them, with new draws)."""

GRADS_REL_BOUND = {"float32": 1e-4}
"""Largest ``max |compiled - eager none| / max |eager none|`` over the gradient arrays that passes, by
dtype. Reason: the compiled graph's decompositions reassociate float32 sums (measured at most 5.2e-7
on gpt-tiny, with and without dropout, at every budget); a redrawn dropout mask moves gradients by
0.79 to 1.08. The bound is ~200x the one and ~8000x below the other. Other dtypes have no stated bound."""

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {2: np.int16, 4: np.int32, 8: np.int64}


def _is_random(node: torch.fx.Node) -> bool:
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and \
        torch.Tag.nondeterministic_seeded in target.tags


class RandomOpsPartition(CustomPartitionerFn):
    """AOT Autograd's min-cut partition, with random ops saved (``save=True``) or left to torch.

    Args:
        save: mark every random node (an ATen op tagged ``nondeterministic_seeded``) of the joint
            graph ``MUST_SAVE`` first, so that no budget recomputes it.

    Attributes:
        random_ops: random nodes in the last joint graph partitioned.
        recomputed: random nodes in its backward graph (draws the backward makes again).

    Usable as ``torch._inductor.config.custom_partitioner_fn`` and as AOT Autograd's ``partition_fn``.
    """

    def __init__(self, save: bool = True):
        self.save = save
        self.random_ops = 0
        self.recomputed = 0

    def __call__(self, gm: torch.fx.GraphModule, joint_inputs, **kwargs):
        random = [n for n in gm.graph.nodes if _is_random(n)]
        if self.save:
            for node in random:
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        kwargs.setdefault("compiler", "inductor")
        fw, bw = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        self.random_ops = len(random)
        self.recomputed = sum(_is_random(n) for n in bw.graph.nodes)
        return fw, bw

    def uuid(self) -> Any:
        return None  # no inductor cache: the partition (and its counts) runs at every compile


def compile_backend(backend: str, random_ops: str = "save") -> tuple[Callable, RandomOpsPartition]:
    """A ``torch.compile`` backend: ``backend`` with :class:`RandomOpsPartition` as its partitioner.

    Args:
        backend: ``"aot_eager_decomp_partition"`` (inductor's decompositions and the min-cut
            partition, graphs run as ATen ops; as ``torch._dynamo.backends.debugging`` defines it) or
            ``"inductor"`` (``torch._inductor.compile_fx.compile_fx`` with
            ``torch._inductor.config.custom_partitioner_fn`` set while it compiles).
        random_ops: one of :data:`RANDOM_OPS`.

    Returns:
        ``(backend_fn, partition)``: pass ``backend_fn`` to ``torch.compile(..., backend=)``;
        ``partition`` holds the random-op counts of the last compile.

    Raises:
        ValueError: unknown ``backend`` or ``random_ops``.
    """
    if random_ops not in RANDOM_OPS:
        raise ValueError(f"random_ops must be one of {RANDOM_OPS}, got {random_ops!r}")
    partition = RandomOpsPartition(save=random_ops == "save")
    if backend == "aot_eager_decomp_partition":
        def aot_eager(gm, example_inputs):
            with torch._functorch.config.patch(unlift_effect_tokens=True):
                return aot_autograd(fw_compiler=get_nop_func(), bw_compiler=get_nop_func(),
                                    decompositions=select_decomp_table(), partition_fn=partition)(gm, example_inputs)

        return aot_eager, partition
    if backend == "inductor":
        def inductor(gm, example_inputs):
            with torch._inductor.config.patch(custom_partitioner_fn=partition):
                return compile_fx(gm, example_inputs)

        return inductor, partition
    raise ValueError(f"backend must be 'aot_eager_decomp_partition' or 'inductor', got {backend!r}")


def max_ulp_distance(test: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> tuple[bool, int, float, float]:
    """``(bitwise equal, max ULP, max abs diff, max relative error)`` of ``test`` against ``ref``.

    The definitions of ``parity.checks.compare.compare_bitwise`` (max ULP -1 when a NaN is met)
    and ``max_rel_err`` (per array ``max|a - b| / max|b|``); torchref does not import the harness
    (``tests/torchref/test_compiled.py`` checks the two agree).
    """
    equal, worst, max_abs, max_rel = True, 0, 0.0, 0.0
    for name, b in ref.items():
        a, b = np.asarray(test[name]), np.asarray(b)
        if b.size:
            scale = float(np.max(np.abs(b.astype(np.float64))))
            err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            max_rel = max(max_rel, err / scale if scale > 0 else (0.0 if err == 0 else float("inf")))
        if np.array_equal(a.view(_UINT[a.dtype.itemsize]), b.view(_UINT[b.dtype.itemsize])):
            continue
        equal = False
        if np.isnan(a).any() or np.isnan(b).any():
            worst = -1
            continue
        max_abs = max(max_abs, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
        ia, ib = (x.view(_INT[x.dtype.itemsize]).astype(np.int64) for x in (a, b))
        mask = np.int64(np.iinfo(_INT[a.dtype.itemsize]).max)
        oa = np.where(ia < 0, -(ia & mask), ia & mask).ravel()
        ob = np.where(ib < 0, -(ib & mask), ib & mask).ravel()
        if worst >= 0:
            worst = max(worst, max(abs(int(x) - int(y)) for x, y in zip(oa, ob)))
    return equal, worst, max_abs, max_rel


def grads_verdict(bitwise: bool, max_rel_err: float, dtype: str) -> tuple[float | None, bool | None]:
    """``(bound, passed)``: bitwise passes; else within ``GRADS_REL_BOUND[dtype]``; None where no bound is stated."""
    bound = GRADS_REL_BOUND.get(dtype)
    if bitwise:
        return bound, True
    return bound, None if bound is None else bool(max_rel_err <= bound)


@dataclasses.dataclass(frozen=True)
class GradCheck:
    """A compiled step's loss and gradients against eager ``none`` (see the module docstring).

    Attributes:
        dropout: the model's dropout rate in the check.
        random_ops: the partition's handling of random ops (:data:`RANDOM_OPS`).
        random_ops_in_graph: random nodes in the joint graph.
        random_ops_recomputed: random nodes in the backward graph (new draws).
        grads_bitwise_equal: loss and every gradient byte-for-byte equal.
        max_ulp: largest ULP distance (-1: a NaN).
        max_rel_err: largest ``max|compiled - eager| / max|eager|`` over loss and gradient arrays.
        grads_rel_bound: the bound that applies (:data:`GRADS_REL_BOUND`), None if none is stated.
        grads_ok: bitwise or within the bound; None when not bitwise and no bound is stated.
    """

    dropout: float
    random_ops: str
    random_ops_in_graph: int
    random_ops_recomputed: int
    grads_bitwise_equal: bool
    max_ulp: int
    max_rel_err: float
    grads_rel_bound: float | None
    grads_ok: bool | None


def check_compiled_grads(cfg: TransformerConfig, params: Mapping[str, np.ndarray], tokens: np.ndarray, budget: float,
                         *, backend: str = "aot_eager_decomp_partition", random_ops: str = "save",
                         seed: int = 0) -> GradCheck:
    """Compile the GPT's loss (schedule ``none``) at ``budget`` and check one step against eager ``none``.

    Args:
        cfg: a GPT-family config; its ``dropout`` decides whether the step draws masks.
        params: canonical parameters (:func:`jaxremat.models.params.init_params`).
        tokens: ``(B, T+1)`` integer token ids.
        budget: ``activation_memory_budget`` in (0, 1].
        backend: see :func:`compile_backend`.
        random_ops: see :data:`RANDOM_OPS`.
        seed: ``torch.manual_seed`` before each of the two steps.

    Returns:
        :class:`GradCheck`.

    Raises:
        ValueError: as :func:`compile_backend`; bad tokens (:meth:`torchref.model.GPT.check_inputs`).
    """
    backend_fn, partition = compile_backend(backend, random_ops)
    tok = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    model = GPT.from_params(cfg, dict(params))
    schedule = parse_schedule("none")

    def step(loss_fn) -> dict[str, np.ndarray]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        loss = loss_fn(tok)
        loss.backward()
        return {"loss": loss.detach().numpy().copy(), **model.to_params(grads=True)}

    ref = step(lambda t: model_loss(model, t, schedule))
    torch._dynamo.reset()
    with torch._functorch.config.patch(activation_memory_budget=float(budget)), \
            torch._inductor.config.patch(fallback_random=True):
        got = step(torch.compile(lambda t: model_loss(model, t, schedule), backend=backend_fn, fullgraph=True))
    equal, ulp, _, rel = max_ulp_distance(got, ref)
    bound, ok = grads_verdict(equal, rel, cfg.dtype)
    return GradCheck(dropout=float(cfg.dropout), random_ops=random_ops, random_ops_in_graph=partition.random_ops,
                     random_ops_recomputed=partition.recomputed, grads_bitwise_equal=equal, max_ulp=ulp,
                     max_rel_err=rel, grads_rel_bound=bound, grads_ok=ok)


def compiled_problem(point: Any) -> str | None:
    """Why a compiled point is no valid option (its gradients are wrong), in one line; None when it passed.

    Args:
        point: a :class:`torchref.compiled.CompiledResult` or its ``dataclasses.asdict`` form.
    """
    p = dataclasses.asdict(point) if dataclasses.is_dataclass(point) else point
    checks = [(p, "")]
    if p.get("random_op_check"):
        checks.append((p["random_op_check"], f" with dropout {p['random_op_check']['dropout']:g}"))
    for c, where in checks:
        if c.get("grads_ok"):
            continue
        redrawn = (f" (the backward redraws {c['random_ops_recomputed']} of its {c['random_ops_in_graph']} random ops)"
                   if c.get("random_ops_recomputed") else "")
        if c.get("grads_rel_bound") is None:
            return f"gradients{where} not bitwise equal to eager none and no bound stated for this dtype{redrawn}"
        return (f"gradients wrong{where}: max rel err {c['max_rel_err']:.2g} against eager none, bound "
                f"{c['grads_rel_bound']:g}{redrawn}")
    return None


def check_text(c: GradCheck | None) -> str:
    """A :class:`GradCheck` in a few words for a table cell (``-`` for None)."""
    if c is None:
        return "-"
    return (f"dropout {c.dropout:g}: {'ok' if c.grads_ok else 'WRONG'} ({c.max_rel_err:.1e}; "
            f"{c.random_ops_recomputed} of {c.random_ops_in_graph} redrawn)")
