"""The checks of one JAX mesh: every plan against ``none`` on the mesh, and the single-device references.

Within the mesh, bitwise (:func:`parity.checks.compare.compare_bitwise`): the first step's loss, every
gradient and the weights after the AdamW steps; ``none`` runs twice (determinism). A plan that is
not bitwise passes only with a documented, measured exception (:data:`EXCEPTIONS`); the check itself
is never loosened.

Against one device (:data:`REFERENCE`): data parallel (and fully sharded, which splits the batch
too) computes each shard's gradient of the shard's mean loss and all-reduces their mean, so the
reference is the mean of the per-shard single-device gradients; it differs from it by the order
XLA sums inside the shard (the SPMD program fuses otherwise) and is checked within
:data:`REFERENCE_EPS` float32 eps per tensor (relative to the tensor's largest entry). The
full-batch single-device gradient is measured beside it (``full_batch_err``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from safetensors.numpy import save_file

from jaxremat import sharding as shd
from jaxremat.models import param_shapes
from jaxremat.spec.plan import RematPlan, parse_plan
from parity.checks.compare import EPS, compare_bitwise, max_rel_err
from parity.distributed import jax_mesh as jm
from parity.distributed.jax_multiprocess import plan_runs
from parity.distributed.result import DistributedRow

REFERENCE = "mean of the per-batch-shard single-device gradients (none)"

REFERENCE_EPS = 16.0
"""Bound of the single-vs-multi reference check in units of the dtype's eps (float32: 1.9e-6), relative
per tensor to its largest entry. The sharded program sums the same terms in another order (the
partitioned gradient of ``wte`` adds its embedding and head parts across the all-reduce); measured at
gpt-small: 0.7 eps (data=2, only ``wte`` differs, 256 ULP of an entry near zero); docs/sharding.md."""

EXCEPTIONS = {
    "local-shape-one-layer-segments": (
        "the plan is not bitwise against none on ONE device either, at the per-device batch (B / batch "
        "shards), measured in the same run: checkpointed one-layer segments at small shapes round a few "
        "float32 eps apart under jit (the recomputed layer runs as a cond branch inside the backward loop, "
        "compiled apart from none's forward loop body; docs/framework-differences.md, section 2); the mesh "
        "inherits it from the per-device shapes (docs/sharding.md; python -m parity.distributed.explain)"),
    "collective-summation-order": (
        "the same mesh over several processes (jax.distributed, CPU collectives over gloo) is not bitwise "
        "against it in one process although both compile the same optimized HLO: the collectives sum their "
        "operands in another order (gloo's ring reduce-scatter vs XLA:CPU's device order in one process), "
        "measured in the same run by a psum probe in both (parity.distributed.jax_multiprocess."
        "collective_probe), loss and gradients within 16 eps, trained weights within 256 eps; with two operands the order cannot matter, with four it "
        "does (docs/sharding.md, 'Several processes')"),
}
"""Documented exceptions: id -> mechanism. An exception is granted only when its condition is measured in the same run."""


@dataclasses.dataclass
class MeshReport:
    """One mesh's rows and the facts beside them (JSON-ready through :meth:`to_json`)."""

    mesh: str
    layout: str
    rows: list[DistributedRow]
    full_batch_err: float | None
    reference_bitwise: bool | None
    collectives: dict[str, dict[str, int]]
    while_loops: dict[str, int]
    processes: int = 1
    probe: dict | None = None
    """:func:`parity.distributed.jax_multiprocess.collective_probe` of the mesh where measured (the
    multi-process comparison measures it in both), else None."""
    one_process: dict = dataclasses.field(default_factory=dict)
    """plan name -> :func:`one_process_exception`'s measurements, for the plans of a multi-process mesh
    that were not bitwise against one process."""
    runs: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    """plan name -> its :class:`parity.distributed.jax_mesh.MeshRun` (in memory only, not in the JSON)."""

    def to_json(self) -> dict:
        return {"mesh": self.mesh, "layout": self.layout, "processes": self.processes,
                "rows": [r.to_json() for r in self.rows],
                "full_batch_err": self.full_batch_err, "reference_bitwise": self.reference_bitwise,
                "collectives": self.collectives, "while_loops": self.while_loops, "probe": self.probe,
                "one_process": self.one_process}


def predicted_memory(cfg, spec: str, single_temp_bytes: int, itemsize: int) -> dict[str, int]:
    """The per-device prediction of one plan on mesh ``spec``, in bytes.

    Parameters (and gradients; 2x for AdamW's moments): their sizes over the axis that splits them --
    ``fsdp`` for every parameter, ``model`` for the Megatron matrices only. Activations: the
    single-device activations (``single_temp_bytes``, compiled temp at the global batch) over the
    batch shards; with ``model`` t, times Korthikanti et al. 2022's tensor-parallel activation ratio
    per layer ``(10 + 24/t + 5as/(ht)) / (34 + 5as/h)`` (arXiv:2205.05198, section 4.1; s = T,
    h = d_model, a = heads); plus the buffers of the collectives inside the block loops: with
    ``fsdp``, one layer's parameters gathered whole and its gradient whole before the reduction
    that leaves each device its shard (2 x one layer's full bytes); else, when the batch is split,
    the per-device buffer of one layer's gradient all-reduce (1 x one layer's per-device bytes).
    Measured on gpt-small (docs/sharding.md), compiled temp bytes over this prediction: 0.95 .. 1.01
    on ``fsdp=4`` and ``data=2`` for the schedules without a policy (the collective term is 38% of
    ``full``'s prediction on ``fsdp=4``), 1.11 for ``every_k(2)+save_qkv_proj`` on ``data=2``;
    ``data=2,model=2`` 1.02 (``none``) .. 1.18 (``full``): the tensor-parallel ratio under-predicts.
    """
    ms = shd.parse_mesh(spec)
    f, t = ms.axis_size("fsdp"), ms.axis_size("model")
    shapes = param_shapes(cfg)
    tp_names = {"h.attn.c_attn.weight", "h.attn.c_attn.bias", "h.attn.c_proj.weight", "h.mlp.c_fc.weight",
                "h.mlp.c_fc.bias", "h.mlp.c_proj.weight"}
    split = lambda k: f * (t if k in tp_names else 1)  # noqa: E731
    params = sum(int(np.prod(s)) * itemsize // split(k) for k, s in shapes.items())
    layer_full = sum(int(np.prod(s)) * itemsize for k, s in shapes.items() if k.startswith("h.")) // cfg.n_layer
    layer_dev = sum(int(np.prod(s)) * itemsize // split(k) for k, s in shapes.items()
                    if k.startswith("h.")) // cfg.n_layer
    act = single_temp_bytes / ms.batch_shards
    if t > 1:
        s_, h, a = cfg.max_seq_len, cfg.d_model, cfg.n_head
        act *= (10 + 24 / t + 5 * a * s_ / (h * t)) / (34 + 5 * a * s_ / h)
    act += 2 * layer_full if f > 1 else layer_dev if ms.batch_shards > 1 else 0
    return {"params_bytes": params, "grads_bytes": params, "opt_state_bytes": 2 * params, "activation_bytes": int(act)}


def _runs_here(cfg, params, tokens, ms, plans, hparams, predicted):
    """Every run of ``plans`` (``none`` twice first) on mesh ``ms`` in this process, as (name, MeshRun or error)."""
    mesh = shd.make_mesh(ms)
    for name in plan_runs(plans):
        try:
            yield name, jm.run_plan(cfg, params, tokens, parse_plan(name), ms.text, mesh, hparams, predicted(name))
        except Exception as exc:  # recorded, the mesh goes on
            yield name, f"{type(exc).__name__}: {exc}"


TRAINED_EPS = 256.0
"""Bound of the trained weights (after the AdamW steps) of a run granted ``collective-summation-order``, in
float32 eps relative per tensor to its largest entry. AdamW divides the first moment by the square root of the
second: where a gradient entry is near zero, its rounding moves the update by far more than its own
relative size, so gradients 1.2 eps apart gave weights 26.6 eps apart after 3 steps (gpt-small,
``fsdp=4`` over 2 processes, measured); one step fewer moves every trained tensor by at least
7.9e3 eps (gpt-small, measured; tests/parity/test_jax_multiprocess.py holds it above 10x this bound on
gpt-tiny). The first-step loss and the gradients are bounded by :data:`REFERENCE_EPS`."""


def one_process_exception(run, one, probe, one_probe, dtype) -> tuple[str | None, dict]:
    """Whether a multi-process run that is not bitwise against one process carries ``collective-summation-order``.

    Granted only when all of these are measured in this run: the two optimized HLO programs are
    equal (:func:`parity.distributed.jax_mesh.hlo_program`: the same program), the collective
    probe's bits differ between the two, each measured in both (:func:`parity.distributed.
    jax_multiprocess.collective_probe`: the collectives sum in another order), the first-step loss
    (relative to itself) and every gradient (relative per tensor to its largest entry) within
    :data:`REFERENCE_EPS` eps of the one-process ones, and the trained weights within
    :data:`TRAINED_EPS` eps. Returns ``(exception or None, the measurements)``: ``same_hlo``,
    ``probes_differ``, ``max_rel_err`` and ``bound`` (the gradients' largest relative error and its
    bound, as numbers), ``loss_eps``, ``grads_eps``, ``trained_eps`` (each in eps) and ``bound_eps``.
    """
    same_hlo = jm.hlo_program(run.hlo) == jm.hlo_program(one.hlo)
    probes_differ = any(a in probe and probe[a]["bits"] != p["bits"] for a, p in one_probe.items())  # measured in both
    eps = float(EPS[dtype])
    loss_one = float(one.loss)
    loss_err = abs(float(run.loss) - loss_one) / max(abs(loss_one), np.finfo(np.float32).tiny) / eps
    grads_rel = float(max_rel_err(run.grads, one.grads))
    grads_err, trained_err = grads_rel / eps, float(max_rel_err(run.trained, one.trained)) / eps
    facts = {"same_hlo": same_hlo, "probes_differ": probes_differ, "max_rel_err": grads_rel,
             "bound": REFERENCE_EPS * eps, "loss_eps": loss_err, "grads_eps": grads_err, "trained_eps": trained_err,
             "bound_eps": {"loss": REFERENCE_EPS, "grads": REFERENCE_EPS, "trained": TRAINED_EPS}}
    granted = (same_hlo and probes_differ and loss_err <= REFERENCE_EPS and grads_err <= REFERENCE_EPS
               and trained_err <= TRAINED_EPS)
    return ("collective-summation-order" if granted else None), facts


def check_mesh(cfg, params, tokens, spec: str, plans: tuple[str, ...], hparams, grads_path=None, *,
               runs=None, processes: int = 1, one_process: "MeshReport | None" = None) -> MeshReport:
    """Run every plan of ``plans`` (``none`` first) on mesh ``spec`` and check it (module docstring).

    Args:
        cfg, params, tokens: the model configuration, canonical numpy parameters and ``(B, T+1)`` tokens.
        spec: the mesh spec; raises ValueError (one line) when it does not divide the devices or the model.
        plans: plan names; ``none`` is added first when missing.
        hparams: AdamW settings of the trained-weights check.
        grads_path: where to write ``none``'s gradients (safetensors), or None.
        runs: the runs already made elsewhere, ``[(plan name, MeshRun or error message), ...]`` in
            :func:`parity.distributed.jax_multiprocess.plan_runs` order with their probe
            (``{"runs": ..., "probe": ...}``, :func:`parity.distributed.jax_multiprocess.load_runs`);
            None runs them here, on this process's devices.
        processes: the processes ``runs`` came from (recorded in the rows).
        one_process: the report of the same mesh in one process: each run is also compared with its
            plan there, byte for byte, exception ``collective-summation-order`` when
            :func:`one_process_exception` grants it.
    """
    ms = shd.parse_mesh(spec)
    shd.check_divides(ms, cfg, tokens.shape[0])
    layout, n = shd.layout_of(ms), ms.batch_shards
    ref_grads = jm.mean_of_shard_grads(cfg, params, tokens, parse_plan("none"), n)
    _, full_grads, _ = jm.single_device_grads(cfg, params, tokens, parse_plan("none"))
    local = np.asarray(tokens)[: tokens.shape[0] // n]
    _, local_none, _ = jm.single_device_grads(cfg, params, local, parse_plan("none"))
    itemsize = np.dtype(cfg.dtype).itemsize

    def predicted(name):
        temp = jm.single_device_grads(cfg, params, tokens, parse_plan(name))[2]
        return predicted_memory(cfg, ms.text, temp, itemsize)

    if runs is None:
        source, probe = _runs_here(cfg, params, tokens, ms, plans, hparams, predicted), None
    else:
        source, probe = iter(runs["runs"]), runs["probe"]
    rows, collectives, loops, kept, facts, base, none_error = [], {}, {}, {}, {}, None, None
    for name, run in source:
        plan: RematPlan = parse_plan(name)
        if base is None and none_error is None and isinstance(run, str):  # the first none failed
            none_error = run
            next(source, None)  # its determinism run
        if isinstance(run, str) or none_error is not None:
            error = run if isinstance(run, str) else f"none did not run on {ms.text} ({none_error}): nothing to compare with"
            rows.append(DistributedRow("jax", ms.text, layout, ms.size, processes, plan.name, "error", error=error))
            continue
        if runs is not None:
            run = dataclasses.replace(run, memory=dataclasses.replace(run.memory, predicted=predicted(name)))
        if base is None:  # the first none: compared with the second
            base = run
            continue
        kept.setdefault(plan.name, run if plan.name != "none" else base)
        if plan.name == "none":
            run, other = base, run
        else:
            other = run
        collectives[plan.name] = jm.count_collectives(run.hlo)
        loops[plan.name] = run.hlo.count(" while(")
        g, w = compare_bitwise(other.grads, base.grads), compare_bitwise(other.trained, base.trained)
        loss_same = other.loss.tobytes() == base.loss.tobytes()
        bitwise = g.equal and w.equal and loss_same
        exception = None
        if not bitwise and plan.name != "none":
            _, local_plan, _ = jm.single_device_grads(cfg, params, local, plan)
            if not compare_bitwise(local_plan, local_none).equal:
                exception = "local-shape-one-layer-segments"
        ref = compare_bitwise(run.grads, ref_grads)
        ref_err = max_rel_err(run.grads, ref_grads)
        ref_ok = ref.equal or ref_err <= REFERENCE_EPS * EPS[cfg.dtype]
        status = "pass" if (bitwise or exception) and ref_ok else "fail"
        extra = {}
        one = None if one_process is None else one_process.runs.get(plan.name)
        if one_process is not None:
            if one is None:
                status, extra["error"] = "fail", f"{plan.name} did not run on {ms.text} in one process"
            else:
                vs = compare_bitwise(run.grads, one.grads)
                same = vs.equal and compare_bitwise(run.trained, one.trained).equal and \
                    run.loss.tobytes() == one.loss.tobytes()
                extra = {"one_process_bitwise": same, "one_process_max_ulp": vs.max_ulp}
                if not same:
                    extra["one_process_exception"], facts[plan.name] = one_process_exception(
                        run, one, probe or {}, one_process.probe or {}, cfg.dtype)
                    if extra["one_process_exception"] is None:
                        status = "fail"
        path = None
        if plan.name == "none" and grads_path is not None:
            save_file({k: np.ascontiguousarray(v) for k, v in run.grads.items()}, str(grads_path))
            path = str(grads_path)
        rows.append(DistributedRow(
            "jax", ms.text, layout, ms.size, processes, plan.name, status, loss=float(run.loss), grads_bitwise=g.equal,
            weights_bitwise=w.equal, max_ulp=max(g.max_ulp, w.max_ulp), exception=exception, reference=REFERENCE,
            reference_ok=bool(ref_ok), reference_err=0.0 if ref.equal else float(ref_err), memory=run.memory,
            grads_file=path, **extra))
    full_err = None if base is None else float(max_rel_err(base.grads, full_grads))
    ref_bitwise = None if base is None else compare_bitwise(base.grads, ref_grads).equal
    return MeshReport(ms.text, layout, rows, full_err, ref_bitwise, collectives, loops, processes=processes,
                      probe=probe, one_process=facts, runs=kept)
