"""The doctor's checks, one function per problem kind, each returning :class:`Problem` s.

Every check reads what is measured (a region's tags and policy answers, its traced residual
bytes, the compiled programs' temp bytes and matrix products) and words the problem with the
numbers and a fix. The criteria (docs/doctor.md):

* ``policy-name-missing``: a name the policy saves or offloads is carried by no operation in the region;
* ``policy-dropped``: the policy keeps exactly what ``nothing_saveable`` keeps, though
  ``everything_saveable`` would keep more (and no missing name explains it);
* ``offload-not-host``: the policy offloads to a memory kind other than ``pinned_host`` (JAX keeps
  such residuals in device memory), or offloads yet its traced residuals hold no host bytes, or
  the compiled program of a GPU/TPU backend holds no buffer in host memory;
* ``remat-not-surviving``: the program compiled with the region at ``everything_saveable`` has temp
  bytes above the program as it is by less than :data:`MIN_REALIZED_FRACTION` of the bytes the
  region's policy keeps less than ``everything_saveable`` (traced, all calls);
* ``stacked-output``: :mod:`jaxremat.doctor.stacked`.
"""

from __future__ import annotations

from .diagnosis import Problem, Region, format_bytes
from .policy_probe import HOST_MEMORY_KIND, RegionAnswers
from .stacked import StackedOutput

__all__ = ["MIN_REALIZED_FRACTION", "name_missing", "not_surviving", "offload_not_host", "policy_dropped",
           "stacked_output"]

_TAG = "jax.ad_checkpoint.checkpoint_name"

MIN_REALIZED_FRACTION = 0.4
"""A region survives when its compiled saving is at least this fraction of its traced one. Measured on
XLA:CPU, jax 0.10.2 (``python scripts/doctor_survival.py``, docs/doctor.md; 2-8 layers, widths 64-256):
surviving forms realized 0.51-1.75 of it; Python-unrolled layers, loops of trip count one and one
checkpoint around a whole stack 0.00-0.28."""


def name_missing(region: Region) -> list[Problem]:
    """``policy-name-missing`` for names the region's policy keeps that none of its operations carries."""
    missing = sorted((set(region.saved_names) | set(region.offloaded_names)) - set(region.tags))
    if not missing:
        return []
    names = ", ".join(map(repr, missing))
    carried = f"it carries {', '.join(map(repr, region.tags))}" if region.tags else "it carries no tag"
    fix = (f"tag the value inside the region with {_TAG}(x, {missing[0]!r})"
           + (f", or name one of the tags it carries ({', '.join(map(repr, region.tags))}) in the policy"
              if region.tags else ""))
    return [Problem("policy-name-missing", region.place(),
                    f"the policy keeps {names}, which no operation in its region carries ({carried}); "
                    f"it keeps {format_bytes(region.kept_bytes_per_call)} per call", fix, region.number)]


def policy_dropped(region: Region, answers: RegionAnswers, batched_by_vmap: bool) -> list[Problem]:
    """``policy-dropped``: a policy that keeps what ``nothing_saveable`` keeps where more could be kept."""
    if region.policy == "nothing_saveable" or name_missing(region):
        return []
    if region.kept_bytes_per_call != region.nothing_bytes_per_call:
        return []
    if region.everything_bytes_per_call <= region.nothing_bytes_per_call:
        return []
    if answers.dots and answers.batched_dots == answers.dots:
        why = (f"every one of its {answers.dots} matrix products has batch dimensions"
               + (" (a jax.vmap inside the differentiation batches them)" if batched_by_vmap else ""))
        fix = "use dots_saveable (keeps batched products too) or tag the values to keep with " + _TAG
    elif not answers.kept_ops:
        why = "no operation in the region matches it" + ("" if answers.dots else " (the region has no matrix product)")
        fix = f"choose a policy that matches the region's operations, or tag the values to keep with {_TAG}"
    else:
        why = "what it matches is not read by the backward pass"
        fix = f"tag the values the backward pass reads with {_TAG} and save those names"
    return [Problem("policy-dropped", region.place(),
                    f"the policy keeps nothing: {why}, so the region is recomputed in full as under nothing_saveable "
                    f"(everything_saveable would keep {format_bytes(region.everything_bytes_per_call)} per call)",
                    fix, region.number)]


def offload_not_host(region: Region, answers: RegionAnswers, compiled: dict | None) -> list[Problem]:
    """``offload-not-host``: an offload that does not reach host memory (traced, then compiled)."""
    if not answers.offload_dsts and not region.offloaded_names:
        return []
    other = sorted(d for d in answers.offload_dsts if d != HOST_MEMORY_KIND)
    fix = f"offload with offload_src='device', offload_dst={HOST_MEMORY_KIND!r}"
    if other:
        message = (f"the policy offloads to {', '.join(map(repr, other))}, which JAX keeps in device memory "
                   f"(only {HOST_MEMORY_KIND!r} is host memory); {format_bytes(region.offloaded_bytes_per_call)} "
                   "per call reach host memory")
        return [Problem("offload-not-host", region.place(), message, fix, region.number)]
    if answers.offload_dsts and not region.offloaded_bytes_per_call:
        return [Problem("offload-not-host", region.place(),
                        "the policy offloads, yet none of the region's residuals is in host memory (what it "
                        "offloads is not read by the backward pass, or another policy keeps it first)",
                        "offload a value the backward pass reads (a tagged matrix product's output)", region.number)]
    if compiled and compiled["backend"] != "cpu" and region.offloaded_bytes_per_call and not compiled["host_buffers"]:
        return [Problem("offload-not-host", region.place(),
                        f"the traced residuals put {format_bytes(region.offloaded_bytes_per_call)} per call in host "
                        f"memory, but the program XLA compiled for {compiled['backend']} holds no buffer in host "
                        "memory (S(5))", "offload a value the backward pass reads outside a loop carry, and check "
                        "the JAX/XLA release (jax#23869)", region.number)]
    return []


def not_surviving(region: Region, compiled: dict) -> list[Problem]:
    """``remat-not-surviving`` from the region's compiled saving against its promise (both set on ``region``)."""
    promised, realized = region.promised_saving_bytes, region.compiled_saving_bytes
    if realized is None or not promised or realized >= MIN_REALIZED_FRACTION * promised:
        return []
    before, after = compiled["dots_before"], compiled["dots_after"]
    if after < before:
        how = (f"XLA removed {before - after} of {before} matrix products: it merged the recompute into the "
               "forward pass (a checkpoint per layer of a Python loop)")
        fix = "run the layers as a lax.scan (nnx.scan, jaxremat.remat_scan) with the checkpoint around the scan body"
    elif any(p == "scan(1)" for p in region.position):
        how = "its loop has one iteration, which XLA removes, and the recompute is scheduled with the forward pass"
        fix = "give the checkpointed segments at least two layers each, or checkpoint the scan body"
    elif region.calls == 1:
        how = "it runs once, so its whole recompute is live at once in the backward pass"
        fix = "checkpoint each layer (the scan body) rather than the whole stack"
    else:
        how = "the recompute is kept but its buffers are live where the saved values would have been"
        fix = "checkpoint the scan body of a lax.scan over the layers"
    message = (f"with this region at everything_saveable the compiled temp memory is only {format_bytes(realized)} "
               f"higher, though its policy keeps {format_bytes(promised)} less (traced); {how}")
    return [Problem("remat-not-surviving", region.place(), message, fix, region.number)]


def stacked_output(found: StackedOutput) -> list[Problem]:
    """``stacked-output`` for one wasteful stacked output of a scan."""
    shapes = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in found.shapes)
    where = f"scan({found.length})" + (f" at {found.site}" if found.site else "")
    if found.kind == "cast":
        message = (f"the scan stacks a per-layer cast of its scanned inputs ({shapes}, {format_bytes(found.bytes)}, "
                   f"against {format_bytes(found.reference_bytes)} scanned): each layer's parameters cast and saved "
                   "for the backward pass")
        fix = ("cast the stacked parameters once before the scan, or checkpoint the scan body so the cast is "
               "recomputed")
    elif found.kind == "copy":
        message = (f"the scan hands its scanned inputs back out as stacked outputs ({shapes}, "
                   f"{format_bytes(found.bytes)}, against {format_bytes(found.reference_bytes)} scanned): a second "
                   "copy of the stacked parameters (nnx.scan returns the module's state so)")
        fix = ("scan over the split state with jax.lax.scan and nnx.merge inside the body (as "
               "jaxremat.remat_stack does), so that the parameters are not outputs of the loop")
    else:
        message = (f"the scan returns a stacked per-layer output ({shapes}, {format_bytes(found.bytes)}) that the "
                   "backward pass does not read; it stays live through the forward pass under any remat policy")
        fix = "return what you need from the carry (the last layer's output is the final carry) and drop it from ys"
    return [Problem("stacked-output", where, message, fix)]
