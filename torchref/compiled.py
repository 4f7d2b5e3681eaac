"""PyTorch's own compiler-assisted remat, measured the way the eager plans are.

:func:`measure_compiled` compiles the GPT's loss (schedule ``none``) with ``torch.compile`` while
``torch._functorch.config.activation_memory_budget`` holds a budget. AOT Autograd's min-cut
partitioner (``torch._functorch.partitioners.min_cut_rematerialization_partition``) then decides
which forward values the backward keeps and which it recomputes: at budget 1.0 it keeps what the
min-cut chooses (the default partitioner), below 1.0 it recomputes more until the saved bytes fit
the budget's fraction of what 1.0 would keep. The measurement then counts, with the project's own
counters, the saved bytes (:class:`torchref.memory.SavedActivationRecorder`), the step's peak
(:func:`torchref.live_bytes.step_peak_bytes`, the depth sweep's ``live_bytes`` counter, and
MemTracker via :func:`torchref.memory.peak_step_bytes`), the FLOPs of one step
(``torch.utils.flop_counter.FlopCounterMode``), the step time and how far loss and gradients are
from eager ``none``.

Two facts of torch 2.13 shape the measurement (checked by ``tests/torchref/test_compiled.py``):

- Dynamo does not compile, and with ``fullgraph=True`` refuses to run, a frame while a
  non-infra ``TorchDispatchMode`` is active ("non-infra torch dispatch mode present"):
  ``FlopCounterMode``, :class:`torchref.live_bytes.LiveBytesTracker` and MemTracker are such
  modes. Without ``fullgraph`` the frame would silently run *eagerly* under the counter. So the
  measurement wraps the backend: the callable the backend returns (AOT Autograd's compiled
  function, the one the compiled frame calls) is kept with the arguments Dynamo passed it, and the
  counters run that callable directly. The saved bytes are the same through the frame and
  through the callable (tested).
- :meth:`torchref.model.GPT.check_inputs` reads token values (``int(idx.min())``) and branches on
  them, a data-dependent graph break; it skips that check while compiling and
  :func:`measure_compiled` checks the tokens eagerly first, so the loss compiles as one graph
  (``fullgraph=True``).

Run ``python -m parity.experiments.compiled_budget --budgets 1,0.5,0.2,0.1,0.05 --threads 1`` for the table of
``docs/torch-compile-budget.md``.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch._dynamo
import torch._functorch.config
import torch._inductor.config
from torch.utils.flop_counter import FlopCounterMode

from jaxremat.models.config import TransformerConfig
from jaxremat.models.params import init_params
from jaxremat.spec import parse_schedule

from .compiled_random import (RANDOM_OPS, GradCheck, check_compiled_grads, check_text, compile_backend, compiled_problem,
                              grads_verdict, max_ulp_distance)
from .live_bytes import step_peak_bytes
from .memory import SavedActivationRecorder, peak_step_bytes
from .model import GPT, split_tokens
from .render import model_loss

_SEED = 0  # torch.manual_seed before the eager reference step and the compiled one
BACKENDS = ("aot_eager_decomp_partition", "inductor")
"""The backends :func:`measure_compiled` accepts: both run AOT Autograd with the min-cut partitioner."""

SAVED_SOURCE = ("torchref.memory.SavedActivationRecorder (saved_tensors_hooks) around one forward of the "
                "backend's compiled function; AOT Autograd's CompiledFunction saves through "
                "ctx.save_for_backward, so each saved tensor reaches the hook; parameters and buffers excluded")
PEAK_SOURCE = ("torchref.live_bytes (storages allocated during the step, the compiled function called directly) "
               "+ parameters, buffers and gradients")
PEAK_ACTIVATION_SOURCE = "torchref.live_bytes (storages allocated during the step; = MemTracker less PARAM, GRAD, OPT)"
FLOPS_SOURCE = ("torch.utils.flop_counter.FlopCounterMode around one forward+backward of the compiled function "
                "called directly (the graphs' matmuls reach the mode as aten ops: aot_eager runs aten ops, inductor "
                "calls aten's matmul kernels)")


@dataclasses.dataclass(frozen=True)
class CompiledResult:
    """One compiled step at one activation memory budget.

    Attributes:
        budget: ``torch._functorch.config.activation_memory_budget`` during compilation, in (0, 1].
        backend: the ``torch.compile`` backend (one of :data:`BACKENDS`).
        saved_bytes: bytes the compiled forward keeps for the backward (parameters and buffers
            excluded), counted once per storage.
        saved_source: how ``saved_bytes`` was counted.
        saved_tensors: how many storages ``saved_bytes`` counts.
        saved_shapes: the shape of each counted storage's first tensor, in the order saved.
        peak_bytes: peak bytes of one step (forward + backward, gradients already allocated):
            ``peak_activation_bytes`` plus the bytes of parameters, buffers and gradients, as the
            depth sweep's ``live_bytes`` counter reports it.
        peak_activation_bytes: bytes of the storages allocated during the step, at their peak.
        peak_source: how ``peak_bytes`` was measured.
        memtracker_peak_bytes: the same step's peak under MemTracker
            (:func:`torchref.memory.peak_step_bytes`; parameters and gradients included).
        memtracker_activation_bytes: ``memtracker_peak_bytes`` less its PARAM, BUFFER, GRAD and OPT
            categories.
        loss: the compiled step's loss (float).
        grads_bitwise_equal: loss and every gradient equal eager ``none``'s bit for bit.
        max_ulp: the largest distance, in units in the last place, between the compiled step's loss
            or gradients and eager ``none``'s (0 when bitwise equal; -1 when a value is NaN).
            A gradient that is zero in exact arithmetic (the key part of ``c_attn``'s bias: softmax
            ignores a per-row shift) is ~1e-12 of either sign in float32, so one sign flip makes
            this distance ~1e9; read it with ``max_rel_err``.
        max_abs_diff: the largest absolute difference of those values.
        max_rel_err: the largest ``max|compiled - eager| / max|eager|`` over loss and gradient arrays.
        grads_rel_bound: the bound ``max_rel_err`` is held to
            (:data:`torchref.compiled_random.GRADS_REL_BOUND`; None: no bound stated for the dtype).
        grads_ok: gradients bitwise equal to eager ``none`` or within ``grads_rel_bound``.
        random_ops: how the partition treats random ops (:data:`torchref.compiled_random.RANDOM_OPS`).
        random_ops_in_graph: random nodes in the compiled joint graph.
        random_ops_recomputed: random nodes in its backward graph (masks drawn again).
        random_op_check: for a model without dropout, the same budget's gradient check on the
            model with dropout ``random_op_dropout`` (:class:`torchref.compiled_random.GradCheck`);
            None when the model has dropout (the main check covers it) or the check is off.
        flops: FLOPs of one forward+backward of the compiled step (None if not counted).
        eager_flops: FLOPs of one forward+backward of eager ``none``.
        recompute_flops: ``flops - eager_flops``: what the partitioner recomputes (None if not counted).
        flops_source: how the FLOPs were counted.
        step_time_s: median seconds of ``repeats`` timed steps (through the compiled frame, after warm-up).
        step_times_s: every timed step, seconds.
        compile_s: seconds of the first call (Dynamo trace, AOT Autograd, partition, backend).
        compiles: how many graphs the backend compiled (1: one graph, no recompile).
        eager_saved_bytes: eager ``none``'s saved bytes, counted the same way.
        eager_peak_activation_bytes: eager ``none``'s peak activation bytes, counted the same way.
        eager_step_time_s: median seconds of ``repeats`` eager ``none`` steps, after one warm-up.
    """

    budget: float
    backend: str
    saved_bytes: int
    saved_source: str
    saved_tensors: int
    saved_shapes: tuple[tuple[int, ...], ...]
    peak_bytes: int
    peak_activation_bytes: int
    peak_source: str
    memtracker_peak_bytes: int
    memtracker_activation_bytes: int
    loss: float
    grads_bitwise_equal: bool
    max_ulp: int
    max_abs_diff: float
    max_rel_err: float
    grads_rel_bound: float | None
    grads_ok: bool | None
    random_ops: str
    random_ops_in_graph: int
    random_ops_recomputed: int
    random_op_check: GradCheck | None
    flops: int | None
    eager_flops: int
    recompute_flops: int | None
    flops_source: str
    step_time_s: float
    step_times_s: tuple[float, ...]
    compile_s: float
    compiles: int
    eager_saved_bytes: int
    eager_peak_activation_bytes: int
    eager_step_time_s: float


def _timed(step: Callable[[], Any], repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``step()`` after one warm-up call."""
    step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def _flops(step: Callable[[], Any]) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def measure_compiled(cfg: TransformerConfig, params: Mapping[str, np.ndarray], tokens: np.ndarray,
                     budget: float, *, backend: str = "aot_eager_decomp_partition",
                     repeats: int = 3, random_ops: str = "save", random_op_dropout: float = 0.1) -> CompiledResult:
    """Compile the GPT's loss under an activation memory budget and measure one step.

    The loss is :func:`torchref.render.model_loss` with schedule ``none`` on
    ``torchref.model.GPT.from_params(cfg, params)``, compiled with
    ``torch.compile(loss, backend=backend, fullgraph=True)`` after ``torch._dynamo.reset()``, and
    first called (that is when it compiles) inside
    ``torch._functorch.config.patch(activation_memory_budget=budget)``; every later call stays
    inside the patch too, so a recompile would see the same budget. The partition is AOT
    Autograd's ``torch._functorch.partitioners.min_cut_rematerialization_partition`` (both
    backends use it), given as :class:`torchref.compiled_random.RandomOpsPartition`: with
    ``random_ops="save"`` random ops are never recomputed (below 1.0 torch's own partition redraws
    dropout masks in the backward). The counters run the backend's compiled function directly (see
    the module docstring: Dynamo skips frames under a dispatch mode).

    Loss and gradients are checked against eager ``none`` (:mod:`torchref.compiled_random`: same seed,
    ``fallback_random=True``, bitwise or within ``GRADS_REL_BOUND``), and for a model without dropout
    once more on the same weights with dropout ``random_op_dropout`` (``random_op_check``): a
    random-op model, so that a partition that redraws masks shows as failing (:func:`compiled_problem`).

    Args:
        cfg: a GPT-family configuration (``arch="gpt"``).
        params: the canonical parameter dict (:func:`jaxremat.models.params.init_params`).
        tokens: ``(B, T+1)`` integer token ids.
        budget: the value of ``torch._functorch.config.activation_memory_budget``, in (0, 1]:
            1.0 is the default partitioner, smaller values ask the partitioner to keep at most that
            fraction of what it keeps at 1.0 (it recomputes the rest in the backward).
        backend: ``"aot_eager_decomp_partition"`` (the min-cut partition with inductor's
            decompositions, graphs run as aten ops; seconds to compile on CPU) or ``"inductor"``.
        repeats: timed steps after the warm-up (>= 1).
        random_ops: ``"save"`` or ``"recompute"`` (:data:`torchref.compiled_random.RANDOM_OPS`).
        random_op_dropout: the dropout rate of the random-op check, in [0, 1) (0: no such check).

    Returns:
        :class:`CompiledResult` (bytes in bytes, times in seconds, FLOPs as counted by
        ``FlopCounterMode``, 2 per multiply-add).

    Raises:
        ValueError: ``budget`` outside (0, 1] or not a number; ``backend`` not in :data:`BACKENDS`;
            ``repeats < 1``; ``random_ops`` unknown or ``random_op_dropout`` outside [0, 1);
            ``cfg.arch`` not ``"gpt"``; bad tokens (:meth:`torchref.model.GPT.check_inputs`).
        RuntimeError: the backend compiled no graph, or a counter saw no allocation.
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not (0.0 < float(budget) <= 1.0):
        raise ValueError(f"budget must be a number in (0, 1] (torch._functorch.config.activation_memory_budget), "
                         f"got {budget!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if random_ops not in RANDOM_OPS:
        raise ValueError(f"random_ops must be one of {RANDOM_OPS}, got {random_ops!r}")
    if not 0.0 <= random_op_dropout < 1.0:
        raise ValueError(f"random_op_dropout must be in [0, 1), got {random_op_dropout!r}")
    if cfg.arch != "gpt":
        raise ValueError(f"measure_compiled takes a GPT-family config (arch='gpt'), got arch={cfg.arch!r}")
    budget = float(budget)
    schedule = parse_schedule("none")
    tok = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    model = GPT.from_params(cfg, dict(params))
    model.check_inputs(split_tokens(tok)[0])  # eagerly: the compiled graph skips the value check

    # eager `none`: reference loss, gradients and FLOPs (dropout masks drawn from the seed, as compiled below)
    torch.manual_seed(_SEED)
    eager_loss = model_loss(model, tok, schedule)
    eager_loss.backward()
    ref = {"loss": eager_loss.detach().numpy().copy(), **model.to_params(grads=True)}
    eager_flops = _flops(lambda: model_loss(model, tok, schedule).backward())
    excluded = [*model.parameters(), *model.buffers()]
    recorder = SavedActivationRecorder(exclude=excluded)
    with recorder:
        kept = model_loss(model, tok, schedule)
    del kept
    eager_saved = int(recorder.total_bytes)

    def eager_step() -> None:
        model.zero_grad(set_to_none=False)
        model_loss(model, tok, schedule).backward()

    eager_act = step_peak_bytes(eager_step, [*excluded, *(p.grad for p in model.parameters())])
    eager_times = _timed(eager_step, repeats)

    inner_backend, partition = compile_backend(backend, random_ops)
    captured: dict[str, Any] = {"compiles": 0}

    def capturing_backend(gm, example_inputs):
        compiled = inner_backend(gm, example_inputs)
        captured["compiles"] += 1

        def call(*args):
            captured["fn"], captured["args"] = compiled, args
            return compiled(*args)

        return call

    def loss_fn(t):
        return model_loss(model, t, schedule)

    torch._dynamo.reset()
    with torch._functorch.config.patch(activation_memory_budget=budget), \
            torch._inductor.config.patch(fallback_random=True):  # masks drawn as eager draws them
        compiled_loss = torch.compile(loss_fn, backend=capturing_backend, fullgraph=True)
        model.zero_grad(set_to_none=False)  # gradients stay allocated: constant, added as fixed bytes
        torch.manual_seed(_SEED)
        t0 = time.perf_counter()
        loss = compiled_loss(tok)
        compile_s = time.perf_counter() - t0
        if "fn" not in captured:
            raise RuntimeError(f"torch.compile(backend={backend!r}) compiled no graph for the loss")
        loss.backward()
        got = {"loss": loss.detach().numpy().copy(), **model.to_params(grads=True)}
        loss_value = float(loss.detach())
        del loss

        def direct() -> torch.Tensor:
            out = captured["fn"](*captured["args"])
            return out[0] if isinstance(out, (list, tuple)) else out

        def step_direct() -> None:
            model.zero_grad(set_to_none=False)
            direct().backward()

        def step_frame() -> None:
            model.zero_grad(set_to_none=False)
            compiled_loss(tok).backward()

        recorder = SavedActivationRecorder(exclude=excluded)
        with recorder:
            kept = direct()
        del kept

        fixed = [*excluded, *(p.grad for p in model.parameters())]
        act = step_peak_bytes(step_direct, fixed)
        fixed_bytes = sum(t.untyped_storage().nbytes() for t in fixed)
        tracked = peak_step_bytes(step_direct, model)
        tracked_act = tracked.peak_bytes - sum(v for k, v in tracked.breakdown.items()
                                               if k in ("PARAM", "BUFFER", "GRAD", "OPT"))

        flops = _flops(step_direct)
        flops_source = FLOPS_SOURCE
        if backend == "inductor" and flops == 0:  # generated kernels run below the dispatcher
            flops, flops_source = None, "not counted: FlopCounterMode sees no aten op inside inductor's kernels"

        times = _timed(step_frame, repeats)

    equal, max_ulp, max_abs, max_rel = max_ulp_distance(got, ref)
    bound, ok = grads_verdict(equal, max_rel, cfg.dtype)
    check = None
    if cfg.dropout == 0 and random_op_dropout > 0:
        check = check_compiled_grads(cfg.replace(dropout=random_op_dropout), params, tokens, budget, backend=backend,
                                     random_ops=random_ops, seed=_SEED)
    return CompiledResult(
        budget=budget, backend=backend,
        saved_bytes=int(recorder.total_bytes), saved_source=SAVED_SOURCE, saved_tensors=len(recorder.records),
        saved_shapes=tuple(r["shape"] for r in recorder.records),
        peak_bytes=int(act + fixed_bytes), peak_activation_bytes=int(act), peak_source=PEAK_SOURCE,
        memtracker_peak_bytes=int(tracked.peak_bytes), memtracker_activation_bytes=int(tracked_act),
        loss=loss_value, grads_bitwise_equal=equal, max_ulp=max_ulp, max_abs_diff=max_abs, max_rel_err=max_rel,
        grads_rel_bound=bound, grads_ok=ok, random_ops=random_ops, random_ops_in_graph=partition.random_ops,
        random_ops_recomputed=partition.recomputed, random_op_check=check,
        flops=flops, eager_flops=eager_flops, recompute_flops=None if flops is None else flops - eager_flops,
        flops_source=flops_source, step_time_s=float(statistics.median(times)),
        step_times_s=tuple(float(t) for t in times), compile_s=float(compile_s), compiles=captured["compiles"],
        eager_saved_bytes=eager_saved, eager_peak_activation_bytes=int(eager_act),
        eager_step_time_s=float(statistics.median(eager_times)))
