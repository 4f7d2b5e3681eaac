"""Benchmark: compiled memory of jaxremat's schedules beside what a user writes by hand, and PyTorch's.

For each model (depth N x width D x batch B) it prints, side by side in one run:

* JAX, ``jax.jit(jax.value_and_grad(loss))`` compiled by XLA (``Compiled.memory_analysis()``):
  temp bytes and peak activation bytes (argument + output + temp - alias, less the parameters and
  their gradients) of

  - ``jaxremat:<schedule>``: :func:`jaxremat.model.loss_fn` (the stack through ``remat_scan``);
  - ``scan``: the same blocks in a hand-written ``lax.scan`` over the stacked parameters;
  - ``scan+ckpt``: the same with ``jax.checkpoint`` around the scanned block (what a user writes
    for per-layer remat);
  - ``unrolled``: a Python loop over per-layer parameter dicts, no remat;
  - ``unrolled+ckpt``: the same with ``jax.checkpoint`` around each block;

* PyTorch (``torchref``, eager): peak activation bytes of one forward+backward step
  (:meth:`parity.runners.torch_framework.TorchFramework.measure_plan`: storages allocated during the step) per schedule.

Every ratio is to JAX ``unrolled`` (no remat) of the same model. Nothing is timed: memory plans are
deterministic. One config is parameter-dominated (batch 1, the wider model), where a parameter
copy in temp memory would show.

Usage::

    python scripts/bench_memory.py                       # N = 4,6,8,16,32; D = 64,128; B = 1,8
    python scripts/bench_memory.py --depths 4,8 --widths 64 --batches 8 --json out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxremat.memory import compiled_stats
from jaxremat.model import block_forward, block_params_of, cross_entropy, embed, head, loss_fn
from jaxremat.spec import parse_schedule
from jaxremat.models import TransformerConfig, init_params, param_shapes
from jaxremat.models.gpt import activation as am
from jaxremat.spec.plan import parse_plan

SCHEDULES = ("none", "full", "every_k(2)", "sqrt")
BASELINES = ("scan", "scan+ckpt", "unrolled", "unrolled+ckpt")


def _config(n: int, d: int, seq: int) -> TransformerConfig:
    return TransformerConfig(vocab_size=256, n_layer=n, d_model=d, n_head=4, d_ff=4 * d, max_seq_len=seq)


def _param_bytes(cfg: TransformerConfig) -> int:
    return sum(math.prod(s) for s in param_shapes(cfg).values()) * 4


def _hand_written(kind: str, cfg: TransformerConfig):
    """``loss(params, tokens)`` of the same model, its block stack as a user writes it without jaxremat."""
    def block(lp, x):
        return block_forward(lp, x, cfg)

    body = jax.checkpoint(block) if kind.endswith("+ckpt") else block

    def loss(params, tokens):
        x = embed(params, tokens[:, :-1], cfg)
        if kind.startswith("scan"):
            x, _ = lax.scan(lambda c, lp: (body(lp, c), None), x, block_params_of(params))
        else:  # per-layer dicts, as an unrolled model holds its layers' own arrays
            for lp in params["layers"]:
                x = body(lp, x)
        return cross_entropy(head(params, x, cfg), tokens[:, 1:])

    return loss


def _unstacked(params: dict, n: int) -> dict:
    """Canonical params with the stacked block tensors replaced by a list of per-layer dicts."""
    stacked = block_params_of(params)
    rest = {k: v for k, v in params.items() if not k.startswith("h.")}
    return {**rest, "layers": [{k: v[i] for k, v in stacked.items()} for i in range(n)]}


def _jax_row(loss, params, tokens, param_bytes: int) -> dict:
    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, tokens).compile()
    st = compiled_stats(compiled)
    return {"temp_bytes": st["temp_bytes"], "peak_activation_bytes": st["peak_bytes"] - 2 * param_bytes}


def measure(n: int, d: int, batch: int, seq: int, with_torch: bool) -> list[dict]:
    """Every JAX variant and PyTorch schedule of one model; list of row dicts (bytes)."""
    cfg = _config(n, d, seq)
    pb = _param_bytes(cfg)
    params = {k: jnp.asarray(v) for k, v in init_params(cfg, seed=0).items()}
    tokens_np = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1))
    tokens = jnp.asarray(tokens_np, jnp.int32)
    rows = []
    for name in SCHEDULES:
        schedule = parse_schedule(name)
        rows.append({"framework": "jax", "variant": f"jaxremat:{name}",
                     **_jax_row(lambda p, t, s=schedule: loss_fn(p, t, cfg, s), params, tokens, pb),
                     "predicted_peak_activation_bytes": am.predict_peak_activation_bytes("jax", cfg, batch, seq, schedule)})
    split = _unstacked(params, n)
    for kind in BASELINES:
        p = split if kind.startswith("unrolled") else params
        rows.append({"framework": "jax", "variant": kind, **_jax_row(_hand_written(kind, cfg), p, tokens, pb)})
    if with_torch:
        from parity.runners.framework import get_framework

        torch_fw = get_framework("torch")
        for name in SCHEDULES:
            got = torch_fw.measure_plan(cfg, tokens_np, parse_plan(name), repeats=1)
            rows.append({"framework": "torch", "variant": f"torchref:{name}", "temp_bytes": None,
                         "peak_activation_bytes": got["peak_activation_bytes"],
                         "predicted_peak_activation_bytes": am.predict_peak_activation_bytes(
                             "torch", cfg, batch, seq, parse_schedule(name))})
    ref = next(r for r in rows if r["variant"] == "unrolled")["peak_activation_bytes"]
    for r in rows:
        r.update(n_layer=n, d_model=d, batch=batch, seq=seq, param_bytes=pb,
                 ratio_to_unrolled=r["peak_activation_bytes"] / ref)
    return rows


def _ints(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _print(rows: list[dict]) -> None:
    key = lambda r: (r["d_model"], r["batch"], r["n_layer"])  # noqa: E731
    for cfg_key in sorted({key(r) for r in rows}):
        d, b, n = cfg_key
        sel = [r for r in rows if key(r) == cfg_key]
        print(f"\nN={n} D={d} B={b} T={sel[0]['seq']}  parameters {sel[0]['param_bytes'] / 1e6:.2f} MB")
        print(f"  {'variant':<22}{'temp MB':>10}{'peak act MB':>13}{'pred MB':>10}{'/ unrolled':>12}")
        for r in sel:
            temp = "-" if r["temp_bytes"] is None else f"{r['temp_bytes'] / 1e6:.2f}"
            pred = r.get("predicted_peak_activation_bytes")
            pred = "-" if pred is None else f"{pred / 1e6:.2f}"
            print(f"  {r['variant']:<22}{temp:>10}{r['peak_activation_bytes'] / 1e6:>13.2f}{pred:>10}"
                  f"{r['ratio_to_unrolled']:>12.2f}")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", type=_ints, default=[4, 6, 8, 16, 32])
    ap.add_argument("--widths", type=_ints, default=[64, 128])
    ap.add_argument("--batches", type=_ints, default=[1, 8], help="batch sizes (1: parameters outweigh activations)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--no-torch", action="store_true", help="JAX only")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    if any(d % 4 for d in args.widths):
        ap.error(f"--widths must be multiples of 4 (the models have 4 heads), got {args.widths}")
    if args.seq < 1:
        ap.error(f"--seq must be >= 1, got {args.seq}")
    if not args.no_torch and importlib.util.find_spec("torch") is None:
        ap.error("the PyTorch rows need torch (pip install torch==2.13.0), or pass --no-torch for JAX only")
    rows = []
    for d in args.widths:
        for b in args.batches:
            for n in args.depths:
                got = measure(n, d, b, args.seq, not args.no_torch)
                _print(got)
                rows += got
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
