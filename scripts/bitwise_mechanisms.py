"""Two ways XLA once computed a layer otherwise in ``none`` than in a recompute, shown in the HLO.

``fold``: a layer's input that is a constant of the program (closed over by the differentiated
function, not an argument of ``jit``). The layer below runs as a ``lax.cond`` branch with a
predicate XLA cannot fold, as :func:`jaxremat.layer_pass.isolate` runs it. With a constant operand
XLA moves the operand into the branch and folds what depends on it alone at compile time (its HLO
evaluator); on a run-time value the compiled loops compute it. The script prints the constants
of the compiled branch whose ``op_name`` names ``sqrt`` or ``div`` (the LayerNorm's statistics,
folded), and the ULP between the two programs' outputs; then the same with the branch reading its
operand through ``lax.optimization_barrier`` (what jaxremat does): nothing folded, bitwise.

``excess``: bfloat16 compute. XLA's ``xla_allow_excess_precision`` (on by default) folds
``convert(convert(x))`` (float32 to bfloat16 and back) to ``x``: a consumer of a bfloat16 matrix
product reads its float32 result unrounded, where a recompute that reads the saved bfloat16 value
reads it rounded. The script compiles ``x + (a @ w).astype(float32)`` with ``a @ w`` in
bfloat16 and prints whether the optimized HLO still rounds the product to bfloat16 before the add,
and the ULP against the same sum computed from the rounded product; then with the product read
through ``lax.optimization_barrier`` (what jaxremat does, :func:`jaxremat.layer_pass.round_saveable`).

``hoist``: a value computed from constants alone inside a layer, the causal mask ``iota >= iota`` of
a masked softmax. The layer runs as a ``lax.cond`` branch (:func:`jaxremat.layer_pass.isolate`, as a
checkpointed segment runs its forward pass) and as the body of a one-trip ``while`` loop (``isolate``
with buffers, as ``none``'s forward pass runs it). XLA's loop-invariant code motion hoists the mask
out of the loop, whose fusions read it from a buffer; the branch's fusions compute it inline, LLVM
folds the ``select`` on the mask's all-True first column and contracts ``scores * scale - max`` there
into one fused multiply-add (XLA:CPU compiles with ``fp-contract=fast``), where the loop rounds the
product first. The script prints where each program computes the mask and the ULP between them;
then with the mask computed outside the layer and read as an operand in both (what jaxremat does,
:func:`jaxremat.same_program.hoist_constants`): bitwise.

Usage::

    python scripts/bitwise_mechanisms.py fold [--width 12]
    python scripts/bitwise_mechanisms.py excess [--width 48]
    python scripts/bitwise_mechanisms.py hoist [--width 4]   (--width: the sequence length T)
"""

from __future__ import annotations

import argparse
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxremat.layer_pass import isolate
from jaxremat.same_program import run_time


def _ulp(a, b) -> int:
    a, b = np.asarray(a, np.float32).view(np.int32), np.asarray(b, np.float32).view(np.int32)
    return int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max())


def _layer(x, w):
    """LayerNorm (mean / var / sqrt) and a matrix product: the statistics are what folds."""
    m = x.mean(-1, keepdims=True)
    h = (x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    return jnp.tanh(h @ w)


def _branch(barrier: bool):
    def run(x, w):
        pred = (lax.bitcast_convert_type(w[0, 0], jnp.int32) >> 31) <= 0  # True, unknown to XLA
        read = (lambda op: lax.optimization_barrier(op)) if barrier else (lambda op: op)
        return lax.cond(pred, lambda op: _layer(*read(op)), lambda op: jnp.zeros((op[0].shape[0], op[1].shape[1])),
                        (x, w))
    return run


def _folded(text: str) -> list[str]:
    return [re.sub(r", metadata=\{op_name=\"([^\"]*)\".*", r"  (\1)", ln.strip())[:160]
            for ln in text.splitlines() if " constant(" in ln and re.search(r'op_name="[^"]*/(sqrt|div)"', ln)]


def fold(width: int) -> int:
    """Print the folded statistics and the ULP per rendering of the branch; 0."""
    x = jax.random.normal(jax.random.key(1), (3, width))
    w = jax.random.normal(jax.random.key(2), (width, 2 * width)) / np.sqrt(width)
    for barrier in (False, True):
        run = _branch(barrier)
        const = jax.jit(lambda w: run(x, w)).lower(w).compile()  # x closed over: a constant
        arg = jax.jit(run)
        folded = _folded(const.as_text())
        print(f"branch {'behind optimization_barrier' if barrier else 'reading its operand'}: "
              f"{len(folded)} folded sqrt/div constants; max ULP, constant input vs argument: "
              f"{_ulp(const(w), arg(x, w))}")
        for line in folded:
            print("    " + line)
    return 0


def excess(width: int) -> int:
    """Print whether the bfloat16 product is rounded before its float32 consumer, per rendering; 0."""
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (3, width))
    a = jax.random.normal(k[1], (3, 2 * width)).astype(jnp.bfloat16)
    w = (jax.random.normal(k[2], (2 * width, width)) / np.sqrt(2 * width)).astype(jnp.bfloat16)
    saved = jax.jit(lambda a, w: a @ w)(a, w)  # the product as a policy saves it: bfloat16
    from_saved = np.asarray(x + saved.astype(jnp.float32))
    for barrier in (False, True):
        def carry(x, a, w, barrier=barrier):
            p = a @ w
            return x + (lax.optimization_barrier(p) if barrier else p).astype(jnp.float32)
        compiled = jax.jit(carry).lower(x, a, w).compile()
        rounds = bool(re.search(r"bf16\[3,\d+\]\S* (convert|fusion)", compiled.as_text()))
        print(f"product {'behind optimization_barrier' if barrier else 'read directly'}: rounded to bf16 in the "
              f"optimized HLO: {rounds}; max ULP against the saved product: {_ulp(compiled(x, a, w), from_saved)}")
    return 0


def _masked_softmax(scores, mask):
    x = jnp.where(mask, scores * np.float32(0.144337565), -jnp.inf)
    e = jnp.exp(x - x.max(-1, keepdims=True))
    return e * (1.0 / e.sum(-1, keepdims=True))


def hoist(seq: int) -> int:
    """Print where the mask is computed and the ULP between the branch and the loop, per rendering; 0."""
    scores = jax.random.normal(jax.random.key(0), (64, 2, seq, seq)) * 3
    causal = lambda: jnp.tril(jnp.ones((seq, seq), bool))  # noqa: E731
    for outside in (False, True):
        def layer(op, bufs=None, outside=outside):
            s, mask = op
            out = _masked_softmax(s, mask if outside else causal())
            return out if bufs is None else (out, bufs)

        def run(s, as_loop, outside=outside, layer=layer):
            pred = s[0, 0, 0, 0]  # isolate's predicate value: True at run time, unknown to XLA
            mask = run_time([causal()], lax.bitcast_convert_type(pred, jnp.int32) >> 31 <= 0)[0] if outside else None
            return isolate(layer, (s, mask), pred, [jnp.zeros(())])[0] if as_loop else isolate(layer, (s, mask), pred)
        branch, loop = (jax.jit(lambda s, as_loop=as_loop, run=run: run(s, as_loop)).lower(scores).compile()
                        for as_loop in (False, True))
        print(f"mask {'computed outside the layer, an operand' if outside else 'computed inside the layer'}: "
              f"branch: {_where(branch.as_text(), seq)}; loop: {_where(loop.as_text(), seq)}; "
              f"max ULP, branch vs loop: {_ulp(branch(scores), loop(scores))}")
    return 0


def _where(text: str, seq: int) -> str:
    """``iota`` in a fusion beside the exponential (inline) or the mask read from a ``pred`` buffer."""
    fusions = re.findall(r"\n(%fused_computation[^\n]*\{.*?\n\})", text, flags=re.S)
    inline = any("iota(" in f and "exponential(" in f for f in fusions)
    buffer = any(re.search(rf"pred\[{seq},{seq}\]\S* parameter", f) and "exponential(" in f for f in fusions)
    return "mask inline in the softmax's fusion" if inline else (
        "mask read from a buffer" if buffer else "mask not found")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mechanism", choices=("fold", "excess", "hoist"))
    ap.add_argument("--width", type=int, default=None,
                    help="d_model (fold: 12, excess: 48); hoist: the sequence length (4)")
    args = ap.parse_args(argv)
    if args.mechanism == "fold":
        return fold(args.width or 12)
    if args.mechanism == "hoist":
        return hoist(args.width or 4)
    return excess(args.width or 48)


if __name__ == "__main__":
    raise SystemExit(main())
