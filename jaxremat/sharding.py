"""Remat with sharding: device meshes and parameter/batch shardings of the stacked GPT.

A mesh is written as a spec string of named axes, ``"data=2"``, ``"fsdp=4"``, ``"data=2,model=2"``,
and built over ``jax.devices()`` (:func:`make_mesh`). Its axes choose one of three layouts of the
canonical parameter dict (:mod:`jaxremat.models.params`: per-block tensors stacked on a leading
layer axis N, matrices ``(in, out)``):

* ``data_parallel`` (axis ``data``): every parameter replicated, the batch split over ``data``.
* ``fully_sharded`` (axis ``fsdp``, optionally with ``data``): FSDP / ZeRO-3 -- every parameter
  (and so its gradient and AdamW moments) split along ONE non-layer dimension over ``fsdp``, the
  batch split over ``data`` and ``fsdp``. Inside the block scan XLA's SPMD partitioner gathers each
  layer's slice where the matmul needs it whole; nothing is gathered by hand.
* ``tensor_parallel`` (axes ``data`` and ``model``): the Megatron layout (Shoeybi et al. 2019,
  arXiv:1909.08053) -- QKV and MLP-in weights column sharded (output dimension over ``model``),
  attention-out and MLP-out weights row sharded (input dimension over ``model``), the rest
  replicated, the batch split over ``data``.

The shardings are plain ``jax.sharding.NamedSharding`` s with ``PartitionSpec`` s, given to
``jax.jit(..., in_shardings=, out_shardings=)``; the model code and every remat plan
(:func:`jaxremat.render.remat_scan`) run unchanged under them -- ``jax.checkpoint`` and
``lax.scan`` are partitioned like any other program.

Source: ``jax.sharding`` (https://docs.jax.dev/en/latest/notebooks/Distributed_arrays_and_automatic_parallelization.html);
Rajbhandari et al. 2020 (ZeRO, arXiv:1910.02054) for the fully sharded layout.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "AXES", "LAYOUTS", "MeshSpec", "activation_sharding", "batch_sharding", "check_divides", "layout_of", "make_mesh",
    "opt_state_shardings", "param_partition_specs", "param_shardings", "parse_mesh", "replicated",
    "shard_bytes",
]

AXES = ("data", "fsdp", "model")
"""Mesh axis names: ``data`` splits the batch, ``fsdp`` splits parameters and batch, ``model`` splits matrices."""

LAYOUTS = ("data_parallel", "fully_sharded", "tensor_parallel")
"""Layout names, as :attr:`parity.distributed.result.DistributedRow.layout` spells them."""

# Megatron layout: which dimension of each stacked block matrix the ``model`` axis splits.
_TENSOR_PARALLEL_DIM = {
    "h.attn.c_attn.weight": 2,   # (N, D, 3D): column (output) sharded
    "h.attn.c_attn.bias": 1,     # (N, 3D)
    "h.attn.c_proj.weight": 1,   # (N, D, D): row (input) sharded
    "h.mlp.c_fc.weight": 2,      # (N, D, F): column sharded
    "h.mlp.c_fc.bias": 1,        # (N, F)
    "h.mlp.c_proj.weight": 1,    # (N, F, D): row sharded
}


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """A parsed mesh spec: axis names and sizes in the order written.

    Attributes:
        axes: ``((name, size), ...)``, names from :data:`AXES`, sizes >= 1, each name once.
    """

    axes: tuple[tuple[str, int], ...]

    @property
    def text(self) -> str:
        """The spec as the CLI spells it, e.g. ``"data=2,model=2"``."""
        return ",".join(f"{n}={s}" for n, s in self.axes)

    @property
    def size(self) -> int:
        """Number of devices the mesh spans (the product of the axis sizes)."""
        return math.prod(s for _, s in self.axes)

    def axis_size(self, name: str) -> int:
        """Size of axis ``name`` (1 when the mesh has no such axis)."""
        return dict(self.axes).get(name, 1)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The axes that split the batch: ``data`` and ``fsdp``, those present."""
        return tuple(n for n, _ in self.axes if n in ("data", "fsdp"))

    @property
    def batch_shards(self) -> int:
        """Number of batch shards (product of :attr:`batch_axes` sizes)."""
        return math.prod(self.axis_size(n) for n in self.batch_axes)


def parse_mesh(spec: str | MeshSpec) -> MeshSpec:
    """Parse ``"data=2"``, ``"fsdp=4"``, ``"data=2,model=2"`` into a :class:`MeshSpec`.

    Raises:
        ValueError: an empty spec, an item not ``NAME=SIZE``, an unknown axis name, a size < 1, a
            repeated axis, or ``fsdp`` together with ``model`` (one layout per mesh).
    """
    if isinstance(spec, MeshSpec):
        return spec
    items = [s.strip() for s in str(spec).split(",") if s.strip()]
    if not items:
        raise ValueError(f"mesh spec {spec!r} is empty; write axes as NAME=SIZE, e.g. 'data=2' or 'data=2,model=2'")
    axes = []
    for item in items:
        name, eq, size = item.partition("=")
        name = name.strip()
        if not eq or not re.fullmatch(r"[0-9]+", size.strip(), re.ASCII):  # str.isdigit() takes '²' and '２'
            raise ValueError(f"mesh spec {spec!r}: {item!r} is not NAME=SIZE with an integer size in ASCII digits, "
                             "e.g. 'data=2'")
        if name not in AXES:
            raise ValueError(f"mesh spec {spec!r}: unknown axis {name!r}; valid axes: {', '.join(AXES)}")
        if any(name == n for n, _ in axes):
            raise ValueError(f"mesh spec {spec!r}: axis {name!r} given twice; give each axis once")
        if int(size) < 1:
            raise ValueError(f"mesh spec {spec!r}: axis {name!r} has size {int(size)}; sizes must be >= 1")
        axes.append((name, int(size)))
    names = {n for n, _ in axes}
    if {"fsdp", "model"} <= names:
        raise ValueError(f"mesh spec {spec!r}: fsdp and model in one mesh is not a supported layout; "
                         "use 'fsdp=N' (or 'data=N,fsdp=M') or 'data=N,model=M'")
    return MeshSpec(tuple(axes))


def layout_of(spec: str | MeshSpec) -> str:
    """The layout a mesh's axes choose: ``tensor_parallel`` with ``model``, ``fully_sharded`` with ``fsdp``, else ``data_parallel``."""
    names = {n for n, _ in parse_mesh(spec).axes}
    return "tensor_parallel" if "model" in names else "fully_sharded" if "fsdp" in names else "data_parallel"


def make_mesh(spec: str | MeshSpec, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``jax.sharding.Mesh`` over the first ``spec.size`` devices, axes in the order written.

    Args:
        spec: mesh spec (:func:`parse_mesh`).
        devices: devices to use (default ``jax.devices()``).

    Raises:
        ValueError: the mesh does not divide the device count (its size exceeds the count, or the
            count is not a multiple of it); the message names both and how to fix it (on CPU,
            ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX starts).
    """
    ms = parse_mesh(spec)
    devices = list(jax.devices() if devices is None else devices)
    if ms.size > len(devices) or len(devices) % ms.size:
        raise ValueError(
            f"mesh {ms.text} needs {ms.size} devices, which does not divide the {len(devices)} available; "
            f"use a mesh whose size divides {len(devices)}, or start with {ms.size} devices "
            f"(CPU: XLA_FLAGS=--xla_force_host_platform_device_count={ms.size}, e.g. --devices {ms.size})")
    grid = np.array(devices[:ms.size], dtype=object).reshape(tuple(s for _, s in ms.axes))
    return Mesh(grid, tuple(n for n, _ in ms.axes))


def check_divides(spec: str | MeshSpec, cfg: Any, batch_size: int) -> None:
    """Check that the mesh divides the model and the batch; raise one clear line when it does not.

    Checked: the batch by the batch shards (``data`` x ``fsdp``); with ``model``: ``n_head``,
    ``d_ff`` (and so ``d_model`` = heads x head_dim); with ``fsdp``: ``d_model`` and ``d_ff``
    (the dimensions :func:`param_partition_specs` splits).

    Args:
        spec: mesh spec.
        cfg: a :class:`jaxremat.models.TransformerConfig`.
        batch_size: the global batch size B (sequences).

    Raises:
        ValueError: the first dimension that the mesh does not divide, named with the fix.
    """
    ms = parse_mesh(spec)
    checks = [("batch size", batch_size, ms.batch_shards, "batch axes " + "x".join(ms.batch_axes), "--batch / --model")]
    m, f = ms.axis_size("model"), ms.axis_size("fsdp")
    if m > 1:
        checks += [("n_head", cfg.n_head, m, "axis model", "--model"), ("d_ff", cfg.d_ff, m, "axis model", "--model")]
    if f > 1:
        checks += [("d_model", cfg.d_model, f, "axis fsdp", "--model"), ("d_ff", cfg.d_ff, f, "axis fsdp", "--model")]
    for what, value, parts, axis, _ in checks:
        if parts > 1 and value % parts:
            raise ValueError(f"mesh {ms.text}: {what} {value} is not divisible by {parts} ({axis}); choose a mesh "
                             f"whose {axis.split()[-1]} size divides {value}, or a model whose {what} is a multiple of {parts}")


def _fsdp_dim(name: str, shape: tuple[int, ...], size: int) -> int | None:
    """The dimension ``fsdp`` splits: the largest non-layer dim divisible by ``size`` (first on ties)."""
    first = 1 if name.startswith("h.") else 0
    dims = [d for d in range(first, len(shape)) if shape[d] % size == 0]
    return max(dims, key=lambda d: (shape[d], -d)) if dims else None


def param_partition_specs(spec: str | MeshSpec, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, PartitionSpec]:
    """The ``PartitionSpec`` of every parameter under the mesh's layout (:func:`layout_of`).

    Args:
        spec: mesh spec.
        shapes: name -> shape of the canonical parameters (:func:`jaxremat.models.param_shapes`).

    Returns:
        name -> ``PartitionSpec``: replicated (``P()``) in ``data_parallel``; in ``fully_sharded``
        ``fsdp`` on the largest non-layer dimension it divides (never the leading layer axis N of
        ``h.*``, so the scan slices whole layers); in ``tensor_parallel`` ``model`` on the Megatron
        dimension of the four block matrices and the column-sharded biases.
    """
    ms = parse_mesh(spec)
    layout, out = layout_of(ms), {}
    for name, shape in shapes.items():
        parts: list[str | None] = [None] * len(shape)
        if layout == "fully_sharded" and ms.axis_size("fsdp") > 1:
            d = _fsdp_dim(name, tuple(shape), ms.axis_size("fsdp"))
            if d is not None:
                parts[d] = "fsdp"
        elif layout == "tensor_parallel" and name in _TENSOR_PARALLEL_DIM and ms.axis_size("model") > 1:
            parts[_TENSOR_PARALLEL_DIM[name]] = "model"
        out[name] = PartitionSpec(*parts)
    return out


def param_shardings(mesh: Mesh, spec: str | MeshSpec, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, NamedSharding]:
    """:func:`param_partition_specs` as ``NamedSharding`` s on ``mesh`` (also the gradients' shardings)."""
    return {k: NamedSharding(mesh, p) for k, p in param_partition_specs(spec, shapes).items()}


def batch_sharding(mesh: Mesh, spec: str | MeshSpec, ndim: int = 2) -> NamedSharding:
    """Sharding of a ``(B, ...)`` batch: dimension 0 over the batch axes (``data``, ``fsdp``), the rest whole."""
    axes = parse_mesh(spec).batch_axes
    first = None if not axes else axes[0] if len(axes) == 1 else axes
    return NamedSharding(mesh, PartitionSpec(first, *([None] * (ndim - 1))))


def activation_sharding(mesh: Mesh, spec: str | MeshSpec) -> NamedSharding:
    """Sharding of the ``(B, T, D)`` residual stream between blocks: batch over the batch axes, T and D whole.

    Given to :func:`jaxremat.render.remat_scan` (``carry_sharding=``), it pins every block's input
    and output, in the forward pass and in each recompute, so XLA's SPMD partitioner partitions a
    recomputed block as it partitioned the forward one (see docs/sharding.md: without it ``full``
    on ``fsdp=4`` recomputed its matmuls with another summation order).
    """
    return batch_sharding(mesh, spec, ndim=3)


def replicated(mesh: Mesh) -> NamedSharding:
    """A fully replicated sharding on ``mesh`` (scalars, the loss, counters)."""
    return NamedSharding(mesh, PartitionSpec())


def opt_state_shardings(opt_state: Any, params_sh: Mapping[str, NamedSharding], mesh: Mesh) -> Any:
    """Shardings for an optax state pytree: a leaf under a parameter's name follows that parameter, the rest replicated.

    Args:
        opt_state: the state (arrays or ``jax.ShapeDtypeStruct`` s, e.g. from ``jax.eval_shape(tx.init, params)``);
            ``optax.adamw`` keeps ``mu`` and ``nu`` as dicts keyed like the parameters and a scalar count.
        params_sh: the parameters' shardings (:func:`param_shardings`).
        mesh: the mesh.

    Returns:
        A pytree of ``NamedSharding`` s of the same structure.
    """
    rep = replicated(mesh)

    def pick(path, leaf):
        keys = [getattr(k, "key", None) for k in path]
        name = next((k for k in reversed(keys) if isinstance(k, str) and k in params_sh), None)
        if name is None or len(np.shape(leaf)) != len(params_sh[name].spec):
            return rep  # not a per-parameter leaf (a count, a scalar): replicated
        return params_sh[name]

    return jax.tree_util.tree_map_with_path(pick, opt_state)


def shard_bytes(tree: Any, device: Any | None = None) -> int:
    """Bytes of ``tree`` 's arrays resident on ``device`` (default: the first device of the first array).

    Sums the sizes of each array's ``addressable_shards`` that live on the device, so a replicated
    array counts whole, an array split in D counts 1/D.
    """
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array)]
    if not leaves:
        return 0
    device = device if device is not None else leaves[0].addressable_shards[0].device
    return int(sum(s.data.nbytes for x in leaves for s in x.addressable_shards if s.device == device))
