"""One plan on one JAX mesh: sharded loss+gradients, AdamW steps and per-device memory.

The programs are those of the single-device runner (:mod:`parity.runners.jax_runner`): the
family's loss (:func:`parity.runners.jax_runner.objective`) under ``jax.value_and_grad``, and the
shared optax AdamW update, each jitted with ``in_shardings``/``out_shardings`` from
:mod:`jaxremat.sharding` -- the gradients come out sharded like the parameters, the AdamW moments
live sharded like them. The two programs stay apart as in the single-device runner (see
:meth:`parity.runners.jax_runner.Programs.train_step` for why).

Memory per device (:func:`device_memory`): parameter, gradient and optimizer-state bytes are the
shard sizes resident on device 0 (:func:`jaxremat.sharding.shard_bytes`); activations are the
compiled loss+gradient program's temp bytes (``memory_analysis()`` of an SPMD program is per
device); the peak is that program's peak (arguments + outputs + temp - aliases) plus the resident
optimizer state. On a GPU the allocator's peak of device 0 is recorded beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from jaxremat import sharding as shd
from jaxremat.memory import compiled_stats, device_peak_bytes, gpu_available
from jaxremat.models import param_shapes
from jaxremat.spec.plan import RematPlan
from parity.distributed.result import DeviceMemory
from parity.inputs.train import AdamWConfig
from parity.runners.jax_runner import objective, optimizer


@dataclasses.dataclass
class MeshRun:
    """What one plan gave on one mesh (host numpy copies of the full, unsharded arrays).

    Attributes:
        loss: first step's loss, 0-d numpy array in ``cfg.dtype``.
        grads: canonical name -> full gradient array.
        trained: canonical name -> full weights after ``hparams.steps`` AdamW steps.
        memory: per-device memory of the step.
        hlo: the compiled loss+gradient program's optimized HLO text (for the mechanism of a difference).
    """

    loss: np.ndarray
    grads: dict[str, np.ndarray]
    trained: dict[str, np.ndarray]
    memory: DeviceMemory
    hlo: str


@functools.lru_cache(maxsize=8)
def _tx(hparams: AdamWConfig):
    return optimizer(hparams)  # the harness's one optax.adamw


def _value_and_grad(cfg, plan: RematPlan, carry_sharding=None):
    loss = objective(cfg)
    extra = {} if carry_sharding is None else {"carry_sharding": carry_sharding}

    def value_and_grad(params, tokens):
        return jax.value_and_grad(loss)(params, tokens, cfg, plan, None, **extra)

    return value_and_grad


@functools.lru_cache(maxsize=64)
def compile_step(cfg, plan: RematPlan, mesh, spec, tokens_shape, carry_sharding: bool = True):
    """The loss+gradient program of ``plan`` compiled for ``mesh`` (``jax.stages.Compiled``).

    Inputs: parameters in :func:`jaxremat.sharding.param_shardings`, tokens ``(B, T+1)`` int32 in
    :func:`jaxremat.sharding.batch_sharding`; outputs: the replicated loss and the gradients sharded
    like the parameters. The residual stream is pinned to
    :func:`jaxremat.sharding.activation_sharding` at every block boundary; ``carry_sharding=False``
    leaves it to XLA's sharding propagation (only to show what the pin prevents:
    ``python -m parity.distributed.explain --mesh fsdp=4 --no-carry-sharding``). Compiled once per key
    (the ``none`` determinism run reuses it).
    """
    shapes = param_shapes(cfg)
    p_sh = shd.param_shardings(mesh, spec, shapes)
    b_sh = shd.batch_sharding(mesh, spec)
    pin = shd.activation_sharding(mesh, spec) if carry_sharding else None
    jitted = jax.jit(_value_and_grad(cfg, plan, pin), in_shardings=(p_sh, b_sh), out_shardings=(shd.replicated(mesh), p_sh))
    args = ({k: jax.ShapeDtypeStruct(v, jnp.dtype(cfg.dtype), sharding=p_sh[k]) for k, v in shapes.items()},
            jax.ShapeDtypeStruct(tokens_shape, jnp.int32, sharding=b_sh))
    return jitted.lower(*args).compile()


@functools.lru_cache(maxsize=16)
def _adamw_program(hparams: AdamWConfig, mesh, spec: str, cfg):
    """The AdamW update jitted for the mesh, shared by every plan (it does not depend on the plan)."""
    tx = _tx(hparams)
    p_sh = shd.param_shardings(mesh, spec, param_shapes(cfg))
    shapes = {k: jax.ShapeDtypeStruct(v, jnp.dtype(cfg.dtype)) for k, v in param_shapes(cfg).items()}
    o_sh = shd.opt_state_shardings(jax.eval_shape(tx.init, shapes), p_sh, mesh)

    def apply(grads, opt_state, params):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(apply, in_shardings=(p_sh, o_sh, p_sh), out_shardings=(p_sh, o_sh)), o_sh


def global_array(x: np.ndarray, sharding) -> jax.Array:
    """``x`` (the same full host array in every process) as a global array laid out by ``sharding``.

    Each process fills only its addressable shards (``jax.make_array_from_callback``), so this works
    in one process and in several (``jax.distributed.initialize``) alike; in one process it equals
    ``jax.device_put(x, sharding)`` byte for byte.
    """
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def host_copy(x: jax.Array) -> np.ndarray:
    """The full value of ``x`` as a host numpy array, in every process.

    A fully addressable array is copied; one spread over several processes is gathered whole with
    ``jax.experimental.multihost_utils.process_allgather(x, tiled=True)`` (a copy: no arithmetic, the
    bits unchanged).
    """
    if x.is_fully_addressable:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def run_plan(cfg, params_np: dict, tokens_np: np.ndarray, plan: RematPlan, spec: str, mesh, hparams: AdamWConfig,
             predicted: dict[str, int] | None = None, carry_sharding: bool = True) -> MeshRun:
    """Run ``plan`` on ``mesh``: loss, gradients, ``hparams.steps`` AdamW steps, memory per device.

    Args:
        cfg: model configuration (``cfg.dtype`` float32 or float64 under ``jax.enable_x64``).
        params_np: canonical parameters (numpy, full arrays).
        tokens_np: ``(B, T+1)`` int token ids, B divisible by the batch shards.
        plan: the remat plan.
        spec: the mesh spec of ``mesh``.
        mesh: the ``jax.sharding.Mesh``.
        hparams: AdamW settings; ``steps`` training steps.
        predicted: the memory prediction to store beside the measurement.
        carry_sharding: pin the residual stream at block boundaries (default; see :func:`compile_step`).

    The same code runs in each of several processes over one global mesh
    (:mod:`parity.distributed.jax_multiprocess`): every process passes the same full host arrays and
    gets the full results back (:func:`global_array`, :func:`host_copy`).
    """
    shapes = param_shapes(cfg)
    p_sh = shd.param_shardings(mesh, spec, shapes)
    params = {k: global_array(v, p_sh[k]) for k, v in params_np.items()}
    tokens = global_array(np.asarray(tokens_np, np.int32), shd.batch_sharding(mesh, spec))
    compiled = compile_step(cfg, plan, mesh, spec, tokens.shape, carry_sharding)
    loss, grads = jax.block_until_ready(compiled(params, tokens))
    apply, o_sh = _adamw_program(hparams, mesh, spec, cfg)
    opt_state = jax.jit(_tx(hparams).init, out_shardings=o_sh)(params)
    memory = device_memory(compiled, params, grads, opt_state, predicted or {},
                           device_step=lambda: compiled(params, tokens))
    p, state = params, opt_state
    for _ in range(hparams.steps):
        _, g = compiled(p, tokens)
        p, state = apply(g, state, p)
    jax.block_until_ready(p)
    return MeshRun(host_copy(loss), {k: host_copy(v) for k, v in grads.items()},
                   {k: host_copy(v) for k, v in p.items()}, memory, compiled.as_text())


def device_memory(compiled, params, grads, opt_state, predicted: dict[str, int], device_step=None) -> DeviceMemory:
    """Per-device memory of one step on device 0 (see the module docstring for each field)."""
    stats = compiled_stats(compiled)
    opt_bytes = shd.shard_bytes(opt_state)
    source = f"{stats['source']} per shard (SPMD program) + optimizer-state shards on device 0"
    if gpu_available() and device_step is not None:
        source += f"; device 0 allocator peak {device_peak_bytes(device_step)['peak_bytes']} bytes"
    return DeviceMemory(params_bytes=shd.shard_bytes(params), grads_bytes=shd.shard_bytes(grads),
                        opt_state_bytes=opt_bytes, activation_bytes=int(stats["temp_bytes"]),
                        peak_bytes=int(stats["peak_bytes"]) + opt_bytes, source=source, predicted=dict(predicted))


@functools.lru_cache(maxsize=64)
def _single_compiled(cfg, plan: RematPlan, tokens_shape):
    shapes = param_shapes(cfg)
    args = ({k: jax.ShapeDtypeStruct(v, jnp.dtype(cfg.dtype)) for k, v in shapes.items()},
            jax.ShapeDtypeStruct(tokens_shape, jnp.int32))
    return jax.jit(_value_and_grad(cfg, plan)).lower(*args).compile()


def single_compiled_hlo(cfg, plan: RematPlan, tokens_shape) -> str:
    """The optimized HLO text of ``plan``'s single-device loss+gradient program at ``tokens_shape``."""
    return _single_compiled(cfg, plan, tuple(tokens_shape)).as_text()


def single_device_grads(cfg, params_np: dict, tokens_np: np.ndarray, plan: RematPlan) -> tuple[np.ndarray, dict, int]:
    """Loss, gradients and compiled temp bytes of ``plan`` on ONE device (no sharding), for the references."""
    device = jax.devices()[0]
    params = {k: jax.device_put(np.asarray(v), device) for k, v in params_np.items()}
    tokens = jax.device_put(np.asarray(tokens_np, np.int32), device)
    compiled = _single_compiled(cfg, plan, tuple(tokens.shape))
    loss, grads = compiled(params, tokens)
    return np.asarray(loss), {k: np.asarray(v) for k, v in grads.items()}, int(compiled_stats(compiled)["temp_bytes"])


def mean_of_shard_grads(cfg, params_np: dict, tokens_np: np.ndarray, plan: RematPlan, shards: int) -> dict:
    """The data-parallel reference: each batch shard's single-device gradient, averaged on the host.

    The shards' gradients are summed in shard order and divided by ``shards`` in ``cfg.dtype``
    (numpy): ``(g0 + g1) / 2`` for two shards, the order an all-reduce of two operands cannot change.
    """
    parts = np.split(np.asarray(tokens_np), shards, axis=0)
    grads = [single_device_grads(cfg, params_np, t, plan)[1] for t in parts]
    out = {}
    for k in grads[0]:
        acc = grads[0][k].copy()
        for g in grads[1:]:
            acc = acc + g[k]
        out[k] = (acc / np.asarray(shards, acc.dtype)).astype(acc.dtype)
    return out


_SOURCE_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def hlo_program(hlo: str) -> str:
    """An optimized HLO text without its source information: the program two compilations can share.

    Drops the tables of Python source locations (``FileNames`` .. ``StackFrames``) and every
    ``metadata={...}`` (``op_name``, source file and line), which name the script that traced the
    program, and on loop fusions (``kind=kLoop``: every output element computed alone) XLA:CPU's
    ``outer_dimension_partitions``, how many threads share the loop (measured: ``["4"]`` in a process
    of 4 devices, ``["2"]`` in one of 2, for the same fusion); what is left (ops, shapes, shardings,
    fusions, schedule) is equal for equal programs.
    """
    out, skipping = [], False
    for line in hlo.splitlines():
        if line in _SOURCE_TABLES:
            skipping = True
        elif skipping and not line:
            skipping = False
        elif not skipping:
            line = re.sub(r", metadata=\{[^}]*\}", "", line)
            if "kind=kLoop" in line:
                line = re.sub(r', backend_config=\{"outer_dimension_partitions":\[[^\]]*\]\}', "", line)
            out.append(line)
    return "\n".join(out)


def count_collectives(hlo: str) -> dict[str, int]:
    """Collective ops in an optimized HLO text (``all-gather``, ``all-reduce``, ``reduce-scatter``, ``all-to-all``)."""
    return {op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(") for op in
            ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")}


def activation_all_reduces(hlo: str, shape: tuple[int, ...]) -> dict[str, int]:
    """All-reduces of an activation of global ``shape`` made by a matmul, by where they run.

    An SPMD matmul that splits its contraction dimension over devices sums the partial products with
    an all-reduce of its (global) output; this counts those ops in an optimized HLO text by the
    ``op_name`` JAX wrote in their metadata: ``forward`` (``.../jvp()/...``), ``recompute`` (a forward
    op inside the backward pass, ``.../transpose(jvp())/.../jvp()/...``) and ``gradient`` (the
    transposed ops). The same matmul counted in ``forward`` but not in ``recompute`` was
    partitioned another way when recomputed: another summation order.
    """
    result = re.compile(r"= f\w+\[" + ",".join(str(d) for d in shape) + r"\]\S* all-reduce\(")
    out = {"forward": 0, "recompute": 0, "gradient": 0}
    for line in hlo.splitlines():
        name = line.partition('op_name="')[2].partition('"')[0]
        if not result.search(line) or not name.endswith("/dot_general"):
            continue
        parts = name.split("/")[1:]  # after "jit(f)"
        if not parts[0].startswith("transpose("):
            out["forward"] += 1
        elif len(parts) < 2 or parts[-2].startswith("transpose("):
            out["gradient"] += 1
        else:
            out["recompute"] += 1
    return out
