"""What one distributed case reports: one :class:`DistributedRow` per (framework, mesh, plan).

Rows cross process boundaries as JSON (:meth:`DistributedRow.to_json` /
:meth:`DistributedRow.from_json`); gradients for the cross-framework comparison travel as a
safetensors file named by ``grads_file``. All byte counts are ints in bytes, per device (per rank in
PyTorch); losses are Python floats of the first step's loss.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping



def grads_file_name(framework: str, mesh: str) -> str:
    """File name of a mesh's ``none`` gradients, one style for both frameworks.

    ``grads_file_name("jax", "data=2,model=2")`` is ``jax_data-2_model-2_none_grads.safetensors``;
    ``grads_file_name("torch", "fsdp2=2")`` is ``torch_fsdp2-2_none_grads.safetensors`` (``-`` keeps an
    axis name that ends in a digit apart from its size).
    """
    return f"{framework}_" + mesh.replace("=", "-").replace(",", "_") + "_none_grads.safetensors"


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """Memory of one training step on ONE device (JAX shard / PyTorch rank), measured and predicted.

    Attributes:
        params_bytes: parameter bytes resident on the device.
        grads_bytes: gradient bytes on the device.
        opt_state_bytes: optimizer-state bytes on the device (0 where the measured step has none).
        activation_bytes: peak activation bytes on the device (peak less parameters, gradients and
            optimizer state), None where the measurement does not break the peak down.
        peak_bytes: peak bytes of the step on the device.
        source: how the numbers were measured (e.g. ``"jax compiled memory_analysis per shard"``,
            ``"torch MemTracker rank 0"``, ``"cuda max_memory_allocated"``).
        predicted: the prediction beside them, same keys (``params_bytes``, ``grads_bytes``,
            ``opt_state_bytes``, ``activation_bytes``; e.g. params / D when fully sharded,
            activations / D when data parallel); missing keys are not predicted.
    """

    params_bytes: int
    grads_bytes: int
    opt_state_bytes: int
    activation_bytes: int | None
    peak_bytes: int
    source: str
    predicted: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DistributedRow:
    """One plan on one mesh in one framework.

    Attributes:
        framework: ``"jax"`` or ``"torch"``.
        mesh: the mesh as the CLI spells it, e.g. ``"data=2"``, ``"fsdp=2"``, ``"data=2,model=2"``.
        layout: ``"data_parallel"``, ``"fully_sharded"`` or ``"tensor_parallel"``.
        devices: devices (JAX) or ranks (PyTorch) taking part.
        processes: OS processes taking part (JAX: 1 for simulated host devices in one process, P for a mesh
            spread over P processes; PyTorch: the ranks).
        plan: the plan's name (:func:`jaxremat.spec.parse_plan` reads it back).
        status: ``"pass"``, ``"fail"`` or ``"error"``.
        loss: first step's loss (None on error).
        grads_bitwise: gradients' raw bytes equal to ``none`` on the same mesh (None on error;
            ``none`` itself compares two runs: determinism).
        weights_bitwise: trained weights equal to ``none``'s on the same mesh; None when not trained.
        max_ulp: largest ULP distance of any gradient element to ``none``'s (0 when bitwise).
        exception: id of the documented, explained exception when not bitwise (on the sharding page in docs),
            None otherwise; a non-bitwise row without one fails.
        reference: the single-device reference this mesh is checked against, in words.
        reference_ok: the reference check held (bitwise or within its stated tolerance).
        reference_err: max abs error against the reference (0.0 when bitwise).
        memory: the per-device :class:`DeviceMemory`; None on error.
        grads_file: safetensors file of this row's gradients (canonical names, full unsharded
            arrays), for the cross-framework comparison; None where not written.
        error: the error message when ``status == "error"``.
        one_process_bitwise: rows of a mesh spread over several processes: loss, gradients and trained
            weights equal byte for byte to the same plan on the same mesh in one process; None elsewhere.
        one_process_max_ulp: largest ULP distance of a gradient to that one-process run; None elsewhere.
        one_process_exception: id of the documented exception when ``one_process_bitwise`` is False
            (``collective-summation-order``), None otherwise; a row not bitwise without one fails.
    """

    framework: str
    mesh: str
    layout: str
    devices: int
    processes: int
    plan: str
    status: str
    loss: float | None = None
    grads_bitwise: bool | None = None
    weights_bitwise: bool | None = None
    max_ulp: int = 0
    exception: str | None = None
    reference: str = ""
    reference_ok: bool | None = None
    reference_err: float | None = None
    memory: DeviceMemory | None = None
    grads_file: str | None = None
    error: str | None = None
    one_process_bitwise: bool | None = None
    one_process_max_ulp: int | None = None
    one_process_exception: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (``memory`` nested)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "DistributedRow":
        """The row back from :meth:`to_json`'s dict; raises TypeError on unknown or missing keys."""
        data = dict(data)
        memory = data.pop("memory", None)
        return cls(**data, memory=None if memory is None else DeviceMemory(**memory))
