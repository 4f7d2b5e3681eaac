"""The remat planner: the segment plan of least recompute whose predicted peak fits a byte budget.

A chain of N blocks, and for every block a menu of options (store it; checkpoint it with no
policy; checkpoint it under a named policy; offload, where a policy offloads). Each option of
block i is a :class:`BlockOption` with three costs, all measured or computed elsewhere (from the
exact per-tensor account or a block's measured residuals; the builders of these menus are not in
this module): the bytes the block keeps from the forward pass until
its backward pass (``kept_bytes``), the bytes live for the block while its segment is recomputed
and run backward (``working_bytes``), and the FLOPs its recompute costs (``recompute_flops``).

**The memory model** is the chain model of :mod:`jaxremat.spec.cost` and
``jaxremat.models.gpt.activation._chain_peak`` (Chen et al. 2016, arXiv:1604.06174), in bytes
and with one option per segment. A plan cuts the chain into contiguous segments ``s_0 .. s_{m-1}``
(bottom first), segment j with option ``o_j``. With ``B`` the boundary bytes (one segment input),
``I`` the invariant bytes (kept once whatever the plan, e.g. JAX's hoisted mask broadcasts), and
for segment j

    K_j = sum_{i in s_j} kept_bytes_i(o_j) + E_j                        (kept from the forward)
    W_j = B * [o_j checkpointed] + sum_{i in s_j} working_bytes_i(o_j) + E_j + X_j  (live in its backward)
    X_j = max_{i in s_j} transient_bytes_i(o_j)      (one block's backward temporaries at a time)
    E_j = (len(s_j) - 1) * B * [o_j keeps_block_input] + S_j   (inputs of the blocks after the first)
    S_j = segment_bytes of s_j's first block under o_j      (kept once per segment, may be negative)
    C_j = sum_{i in s_j} recompute_flops_i(o_j),

the live bytes during segment j's backward pass (segments above j are done and freed; the inputs
of the j segments below and what they kept are still held) and at the end of the forward pass are

    live_j = I + j * B + sum_{k < j} K_k + W_j
    end    = I + sum_k (B * [o_k checkpointed] + K_k)

and the plan's predicted peak is ``max(end, max_j live_j)``; its recompute is ``sum_j C_j``. A
stored option keeps everything (``working_bytes == kept_bytes``, no recompute) and adds no
boundary of its own during its backward (as ``_chain_peak``: a stored segment's input is the
previous segment's output, counted by ``j * B``). Neighbouring stored segments are one segment
(one boundary), as :class:`jaxremat.spec.segment_plan.SegmentPlan` merges them; the planner
reports the peak of the merged plan. Since ``working_bytes >= kept_bytes``, ``end <= live_{m-1}``.

**The search space** (where the planner is exact): every cut of the chain into contiguous
segments, and for each segment one option of the menu, the same option index for every block of
the segment (the blocks' costs under it may differ block by block), each checkpointed segment at
least ``min_checkpoint_length`` blocks long (1 unless the caller asks for more). That is exactly the set of
one-level segment plans ``plan(L1+P1,L2:store,...)`` over the menu's policies. It leaves out:
nested segments (``nested(...)``, Rotor's recursive recompute of a segment's interior; Beaumont
et al. 2019 allow a segment to be re-checkpointed during its own backward), segments whose
blocks follow different policies, keeping a recomputed block's activations for a later segment
(Rotor's "F_all" choice), the timing of offload transfers (an offloaded tensor counts as off
the device from its forward to its segment's backward, on it while the segment runs backward),
working buffers of single ops (the transient workspace of one matmul or softmax), and the
memory of parameters, gradients and optimizer state.

**The algorithm** is a dynamic program over the chain in the Rotor family (Beaumont, Eyraud-Dubois,
Herrmann, Joly, Shilova, "Optimal checkpointing for heterogeneous chains: how to train deep neural
networks with limited memory", 2019, arXiv:1911.13214 / ACM TOMS 2021; Beaumont et al., "Efficient
combination of rematerialization and offloading for training DNNs", NeurIPS 2021; Zhao et al.,
"Rockmate: an efficient, fast, automatic and generic tool for re-materialization in PyTorch",
ICML 2023, arXiv:2307.01236, which plans a chain of blocks over a per-block menu of options as
here). ``f(a, r)``, the least recompute of blocks ``a..N-1`` when ``r`` bytes remain above what
lies below, is ``min over b > a and o of C(a,b,o) + f(b, r - B - K(a,b,o))`` over the choices
with ``W(a,b,o) <= r``, and ``f(N, r) = 0`` (nothing above the top segment; ``end`` needs no
constraint of its own). Bytes are counted in quanta of
``q = ceil((budget - I) / resolution)`` bytes (``q = 1``, no rounding, when the budget's free
bytes are at most ``resolution``); each segment's ``W`` and ``B + K`` are rounded *up* to whole
quanta, so the DP is exact for the rounded costs and its plan never exceeds the budget in true
bytes (its true peak is recomputed with the exact model, :func:`chain_costs`). Time is
``O(N^2 * len(menu) * resolution)``, vectorised over the budget axis.

**The cost** is ``C_j`` above, the recompute FLOPs, by default (``cost="flops"``). With
``cost="time"`` it is time: ``C_j = sum_{i in s_j} step_time_s_i(o_j) + segment_time_s`` of the
segment's first block under ``o_j``, each block's measured forward and backward time under the
option (recompute included; a stored block's too) plus a segment's fixed time, so that the plan
minimizes the stack's predicted step time. This module only sums the numbers; the frameworks
measure them (:mod:`jaxremat.block_time`, :mod:`torchref.block_time`).
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import re
from typing import Sequence

import numpy as np

from .policies import Policy, parse_policy
from .segment_plan import PlanSegment, SegmentPlan

__all__ = ["BlockOption", "Budget", "COSTS", "NoPlanFits", "PlannerResult", "chain_costs", "chain_time_s",
           "min_peak_plan", "parse_budget", "plan_chain", "plan_for_budget"]

DEFAULT_RESOLUTION = 1000
"""Default number of byte quanta the budget is cut into (see the module docstring)."""


@dataclasses.dataclass(frozen=True)
class BlockOption:
    """One way to run one block of the chain, with its costs (module docstring: the model).

    Attributes:
        name: the option's name in the menu (e.g. ``"store"``, ``"save_nothing"``, ``"save_dots"``).
        checkpointed: False for a stored block (kept whole, ``:store``), True for a recomputed one.
        policy: what a checkpointed block keeps inside itself (a policy name or
            :class:`jaxremat.spec.policies.Policy`, parsed to the Policy); None: the renderer's
            default policy (``remat_scan``'s ``policy=``; keep nothing when none is given).
            Must be None for a stored option.
        kept_bytes: bytes (int >= 0) the block keeps on the device from its forward pass until its
            backward pass (boundary excluded; the planner adds one boundary per segment).
        working_bytes: bytes (int >= ``kept_bytes``) live for the block while its segment is
            recomputed and run backward (what it kept plus what its recompute rebuilds); equals
            ``kept_bytes`` for a stored option.
        recompute_flops: FLOPs (number >= 0) the block's recompute costs; 0 for a stored option.
        keeps_block_input: True when, inside a checkpointed segment, the block's input is kept
            too unless the block is the segment's first (whose input is the segment boundary):
            a segment of L such blocks keeps ``(L - 1) * boundary_bytes`` more, in ``K`` and ``W``.
            Measured on ``jaxremat.remat_scan``: a segment under a policy that keeps anything
            keeps the carry of each block after the first (the inner scan's per-step input).
        segment_bytes: bytes (int, may be negative, ``kept_bytes + segment_bytes >= 0``) a segment
            whose first block this is keeps once, beyond its blocks' ``kept_bytes``: with
            ``kept_bytes`` the slope, the intercept of a segment's kept bytes against its length
            (e.g. ``-boundary`` for a block that keeps its own input, which for a segment's first
            block is the boundary, counted apart). Measured by :func:`jaxremat.planner.block_options`.
        transient_bytes: bytes (int >= 0) live on top of ``working_bytes`` while the block runs
            backward (its activation gradients and the backward ops' temporaries); a segment is
            charged the largest of its blocks', once, since its blocks run backward one at a time.
        step_time_s: seconds (number >= 0, or None: not measured) the block takes in one training
            step under this option: its forward pass plus its backward pass, recompute included; the
            cost ``plan_for_budget(..., cost="time")`` minimizes (measured by the frameworks' menus:
            :func:`jaxremat.block_time.timed_chain`, :func:`torchref.block_time.timed_chain`).
        segment_time_s: seconds (number >= 0) a segment whose first block this is costs once, beyond
            its blocks' ``step_time_s`` (the intercept of a segment's time against its length).

    Raises:
        ValueError: a negative or non-integer byte count, ``working_bytes < kept_bytes``, a
            stored option with a policy, recompute or ``working_bytes != kept_bytes``, an unknown
            policy, or an empty name.
    """

    name: str
    checkpointed: bool
    policy: "Policy | str | None" = None
    kept_bytes: int = 0
    working_bytes: int = 0
    recompute_flops: float = 0.0
    keeps_block_input: bool = False
    transient_bytes: int = 0
    segment_bytes: int = 0
    step_time_s: float | None = None
    segment_time_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a block option needs a non-empty name, got {self.name!r}")
        if not isinstance(self.checkpointed, bool):
            raise ValueError(f"option {self.name!r}: checkpointed must be True or False, got {self.checkpointed!r}")
        for field in ("kept_bytes", "working_bytes", "transient_bytes"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"option {self.name!r}: {field} must be an integer >= 0 (bytes), got {v!r}")
            object.__setattr__(self, field, int(v))
        f = self.recompute_flops
        if isinstance(f, bool) or not isinstance(f, (int, float, np.integer, np.floating)) or not f >= 0 \
                or not math.isfinite(f):
            raise ValueError(f"option {self.name!r}: recompute_flops must be a finite number >= 0, got {f!r}")
        object.__setattr__(self, "recompute_flops", float(f))
        for field in ("step_time_s", "segment_time_s"):
            t = getattr(self, field)
            if t is None and field == "step_time_s":
                continue
            if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)) or not t >= 0 \
                    or not math.isfinite(t):
                raise ValueError(f"option {self.name!r}: {field} must be a finite number >= 0 (seconds), got {t!r}")
            object.__setattr__(self, field, float(t))
        if self.working_bytes < self.kept_bytes:
            raise ValueError(f"option {self.name!r}: working_bytes ({self.working_bytes}) < kept_bytes "
                             f"({self.kept_bytes}); what a block keeps is live while it runs backward too")
        if self.policy is not None:
            object.__setattr__(self, "policy", parse_policy(self.policy))
        v = self.segment_bytes
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or self.kept_bytes + v < 0:
            raise ValueError(f"option {self.name!r}: segment_bytes must be an integer with kept_bytes + "
                             f"segment_bytes >= 0 (bytes), got {v!r}")
        if not self.checkpointed and v < 0:
            raise ValueError(f"stored option {self.name!r}: segment_bytes must be >= 0, got {v}: neighbouring stored "
                             "segments are one segment (one intercept), which a negative intercept would undercount")
        object.__setattr__(self, "segment_bytes", int(v))
        if not isinstance(self.keeps_block_input, bool):
            raise ValueError(f"option {self.name!r}: keeps_block_input must be True or False")
        if not self.checkpointed and (self.policy is not None or self.recompute_flops or self.keeps_block_input
                                      or self.working_bytes != self.kept_bytes):
            raise ValueError(f"stored option {self.name!r}: a stored block keeps everything and recomputes "
                             f"nothing: give no policy, recompute_flops=0, working_bytes == kept_bytes and "
                             f"keeps_block_input=False")


class NoPlanFits(ValueError):
    """No plan in the planner's search space fits the budget.

    Attributes:
        budget_bytes: the budget asked for (bytes).
        min_peak_bytes: the smallest predicted peak any plan of the space reaches (bytes).
        min_peak_plan: a plan reaching it (a :class:`jaxremat.spec.segment_plan.SegmentPlan`).
    """

    def __init__(self, budget_bytes: int, min_peak_bytes: int, min_peak_plan: SegmentPlan, message: str | None = None):
        self.budget_bytes, self.min_peak_bytes, self.min_peak_plan = budget_bytes, min_peak_bytes, min_peak_plan
        super().__init__(message or
            f"no plan fits a budget of {budget_bytes} bytes: the smallest predicted peak activation over every "
            f"one-level segment plan of this menu is {min_peak_bytes} bytes ({min_peak_plan.name}), "
            f"{min_peak_bytes - budget_bytes} bytes more; raise the budget to at least {min_peak_bytes} bytes, "
            f"or make the blocks keep less (a smaller batch or sequence, a policy that keeps less, offload)")


@dataclasses.dataclass(frozen=True)
class PlannerResult:
    """What :func:`plan_for_budget` found.

    Attributes:
        plan: the :class:`jaxremat.spec.segment_plan.SegmentPlan` (stored segments ``:store``,
            checkpointed ones with their option's policy); ``remat_scan``, ``remat_stack`` and
            torchref's ``forward_blocks`` take it (or its ``plan.name``) as the schedule.
        segment_options: the option name of each segment of ``plan``, bottom first.
        peak_bytes: its predicted peak activation bytes (exact model, true bytes, <= budget).
        recompute_flops: its recompute (FLOPs per training step, summed over blocks).
        budget_bytes: the budget asked for.
        min_peak_bytes: the smallest predicted peak of any plan in the space (bytes).
        quantum_bytes: the byte quantum of the DP (1: no rounding; module docstring).
        optimal: True when the plan is the least-recompute plan of the space for the costs rounded
            to ``quantum_bytes``; False when rounding left no plan but the least-peak plan fits the
            true budget, which is then returned (raise ``resolution`` for an optimal one).
        saved_bytes: the bytes held at the end of the forward pass (``end`` in the module
            docstring: invariants, one boundary per checkpointed segment, what the blocks keep).
        cost: what the plan minimized (:data:`COSTS`).
        step_time_s: with ``cost="time"``, the plan's predicted step time of the stack (seconds, the
            options' measured times summed); None with ``cost="flops"``.
    """

    plan: SegmentPlan
    segment_options: tuple
    peak_bytes: int
    recompute_flops: float
    budget_bytes: int
    min_peak_bytes: int
    quantum_bytes: int
    optimal: bool = True
    saved_bytes: int = 0
    cost: str = "flops"
    step_time_s: float | None = None


class _Menu:
    """Prefix sums of the options' costs: arrays of shape (options, N + 1)."""

    def __init__(self, options_per_block: Sequence[Sequence[BlockOption]], boundary_bytes: int,
                 min_checkpoint_length: int = 1, cost: str = "flops"):
        if isinstance(min_checkpoint_length, bool) or not isinstance(min_checkpoint_length, (int, np.integer)) \
                or min_checkpoint_length < 1:
            raise ValueError(f"min_checkpoint_length must be an integer >= 1 (blocks), got {min_checkpoint_length!r}")
        self.min_ckpt = int(min_checkpoint_length)
        blocks = [tuple(opts) for opts in options_per_block] if isinstance(options_per_block, (list, tuple)) else None
        if not blocks:
            raise ValueError(f"options_per_block must be a non-empty list (one menu per block), got {options_per_block!r}")
        first = blocks[0]
        if not first:
            raise ValueError("block 0 has an empty menu; give every block at least one BlockOption")
        for i, opts in enumerate(blocks):
            bad = [o for o in opts if not isinstance(o, BlockOption)]
            if bad:
                raise ValueError(f"block {i}: menu entries must be BlockOption values, got {bad[0]!r}")
            key = lambda o: (o.name, o.checkpointed, o.policy, o.keeps_block_input)  # noqa: E731
            if [key(o) for o in opts] != [key(o) for o in first]:
                raise ValueError(f"block {i}'s menu {[o.name for o in opts]} differs from block 0's "
                                 f"{[o.name for o in first]}: every block must list the same options (name, "
                                 "checkpointed, policy, keeps_block_input) in the same order; only their costs "
                                 "may differ")
        names = [o.name for o in first]
        if len(set(names)) != len(names):
            raise ValueError(f"option names must be distinct, got {names}")
        self.n, self.options = len(blocks), first
        self.boundary = boundary_bytes
        z = lambda f: np.concatenate([np.zeros((len(first), 1), dtype=np.int64 if f != "recompute_flops" else float),
                                      np.cumsum([[getattr(o, f) for o in opts] for opts in blocks], axis=0).T], axis=1)
        self.kept, self.work, self.flops = z("kept_bytes"), z("working_bytes"), z("recompute_flops")
        self.trans = np.array([[o.transient_bytes for o in opts] for opts in blocks], dtype=np.int64).T  # (O, N)
        self.ckpt = np.array([o.checkpointed for o in first])
        self.inputs = np.array([boundary_bytes if o.keeps_block_input else 0 for o in first], dtype=np.int64)
        self.seg = np.array([[o.segment_bytes for o in opts] for opts in blocks], dtype=np.int64).T  # (O, N)
        self.cost_name = _check_cost(cost, blocks)
        if cost == "time":  # the DP's cost: each block's measured step time, plus a segment's intercept
            self.cost = z("step_time_s")
            self.seg_cost = np.array([[o.segment_time_s for o in opts] for opts in blocks], dtype=float).T
        else:
            self.cost, self.seg_cost = self.flops, np.zeros(self.seg.shape)

    def segment_cost(self, a: int, b: int, o: int) -> float:
        """The DP's cost of blocks [a, b) under option o (FLOPs, or seconds with the segment's intercept)."""
        return float(self.cost[o, b] - self.cost[o, a] + self.seg_cost[o, a])

    def segment(self, a: int, b: int, o: int) -> tuple[int, int, float]:
        """(K, W, C) of blocks [a, b) under option o."""
        extra = (b - a - 1) * int(self.inputs[o]) + int(self.seg[o, a])
        w = (int(self.work[o, b] - self.work[o, a]) + (self.boundary if self.ckpt[o] else 0) + extra
             + int(self.trans[o, a:b].max()))
        return int(self.kept[o, b] - self.kept[o, a]) + extra, w, float(self.flops[o, b] - self.flops[o, a])

    def all_from(self, a: int):
        """K, W, C and (b, o) of every segment starting at block a: flat arrays, index = (b-a-1)*O + o."""
        O = len(self.options)
        extra = np.arange(self.n - a)[None, :] * self.inputs[:, None] + self.seg[:, a:a + 1]  # (L - 1) inputs, S
        K = (self.kept[:, a + 1:] - self.kept[:, a:a + 1] + extra).T.ravel()
        X = np.maximum.accumulate(self.trans[:, a:], axis=1)  # largest transient of blocks a..b-1
        W = ((self.work[:, a + 1:] - self.work[:, a:a + 1]) + self.boundary * self.ckpt[:, None] + extra + X).T.ravel()
        C = (self.cost[:, a + 1:] - self.cost[:, a:a + 1] + self.seg_cost[:, a:a + 1]).T.ravel()
        b = np.repeat(np.arange(a + 1, self.n + 1), O)
        o = np.tile(np.arange(O), self.n - a)
        if self.min_ckpt > 1:  # checkpointed segments shorter than the minimum are out of the space
            W = np.where(self.ckpt[o] & (b - a < self.min_ckpt), _OUT, W)
        return K, W, C, b, o


COSTS = ("flops", "time")
"""What the planner minimizes: ``"flops"`` (each option's ``recompute_flops``) or ``"time"`` (each option's
measured ``step_time_s`` plus its ``segment_time_s`` per segment)."""


def _check_cost(cost, blocks) -> str:
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {', '.join(COSTS)}, got {cost!r}")
    if cost == "time":
        missing = sorted({o.name for opts in blocks for o in opts if o.step_time_s is None})
        if missing:
            raise ValueError(f"cost='time' needs every option's measured step_time_s; {missing} have none "
                             "(measure them: jaxremat.block_time.timed_chain, torchref.block_time.timed_chain)")
    return cost


_OUT = np.int64(2**60)
"""The working bytes given to a segment outside the space (no budget reaches them)."""


MAX_BYTES = 2**63 - 1
"""The largest byte count the planner takes (int64's; 8 EiB, past any device's memory)."""


def _check_bytes(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ValueError(f"{name} must be an integer >= 0 (bytes), got {v!r}")
    if v > MAX_BYTES:
        raise ValueError(f"{name} is {v} bytes, past 2**63 - 1 (8 EiB, more than any device holds); a budget above "
                         "none's peak keeps every activation: give that peak, or 100% where a percentage is taken")
    return int(v)


def _merge(menu: _Menu, segs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(length, option index) segments with neighbouring stored ones merged (as SegmentPlan does)."""
    out: list[list[int]] = []
    for length, o in segs:
        if out and not menu.ckpt[o] and not menu.ckpt[out[-1][1]]:
            out[-1][0] += length
        else:
            out.append([length, o])
    return [(l, o) for l, o in out]


def _costs(menu: _Menu, segs, invariant: int) -> tuple[int, float, int, float]:
    """(peak bytes, recompute FLOPs, saved bytes, the DP's cost) of one plan (merged as it renders)."""
    peak, below, end, a, flops, cost = 0, invariant, invariant, 0, 0.0, 0.0
    for j, (length, o) in enumerate(_merge(menu, segs)):
        K, W, C = menu.segment(a, a + length, o)
        peak = max(peak, below + W)
        below += menu.boundary + K
        end += K + (menu.boundary if menu.ckpt[o] else 0)
        flops += C
        cost += menu.segment_cost(a, a + length, o)
        a += length
    return max(peak, end), flops, end, cost


def _resolve(menu: _Menu, segs) -> list[tuple[int, int]]:
    names = [o.name for o in menu.options]
    out = []
    for item in segs:
        length, opt = item
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError(f"segment length must be an integer >= 1 (blocks), got {length!r}")
        if isinstance(opt, str):
            if opt not in names:
                raise ValueError(f"unknown option {opt!r}; the menu has {names}")
            opt = names.index(opt)
        elif isinstance(opt, bool) or not isinstance(opt, (int, np.integer)) or not 0 <= opt < len(names):
            raise ValueError(f"option must be a name in {names} or an index 0..{len(names) - 1}, got {opt!r}")
        out.append((int(length), int(opt)))
    if sum(l for l, _ in out) != menu.n:
        raise ValueError(f"the segment lengths sum to {sum(l for l, _ in out)} blocks but the chain has {menu.n}")
    return out


def chain_costs(options_per_block: Sequence[Sequence[BlockOption]], segments: Sequence[tuple],
                boundary_bytes: int, invariant_bytes: int = 0) -> tuple[int, float, int]:
    """The exact model's (peak bytes, recompute FLOPs, saved bytes) of one plan (module docstring).

    ``saved bytes`` is ``end``: what is held at the end of the forward pass.

    Args:
        options_per_block: N menus, one per block (the same option names in the same order).
        segments: ``(length, option)`` pairs, bottom first; ``option`` a name or an index into the
            menu. Neighbouring stored segments are merged first, as in a SegmentPlan.
        boundary_bytes: bytes of one segment input (e.g. a (B, T, D) activation).
        invariant_bytes: bytes held once whatever the plan.

    Raises:
        ValueError: bad menus or byte counts, an unknown option, or lengths not summing to N.
    """
    menu = _Menu(options_per_block, _check_bytes("boundary_bytes", boundary_bytes))
    return _costs(menu, _resolve(menu, segments), _check_bytes("invariant_bytes", invariant_bytes))[:3]


def chain_time_s(options_per_block: Sequence[Sequence[BlockOption]], segments: Sequence[tuple]) -> float:
    """The predicted step time (seconds) of the chain's blocks under one plan: each block's ``step_time_s``
    under its segment's option, plus each segment's ``segment_time_s`` (neighbouring stored segments merged
    first, as in :func:`chain_costs`, whose arguments these are).

    Raises:
        ValueError: an option without ``step_time_s``, or as :func:`chain_costs`.
    """
    menu = _Menu(options_per_block, 0, cost="time")
    return _costs(menu, _resolve(menu, segments), 0)[3]


def _to_plan(menu: _Menu, segs) -> tuple[SegmentPlan, tuple]:
    merged = _merge(menu, segs)
    items = [PlanSegment(l, bool(menu.ckpt[o]), menu.options[o].policy) for l, o in merged]
    return SegmentPlan(tuple(items)), tuple(menu.options[o].name for _, o in merged)


def _min_peak(menu: _Menu, invariant: int) -> tuple[int, list]:
    """Exact least peak over the space: g(a) = min_{b,o} max(W, B + K + g(b)), g(N) = 0.

    As in :func:`_least_recompute`, a stored segment is never followed by another (state ``s``:
    the segment below was stored), so that every plan is costed as the merged plan it renders to."""
    n = menu.n
    g = np.zeros((2, n + 1), dtype=np.int64)
    choice = [[None] * n, [None] * n]
    for a in range(n - 1, -1, -1):
        K, W, _, b, o = menu.all_from(a)
        nxt = (~menu.ckpt[o]).astype(np.int64)  # the state above: 1 after a stored segment
        need = np.minimum(np.where(b == n, W, np.maximum(W, menu.boundary + K + g[nxt, b])), _OUT)
        for state in (0, 1):
            cand = np.where(nxt.astype(bool), _OUT, need) if state else need
            k = int(np.argmin(cand))
            g[state, a], choice[state][a] = cand[k], (int(b[k]), int(o[k]))
    if g[0, 0] >= _OUT:
        raise ValueError(f"no plan has every checkpointed segment at least {menu.min_ckpt} blocks long: the "
                         f"chain has {n} blocks and the menu no stored option; lower min_checkpoint_length "
                         "or add 'store' to the menu")
    segs, a, state = [], 0, 0
    while a < n:
        b, o = choice[state][a]
        segs.append((b - a, o))
        a, state = b, int(not menu.ckpt[o])
    return _costs(menu, segs, invariant)[0], segs


def min_peak_plan(options_per_block: Sequence[Sequence[BlockOption]], boundary_bytes: int,
                  invariant_bytes: int = 0, *, min_checkpoint_length: int = 1) -> tuple[int, SegmentPlan]:
    """The smallest predicted peak (bytes) over the planner's space, and a plan reaching it (exact).

    ``min_checkpoint_length`` as in :func:`plan_for_budget`.

    Raises:
        ValueError: bad menus or byte counts, or no plan with checkpointed segments that long.
    """
    menu = _Menu(options_per_block, _check_bytes("boundary_bytes", boundary_bytes), min_checkpoint_length)
    peak, segs = _min_peak(menu, _check_bytes("invariant_bytes", invariant_bytes))
    return peak, _to_plan(menu, segs)[0]


def _least_recompute(menu: _Menu, avail: int, q: int):
    """The quantised DP: segments of the least-recompute plan within ``avail`` free bytes, or None.

    ``f[s, a, r]``: state ``s = 1`` when the segment below block ``a`` is stored, which forbids a
    stored segment at ``a``: neighbouring stored segments render as one (merged) segment, whose
    cost is not the sum of the pieces', and a stored run of any length is a choice of its own."""
    n, R = menu.n, avail // q
    ri = np.arange(R + 1)
    f = np.full((2, n + 1, R + 1), np.inf)
    f[:, n] = 0.0
    pick = np.zeros((2, n, R + 1), dtype=np.int64)
    starts = []
    for a in range(n - 1, -1, -1):
        K, W, C, b, o = menu.all_from(a)
        nxt = (~menu.ckpt[o]).astype(np.int64)
        d = -(-(menu.boundary + K) // q)
        wq = -(-W // q)
        col = ri[None, :] - d[:, None]
        ok = ((col >= 0) | (b == n)[:, None]) & (ri[None, :] >= wq[:, None])  # the top segment: W only
        vals = np.where(ok, f[nxt[:, None], b[:, None], np.maximum(col, 0)] + C[:, None], np.inf)
        for state in (0, 1):
            v = np.where(nxt.astype(bool)[:, None], np.inf, vals) if state else vals
            # ties on recompute go to the choice that leaves the most bytes for the blocks above
            best = v.min(axis=0)
            k = np.where(v == best[None, :], d[:, None], np.iinfo(np.int64).max).argmin(axis=0)
            f[state, a] = v[k, ri]
            pick[state, a] = k
        starts.append((b, o, d))
    starts.reverse()
    if not np.isfinite(f[0, 0, R]):
        return None
    segs, a, r, state = [], 0, R, 0
    while a < n:
        b, o, d = starts[a]
        k = pick[state, a, r]
        segs.append((int(b[k]) - a, int(o[k])))
        a, r, state = int(b[k]), r - int(d[k]), int(not menu.ckpt[int(o[k])])
    return segs


def plan_for_budget(options_per_block: Sequence[Sequence[BlockOption]], budget_bytes: int, boundary_bytes: int,
                    invariant_bytes: int = 0, *, resolution: int = DEFAULT_RESOLUTION,
                    min_checkpoint_length: int = 1, cost: str = "flops") -> PlannerResult:
    """The segment plan of least recompute (or least measured time) whose predicted peak fits ``budget_bytes``.

    Exact over the space of one-level segment plans of the menu (module docstring: the model, the
    space, what it leaves out, the DP and its sources: Beaumont et al. 2019/2021, Rotor; Zhao et al.
    2023, Rockmate).

    Example::

        store = BlockOption("store", False, kept_bytes=100, working_bytes=100)
        ckpt = BlockOption("save_nothing", True, "save_nothing", kept_bytes=0, working_bytes=100,
                           recompute_flops=1e9)
        r = plan_for_budget([[store, ckpt]] * 16, budget_bytes=1000, boundary_bytes=10)
        r.recompute_flops  # 7e9: 7 of the 16 blocks are recomputed, r.peak_bytes == 970 <= 1000
        r.plan.name       # 'plan(1*7+save_nothing,9:store)'

    Args:
        options_per_block: N >= 1 menus, one per block, bottom first; every menu lists the same
            options (name, checkpointed, policy) in the same order, their costs may differ.
        budget_bytes: the byte budget (int >= 0) for the predicted peak activation bytes.
        boundary_bytes: bytes of one segment input (int >= 0), e.g. B*T*D*itemsize for a GPT.
        invariant_bytes: bytes (int >= 0) held once whatever the plan (counted in every peak).
        resolution: the number of byte quanta the free budget is cut into (int >= 1): time and
            memory grow with it; with at most this many free bytes the DP is exact in bytes.
        min_checkpoint_length: the shortest checkpointed segment (blocks, int >= 1) the space
            holds; stored segments may be of any length. A renderer that is not bitwise on
            one-block segments (JAX under ``jit`` at some shapes: a scan of trip count 1 is
            inlined and XLA fuses it differently) plans with 2.
        cost: what the plan minimizes (:data:`COSTS`): ``"flops"``, the options' ``recompute_flops``;
            ``"time"``, their measured ``step_time_s`` (each block's forward and backward pass,
            recompute included) plus ``segment_time_s`` per segment: the predicted step time of
            the stack. The memory model and the space are the same.

    Returns:
        A :class:`PlannerResult`; its ``plan`` goes straight to ``remat_scan`` / ``remat_stack`` /
        torchref's ``forward_blocks``. Among plans of equal
        recompute, each segment from the bottom up is the one keeping the fewest bytes (then the
        shortest, then the lowest option index).

    Raises:
        NoPlanFits: no plan of the space has a predicted peak <= ``budget_bytes`` (a ValueError
            giving the smallest achievable peak and a plan reaching it).
        ValueError: bad menus (empty, not BlockOption values, differing between blocks, duplicate
            names), negative or non-integer byte counts, a bad resolution or min_checkpoint_length,
            or no plan with checkpointed segments that long (a menu without ``store``), an unknown
            ``cost``, or ``cost="time"`` with an option whose ``step_time_s`` is None.
    """
    menu = _Menu(options_per_block, _check_bytes("boundary_bytes", boundary_bytes), min_checkpoint_length, cost)
    budget, inv = _check_bytes("budget_bytes", budget_bytes), _check_bytes("invariant_bytes", invariant_bytes)
    if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 1:
        raise ValueError(f"resolution must be an integer >= 1 (byte quanta), got {resolution!r}")
    least_peak, least_segs = _min_peak(menu, inv)
    if least_peak > budget:
        raise NoPlanFits(budget, least_peak, _to_plan(menu, least_segs)[0])
    avail = budget - inv
    q = max(1, -(-avail // resolution))
    segs = _least_recompute(menu, avail, q)
    optimal = segs is not None
    if segs is None:  # rounding up to whole quanta lost every plan, but the least-peak one fits
        segs = least_segs
    stored = [o for o, opt in enumerate(menu.options) if not opt.checkpointed]
    if stored and _costs(menu, segs, inv)[3] > 0:
        # storing every block recomputes nothing; rounding to quanta can lose it when its peak is within a
        # quantum of the budget (a budget of exactly none's peak), so its true peak is checked too
        whole = [(menu.n, stored[0])]
        peak_w, _, _, cost_w = _costs(menu, whole, inv)
        if peak_w <= budget and cost_w < _costs(menu, segs, inv)[3]:
            segs, optimal = whole, True
    peak, flops, end, total = _costs(menu, segs, inv)
    if peak > budget:  # cannot happen: every rounding is upwards
        raise AssertionError(f"planner bug: plan peak {peak} > budget {budget}")
    plan, names = _to_plan(menu, segs)
    return PlannerResult(plan, names, peak, flops, budget, least_peak, q, optimal, end, cost,
                         total if cost == "time" else None)


def plan_chain(chain: dict, budget_bytes: int, **kw) -> PlannerResult:
    """:func:`plan_for_budget` on a model's chain, the budget on the whole step's scale.

    Args:
        chain: ``{"options_per_block", "boundary_bytes", "invariant_bytes", "fixed_bytes"}`` as the
            frameworks' chain builders return it (:func:`jaxremat.planner.model_chain`,
            :func:`torchref.planner.model_chain`); ``fixed_bytes`` are held outside the stack at
            the peak, whatever the plan.
        budget_bytes: peak activation bytes allowed for the whole step (int >= 0).
        **kw: passed to :func:`plan_for_budget` (``resolution``, ``min_checkpoint_length``, ``cost``).

    Returns:
        The :class:`PlannerResult` with ``peak_bytes``, ``min_peak_bytes`` and ``budget_bytes`` on
        the whole step's scale (the stack's plus ``fixed_bytes``).

    Raises:
        NoPlanFits: no plan fits (the least achievable whole-step peak, and a plan reaching it).
        ValueError: a negative or non-integer budget, or as :func:`plan_for_budget`.
    """
    _check_bytes("budget_bytes", budget_bytes)
    fixed = int(chain["fixed_bytes"])
    try:
        res = plan_for_budget(chain["options_per_block"], max(0, int(budget_bytes) - fixed), chain["boundary_bytes"],
                              chain["invariant_bytes"], **kw)
    except NoPlanFits as exc:  # restate it on the budget's scale: the whole step's activations
        raise NoPlanFits(int(budget_bytes), exc.min_peak_bytes + fixed, exc.min_peak_plan) from None
    return dataclasses.replace(res, peak_bytes=res.peak_bytes + fixed, budget_bytes=int(budget_bytes),
                               min_peak_bytes=res.min_peak_bytes + fixed)


_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_BUDGET = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+)\s*(%|[A-Za-z]*)\s*$")
_BUDGET_FORMS = ("a percentage of none's peak activation bytes (50%) or bytes with a unit (12MiB, 800KB, "
                 "12000000B); units: B, KB, MB, GB, KiB, MiB, GiB")


@dataclasses.dataclass(frozen=True)
class Budget:
    """A memory budget: a fraction of a reference (``50%``: of ``none``'s peak activation bytes) or bytes.

    Attributes:
        text: the canonical spelling (``"50%"``, ``"12MiB"``, ``"4096B"``).
        fraction: the fraction of the reference (0 < f <= 1), or None for an absolute budget.
        bytes: the absolute budget in bytes, or None for a fraction.
    """

    text: str
    fraction: float | None = None
    bytes: int | None = None

    def resolve(self, reference_bytes: int) -> int:
        """The budget in bytes: ``floor(fraction * reference_bytes)``, or the absolute bytes."""
        return int(self.bytes) if self.bytes is not None else int(math.floor(self.fraction * reference_bytes))


def parse_budget(text: str) -> Budget:
    """Parse ``N%`` (0 < N <= 100, of the reference) or ``N<unit>``, unit one of ``B, KB, MB, GB, KiB, MiB, GiB``
    (bytes; 1 KiB = 1024 B). A bare number is refused: ``12`` could be bytes, a percentage or MiB (an API that
    takes bytes takes an int, e.g. :func:`jaxremat.spec.fit.fit_plan`).

    Raises:
        ValueError: a bare number (the message asks for a unit), a budget not above 0, a percentage over 100, a
            budget under one byte, or anything else.
    """
    m = _BUDGET.match(text) if isinstance(text, str) else None
    if m is None or m.group(2).upper() not in {*_UNITS, "%", ""}:
        raise ValueError(f"budget {text!r}: write {_BUDGET_FORMS}")
    exact, unit = decimal.Decimal(m.group(1)), m.group(2)
    value = float(exact)
    # the digits as given, less a '+' and trailing zeros, never in exponent form (12000000B, 0.0000001%): the
    # canonical text is parsed again by whoever reads it (each framework of the estimate command)
    number = format(exact.normalize(), "f")
    if not unit:
        raise ValueError(f"budget {text!r} has no unit: write {_BUDGET_FORMS}")
    if unit == "%":
        if not 0 < value <= 100:
            raise ValueError(f"budget {text!r}: a percentage must lie in (0%, 100%] (100% is none's own peak)")
        return Budget(f"{number}%", fraction=float(exact / 100))
    if value <= 0:
        raise ValueError(f"budget {text!r}: a budget must be above 0 bytes; write {_BUDGET_FORMS}")
    nbytes = int(exact * _UNITS[unit.upper()])
    if nbytes < 1:
        raise ValueError(f"budget {text!r} is under one byte")
    if nbytes > MAX_BYTES:
        raise ValueError(f"budget {text!r} is past 2**63 - 1 bytes (8 EiB, more than any device holds); a budget "
                         "of none's peak or more keeps every activation: write 100%")
    spelled = {"KIB": "KiB", "MIB": "MiB", "GIB": "GiB"}.get(unit.upper(), unit.upper())
    return Budget(f"{number}{spelled}", bytes=nbytes)
