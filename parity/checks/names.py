"""What each framework keeps inside one checkpointed block, checked against the policy's declaration.

The declaration is the policy's own name sets (:class:`jaxremat.spec.policies.Policy`
``kept_names`` / ``offloaded_names``). What each framework really keeps is measured per block
(:func:`jaxremat.block_memory.block_residuals`, :func:`torchref.block_memory.block_saved`).
Each framework has one documented reason to differ from the declaration:

* JAX keeps a tagged value only when the backward pass (with its recompute) reads it. Inside a
  block nothing reads ``mlp_out`` (the block's output is the next segment's boundary), so JAX
  drops it from any declaration (:data:`NOT_READ_IN_BLOCK`).
* PyTorch's selective checkpoint caches every op output the policy names, read or not, so it
  keeps the declaration exactly.

``save_everything`` declares no names: it is checked by keeping the same bytes as ``none``.
"""

from __future__ import annotations

# Deferred imports: the per-block measurement loads JAX or PyTorch only for the framework it measures.

from jaxremat.spec.policies import Policy
import contextlib

NOT_READ_IN_BLOCK = frozenset({"mlp_out"})


def expected_names(policy: Policy, framework: str) -> dict[str, list[str]] | None:
    """``{"kept": [...], "offloaded": [...]}`` the framework should keep per block, or None (save_everything)."""
    if policy.save_everything:
        return None
    drop = NOT_READ_IN_BLOCK if framework == "jax" else frozenset()
    return {"kept": sorted(policy.kept_names - drop), "offloaded": sorted(policy.offloaded_names - drop)}


def measured_names(framework: str, cfg, batch: int, seq: int, policy: Policy) -> dict:
    """Per-block names kept and offloaded under ``jax.checkpoint``/selective checkpoint, with shapes.

    Returns:
        ``{"kept": [...], "offloaded": [...], "tensors": [{"name", "shape", "bytes", "memory"}]}``;
        for JAX, every non-argument residual must carry a name (an unnamed one is listed as None).
    """
    if framework == "jax":

        import jax

        from jaxremat.block_memory import block_residuals

        ctx = jax.enable_x64(True) if cfg.dtype == "float64" else contextlib.nullcontext()
        with ctx:
            recs = block_residuals(cfg, batch, seq, policy)
        tensors = [{"name": r.name, "shape": list(r.shape), "bytes": r.bytes, "memory": r.memory} for r in recs]
    else:
        from torchref.block_memory import block_saved

        rows = block_saved(cfg, batch, seq, policy)
        tensors = [{"name": r["name"], "shape": list(r["shapes"][0]), "bytes": r["bytes"],
                    "memory": "host" if r["kind"] == "offloaded" else "device"}
                   for r in rows if r["kind"] != "saved"]
    kept = sorted({t["name"] for t in tensors if t["memory"] == "device"}, key=str)
    off = sorted({t["name"] for t in tensors if t["memory"] == "host"}, key=str)
    return {"kept": kept, "offloaded": off, "tensors": tensors}
