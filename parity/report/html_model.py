"""The per-layer memory model as data for ``report.html`` (:mod:`parity.report.html`).

The page's live controls (depth N, schedule, segment count or k, policy, batch, sequence length,
framework) read every number from what this module exports from the Python model; the page's
JavaScript holds no formula of its own beyond one generic evaluator of the exported data:

* ``accounts``: per framework, batch B and sequence length T, the byte terms of
  :mod:`jaxremat.models.gpt.activation`: ``layer_bytes`` (the chain's unit), ``boundary_bytes``,
  ``stack_invariant_bytes``, the sum of ``outside_tensors``, ``non_stack_peak_bytes``, and the
  per-tensor list of one block (``block_tensors``: name, what, bytes, per layer or once per stack).
* ``schedules``: per depth N and schedule, the segments the schedule's ``segments_for`` (:mod:`jaxremat.spec.schedules`)
  gives (lengths, checkpointed, the inner schedule's segments of a nested one, run-length coded),
  and the unit model's ``peak_units`` and ``recomputed_blocks`` (:mod:`jaxremat.spec.cost`) under
  each policy of the page.

The page evaluates ``predict_saved_bytes`` and ``predict_peak_activation_bytes`` of
:mod:`jaxremat.models.gpt.activation` on those terms (outside tensors, plus per segment one
boundary if checkpointed, else ``length * layer_bytes``, plus the stack's invariants once when a
plain segment exists; the peak is the outside terms plus the larger of the chain peak of
``_chain_peak`` and the kept stack bytes). ``tests/parity/test_report_html.py`` checks the page's
numbers equal the Python functions' exactly, in headless Chromium, over the controls and over a
sample of the whole grid.

Recompute FLOPs are ``recomputed_blocks`` times :func:`block_forward_flops`, the matmul FLOPs of one
block's forward pass as ``torch.utils.flop_counter.FlopCounterMode`` counts them (2 per
multiply-add; elementwise ops not counted).
"""

from __future__ import annotations

from jaxremat.models.config import TransformerConfig
from jaxremat.models.gpt import activation as am
from jaxremat.spec import parse_policy, parse_schedule, peak_units, recomputed_blocks

from parity.runners.framework import FRAMEWORK_NAMES

SCHEDULE_KINDS = ("none", "full", "every_k", "sqrt", "segments", "nested")
"""The page's schedule menu; ``every_k`` and ``segments`` take the page's k / s; ``nested`` is
``nested(sqrt,sqrt)`` (sqrt segments, each recomputed under sqrt segments of its own)."""

DEFAULT_BATCHES = (1, 2, 4, 8, 16)
DEFAULT_SEQS = (16, 32, 64, 128, 256)
DEFAULT_MAX_DEPTH = 32


def schedule_text(kind: str, param: int) -> str:
    """The schedule a control setting names: ``("every_k", 2)`` is ``every_k(2)``.

    Raises:
        ValueError: ``kind`` not in :data:`SCHEDULE_KINDS`.
    """
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f"schedule kind must be one of {SCHEDULE_KINDS}, got {kind!r}")
    return {"every_k": f"every_k({param})", "segments": f"segments({param})",
            "nested": "nested(sqrt,sqrt)"}.get(kind, kind)


def _segs(segs) -> list:
    """Segments run-length coded: ``[length, checkpointed, inner segments or None, count]``."""
    out: list = []
    for s in segs:
        inner = None if s.inner is None else _segs(s.inner.segments_for(s.length))
        item = [s.length, int(s.checkpointed), inner]
        if out and out[-1][:3] == item:
            out[-1][3] += 1
        else:
            out.append(item + [1])
    return out


def block_forward_flops(cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Matmul FLOPs of one GPT block's forward pass (2 per multiply-add), as
    ``torch.utils.flop_counter.FlopCounterMode`` counts them: the qkv projection ``2BT*D*3D``,
    ``q k^T`` and ``probs @ v`` ``2 * 2BHT^2*hd``, the out projection ``2BT*D*D`` and the MLP
    ``2 * 2BT*D*F``. Elementwise ops (LayerNorm, softmax, GELU) are not counted.
    """
    B, T, D, F, H, hd = batch, seq, cfg.d_model, cfg.d_ff, cfg.n_head, cfg.head_dim
    return 2 * B * T * (3 * D * D + D * D + 2 * D * F) + 2 * 2 * B * H * T * T * hd


def account_terms(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> dict:
    """The byte terms of the per-layer model for one framework, batch and sequence length (module doc)."""
    tensors = am.block_tensors(framework, cfg, batch, seq)
    return {
        "unit": am.layer_bytes(framework, cfg, batch, seq),
        "boundary": am.boundary_bytes(cfg, batch, seq),
        "invariant": am.stack_invariant_bytes(framework, cfg, batch, seq),
        "chain_invariant": am.chain_invariant_bytes(framework, cfg, batch, seq),
        "outside": sum(t.bytes for t in am.outside_tensors(framework, cfg, batch, seq)),
        "non_stack": am.non_stack_peak_bytes(framework, cfg, batch, seq),
        "block_flops": block_forward_flops(cfg, batch, seq),
        "tensors": [[t.name, t.what, t.bytes, int(t.per_layer)] for t in tensors],
    }


def schedule_grid(max_depth: int, policies: tuple[str, ...]) -> dict:
    """``{N: {schedule text: {"name", "segs", "units": {policy: int}, "recomputed": {policy: int}}}}``
    for every depth 1..``max_depth`` and every setting of the page's schedule controls.

    A policy enters the unit model only through whether it keeps everything (``save_everything``,
    :mod:`jaxremat.spec.cost`), so each count is computed once per kind, under the first such policy.
    """
    pols = {p: parse_policy(p) for p in policies}
    reps = {}
    for p, pol in pols.items():
        reps.setdefault(bool(getattr(pol, "save_everything", False)), pol)
    grid: dict = {}
    for n in range(1, max_depth + 1):
        row = {}
        texts = ["none", "full", "sqrt", "nested(sqrt,sqrt)"] + [schedule_text(k, p) for k in ("every_k", "segments")
                                                                 for p in range(1, n + 1)]
        for text in texts:
            sched = parse_schedule(text)
            try:
                segs = sched.segments_for(n)
            except ValueError:
                continue
            counts = {k: (peak_units(n, sched, pol), recomputed_blocks(n, sched, pol)) for k, pol in reps.items()}
            per = {p: counts[bool(getattr(pol, "save_everything", False))] for p, pol in pols.items()}
            row[text] = {"name": sched.name, "segs": _segs(segs), "units": {p: c[0] for p, c in per.items()},
                         "recomputed": {p: c[1] for p, c in per.items()}}
        grid[n] = row
    return grid


def model_data(cfg: TransformerConfig, *, frameworks=FRAMEWORK_NAMES, batches=DEFAULT_BATCHES, seqs=DEFAULT_SEQS,
               max_depth: int = DEFAULT_MAX_DEPTH, policies=("save_nothing",)) -> dict:
    """Everything the page's live part reads (module doc), as JSON-ready data.

    ``cfg``'s widths and dtype are kept; its depth and ``max_seq_len`` are the controls'. A policy
    that is not ``saves_nothing`` gets unit-model numbers only: the per-tensor account lists a
    block without remat, not what a policy keeps (as :mod:`parity.checks.predictions`).

    Raises:
        ValueError: ``cfg.dropout > 0`` (the account covers dropout 0), or ``max_depth < 1``.
    """
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    base = cfg.replace(max_seq_len=max(seqs))
    accounts = {f"{fw}|{b}|{t}": account_terms(fw, base, b, t) for fw in frameworks for b in batches for t in seqs}
    return {"frameworks": list(frameworks), "batches": list(batches), "seqs": list(seqs), "max_depth": max_depth,
            "kinds": list(SCHEDULE_KINDS), "policies": list(policies),
            "modelled_policies": [p for p in policies if parse_policy(p).saves_nothing],
            "config": {"d_model": cfg.d_model, "n_head": cfg.n_head, "d_ff": cfg.d_ff, "vocab_size": cfg.vocab_size,
                       "dtype": cfg.dtype},
            "accounts": accounts, "schedules": schedule_grid(max_depth, tuple(policies))}


def python_prediction(framework: str, cfg: TransformerConfig, batch: int, seq: int, n_layer: int, kind: str,
                      param: int, policy: str = "save_nothing") -> dict:
    """The Python model's numbers for one control setting, as the page shows them (the test's reference).

    ``saved_bytes`` / ``peak_activation_bytes`` are None for a policy that keeps something.
    """
    c = cfg.replace(n_layer=n_layer, max_seq_len=max(cfg.max_seq_len, seq))
    sched, pol = parse_schedule(schedule_text(kind, param)), parse_policy(policy)
    out = {"peak_units": peak_units(n_layer, sched, pol), "recomputed_blocks": recomputed_blocks(n_layer, sched, pol),
           "saved_bytes": None, "peak_activation_bytes": None}
    out["recompute_flops"] = out["recomputed_blocks"] * block_forward_flops(c, batch, seq)
    if pol.saves_nothing:
        out["saved_bytes"] = am.predict_saved_bytes(framework, c, batch, seq, sched)
        out["peak_activation_bytes"] = am.predict_peak_activation_bytes(framework, c, batch, seq, sched)
    return out
