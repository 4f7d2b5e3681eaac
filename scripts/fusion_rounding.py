"""Why a recompute could round apart from the forward pass under ``jit``: the mechanism, shown in HLO and LLVM IR.

The second LayerNorm of a GPT block reads ``x1 = x + (y @ W + b)``. In ``none``'s forward pass
``x1`` is also the block's output path, so XLA writes it out and the LayerNorm's statistics read a
buffer; in a recompute whose block output is unused, XLA fuses ``x1`` into the statistics' loops
instead. XLA:CPU emits reduction loops with LLVM's ``reassoc`` flag, and LLVM's loop vectorizer
then chooses the summation order per loop: across rows (one row per vector lane, the terms of a
row in order) or along the reduced axis (8 lanes, two accumulators, then across lanes). The two
programs below compute the same statistics of the same ``x1`` at d_model 32 (B=2, T=16, as
``gpt-tiny``); this script prints:

1. how many of the 32 rows' ``rsqrt(var + eps)`` differ between them (an ULP each);
2. the fusions of each optimized HLO program (``Compiled.as_text()``): ``x1`` written out
   (``add_add_fusion``, then a reduce reading it) versus fused into every reduction
   (``add_reduce_fusion``, ``add_rsqrt_fusion`` reading ``x``, ``b`` and the product);
3. the vectorized loops of the variance fusion in each program's LLVM IR (``--xla_dump_to``):
   lanes that index rows (``<8 x i64>`` row induction) versus a ``vector.reduce.fadd`` over 8
   partial sums along the reduced axis.

jaxremat runs every layer's forward pass, recompute and backward pass as one isolated XLA
computation with every output read, and LayerNorm's statistics as a computation of their own
(:mod:`jaxremat.layer_pass`, :func:`jaxremat.ops.layer_norm`), so this choice is made once for
every pass (docs/framework-differences.md, section 2).

Usage::

    python scripts/fusion_rounding.py [--width 32]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tempfile

DUMP = tempfile.mkdtemp(prefix="fusion_rounding_")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP}").strip()

import jax  # noqa: E402  (XLA_FLAGS must be set first)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402


def statistics(x1, eps=1e-5):
    """LayerNorm's normalised input and ``rsqrt(var + eps)``, written plainly (nothing isolated)."""
    mean = jnp.mean(x1, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x1 - mean), axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    return (x1 - mean) * rstd, rstd


def written_out(x, d, b):
    """``none``'s forward pass: ``x1`` is also an output (the block's output path reads it)."""
    x1 = x + (d.reshape(x.shape) + b)
    return (x1,) + statistics(x1)


def fused(x, d, b):
    """A recompute whose block output is unused: only the statistics of ``x1`` are needed."""
    return statistics(x + (d.reshape(x.shape) + b))


def _fusions(compiled_text: str) -> list[str]:
    entry = compiled_text[compiled_text.index("ENTRY"):]
    return [re.sub(r"\{[0-9,]*\}|, metadata=\{[^}]*\}|, backend_config=.*", "", line).strip()
            for line in entry.splitlines() if " fusion(" in line]


def _vector_lines(module_name: str) -> list[str]:
    keep = ("vector.reduce.fadd", "<8 x i64>", "fadd reassoc <8 x float>")
    out = []
    for path in sorted(glob.glob(os.path.join(DUMP, f"*{module_name}*multiply_reduce*ir-with-opt.ll")) +
                       glob.glob(os.path.join(DUMP, f"*{module_name}*add_rsqrt*ir-with-opt.ll"))):
        lines = [ln.strip() for ln in open(path) if any(k in ln for k in keep)]
        out.append(f"{os.path.basename(path)}: {len(lines)} matching lines")
        out += [f"    {ln[:110]}" for ln in lines[:4]]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=32, help="d_model (the reduced axis)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 16, args.width)), jnp.float32)
    d = jnp.asarray(rng.standard_normal((32, args.width)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((args.width,)), jnp.float32)
    a_fn, f_fn = jax.jit(written_out), jax.jit(fused)
    (_, _, rstd_a), (_, rstd_f) = a_fn(x, d, b), f_fn(x, d, b)
    differ = int((np.asarray(rstd_a) != np.asarray(rstd_f)).sum())
    print(f"d_model {args.width}: rsqrt(var + eps) differs in {differ} of {rstd_a.size} rows")
    for name, fn in (("x1 written out (none's forward pass)", a_fn), ("x1 fused (the recompute)", f_fn)):
        print(f"\n{name}: fusions of the optimized HLO")
        for line in _fusions(fn.lower(x, d, b).compile().as_text()):
            print("   ", line[:150])
    print(f"\nLLVM IR of the variance loops (dump in {DUMP}):")
    for module in ("jit_written_out", "jit_fused"):
        print(f"  {module}")
        for line in _vector_lines(module):
            print("   ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
