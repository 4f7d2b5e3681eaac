"""Memory a run needs, estimated from its configuration before any work starts.

A run that cannot fit is refused with the estimate in the message, instead of allocating for
minutes until the machine swaps or the kernel kills it (a ``config.json`` with ``n_layer`` 10^9,
or a huge ``d_model``, vocabulary or sequence length). The estimate is a lower bound in bytes:

* **model state** per framework while one case runs: parameters, gradients, AdamW's two moments,
  the trained weights and a host copy of the gradients: 6 x P bytes (P = parameter bytes in the
  run's dtype, :func:`jaxremat.models.param_shapes`);
* **kept results**: the suite keeps each case's gradients (and trained weights under ``jit`` and
  in PyTorch) until the dtype's cross-framework comparison: 1-2 x P per case;
* **weights in host memory**: the loaded checkpoint (or initial weights), once per dtype;
* **activations** of one step under ``none`` (the largest), from the per-layer model
  (:func:`jaxremat.models.gpt.activation.predict_peak_activation_bytes`), or the residual stream
  times 16 per layer where that model does not apply.

Nothing here is O(n_layer): every count comes from the stacked parameter shapes. The libraries'
own memory and XLA's compiles are not counted: measured peak resident memory was 2.3 GiB for the
default run (estimate 92 MiB) and 8.2 GiB for ``--model minilm-l6`` with four plans (estimate 2.8 GiB), so the check
refuses what cannot fit, never what might.
"""

from __future__ import annotations

import math

import numpy as np

from jaxremat.spec import parse_schedule
from jaxremat.models import TransformerConfig, param_shapes

from parity.report.environment import available_memory_bytes
from parity.report.format import fmt_bytes
from parity.runners.framework import FRAMEWORKS, get_framework
from jaxremat.models.gpt import activation as am

HEADROOM = 0.9
"""Fraction of the available memory a run may plan to use."""


def parameter_count(cfg: TransformerConfig) -> int:
    """Number of parameters of ``cfg`` (all stacked layers included)."""
    return sum(math.prod(s) for s in param_shapes(cfg).values())


def activation_bytes(framework: str, cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Activation bytes of one step under ``none`` (per-layer model, or 16 residual streams per layer)."""

    try:
        return int(am.predict_peak_activation_bytes(framework, cfg.replace(dropout=0.0), batch, seq,
                                                    parse_schedule("none")))
    except (ValueError, KeyError):
        item = np.dtype(cfg.dtype).itemsize
        return 16 * cfg.n_layer * batch * seq * max(cfg.d_model, cfg.d_ff) * item + batch * seq * cfg.vocab_size * item


def run_estimate(cfg: TransformerConfig, batch: int, seq: int, frameworks, dtypes, kept_cases: int,
                 extra_host_bytes: int = 0) -> tuple[int, str]:
    """Estimated peak bytes of a suite run and a one-line account of it.

    Args:
        cfg: the model (its dtype is replaced by each of ``dtypes``).
        batch, seq: B and T.
        frameworks: the frameworks that run.
        dtypes: the dtypes that run (the largest dominates).
        kept_cases: cases per dtype whose results are kept until the comparison.
        extra_host_bytes: bytes already known to be needed (a checkpoint file read into memory).
    """
    best, account = 0, ""
    for dtype in dtypes:
        c = cfg.replace(dtype=dtype)
        p = parameter_count(c) * np.dtype(dtype).itemsize
        act = max(activation_bytes(fw, c, batch, seq) for fw in frameworks)
        state, kept = 6 * p, 2 * p * kept_cases
        total = state + kept + p + act + extra_host_bytes
        if total > best:
            best = total
            account = (f"{parameter_count(c):,} parameters in {dtype} ({fmt_bytes(p)}): model state {fmt_bytes(state)}, "
                       f"{kept_cases} kept results {fmt_bytes(kept)}, weights {fmt_bytes(p + extra_host_bytes)}, "
                       f"activations {fmt_bytes(act)}")
    return best, account


def check_fits(needed: int, account: str, what: str, available: int | None = None) -> None:
    """Raise ValueError when ``needed`` bytes exceed :data:`HEADROOM` of the available memory.

    Args:
        needed: the estimate in bytes.
        account: how the estimate was made (goes into the message).
        what: what is being sized, e.g. ``"this run"``.
        available: bytes available (default: :func:`parity.report.environment.available_memory_bytes`;
            None when unknown, which skips the check).

    Raises:
        ValueError: the estimate does not fit; the message gives both numbers and the account.
    """
    if available is None:
        available = available_memory_bytes()
    if available is None or needed <= HEADROOM * available:
        return
    raise ValueError(f"{what} needs at least an estimated {fmt_bytes(needed)} of memory but {fmt_bytes(available)} is "
                     f"available ({account}); use a smaller configuration")


def check_device_fits(cfg: TransformerConfig, batch: int, seq: int, dtypes, frameworks) -> None:
    """On a GPU: refuse a run whose one-case state and activations exceed a framework's device memory
    (:meth:`parity.runners.framework.Framework.device_memory_bytes`; None where it computes on the CPU).

    Raises:
        ValueError: it does not fit (the message gives the estimate and the device's limit).
    """
    for fw in frameworks:
        limit = get_framework(fw).device_memory_bytes()
        if limit is None:
            continue
        for dtype in dtypes:
            c = cfg.replace(dtype=dtype)
            p = parameter_count(c) * np.dtype(dtype).itemsize
            need = 4 * p + activation_bytes(fw, c, batch, seq)
            if need > HEADROOM * limit:
                raise ValueError(f"{FRAMEWORKS[fw].label} on the GPU needs an estimated {fmt_bytes(need)} per case in "
                                 f"{dtype} (parameters, gradients, AdamW state, activations) but the device holds "
                                 f"{fmt_bytes(limit)}; use a smaller configuration or run --frameworks without {fw}")
