"""Bit for bit under ``jit`` for every plan at every width (docs/framework-differences.md, section 2).

Property: for a GPT stack of any width (d_model 4..128) and depth (N = 1..8), under any plan
(``full``, ``every_k``, ``segments``, ``nested``, segment plans with one-block segments and
policies), with dropout 0 or 0.1, in float32 or with bfloat16 compute, the loss and every
gradient of ``jax.jit(jax.value_and_grad(loss_fn))`` equal ``none``'s bit for bit (the default
rendering, ``remat_scan(method="reverse_loop")``). Before each layer ran as an isolated XLA
computation (:mod:`jaxremat.layer_pass`), one-block segments at d_model 32 were ~1.5e9 ULP off.

One random example per run plus the pinned ``gpt-tiny`` case keep this test near 20 s on two
cores; ``JAXREMAT_SLOW_TESTS=1`` runs 40 examples, and ``python scripts/bitwise_sweep.py`` a grid.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jaxremat.model import loss_fn
from jaxremat.models import TransformerConfig, init_params
from jaxremat.spec import parse_schedule

POLICIES = ("save_nothing", "save_dots", "save_dots_no_batch", "attention_only", "mlp_only", "save_qkv_proj",
            "save_out_proj", "save_dots_except_mlp")
EXAMPLES = 40 if os.environ.get("JAXREMAT_SLOW_TESTS") == "1" else 1


@st.composite
def segment_plans(draw, n: int) -> str:
    """``plan(...)`` over ``n`` blocks: a checkpointed one-block segment first, then any segments."""
    items, left = [f"1+{draw(st.sampled_from(POLICIES))}"], n - 1
    while left:
        length = draw(st.integers(1, left))
        kind = draw(st.sampled_from(("store",) + POLICIES))
        items.append(f"{length}:store" if kind == "store" else f"{length}+{kind}")
        left -= length
    return f"plan({','.join(items)})"


@st.composite
def plans(draw, n: int) -> str:
    kind = draw(st.sampled_from(("full", "every_k", "segments", "nested", "plan")))
    if kind == "full":
        return "full"
    if kind == "every_k":
        return f"every_k({draw(st.integers(1, n))})"
    if kind == "segments":
        return f"segments({draw(st.integers(1, n))})"
    if kind == "nested":
        return draw(st.sampled_from(("nested(sqrt,sqrt)", "nested(every_k(2),every_k(1))")))
    return draw(segment_plans(n))


@st.composite
def cases(draw):
    n = draw(st.integers(1, 8))
    return (draw(st.integers(1, 32)) * 4, n, draw(plans(n)), draw(st.sampled_from((0.0, 0.1))),
            draw(st.sampled_from((None, "bfloat16"))))


def _value_and_grad(cfg: TransformerConfig, plan: str):
    params = {k: jnp.asarray(v) for k, v in init_params(cfg, seed=1).items()}
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.max_seq_len + 1)), jnp.int32)
    key = jax.random.key(0) if cfg.dropout else None
    schedule = parse_schedule(plan)
    loss, grads = jax.jit(jax.value_and_grad(lambda p, t, k: loss_fn(p, t, cfg, schedule, k)))(params, tokens, key)
    return np.asarray(loss), {k: np.asarray(v) for k, v in grads.items()}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
@example(case=(32, 4, "plan(1+save_dots,1+save_nothing,2:store)", 0.0, None))  # gpt-tiny's width, one-block segments
def test_every_plan_bitwise_with_none_under_jit(case, bits):
    d, n, plan, dropout, compute = case
    cfg = TransformerConfig(vocab_size=16, n_layer=n, d_model=d, n_head=2 if d % 8 == 0 else 1, d_ff=2 * d,
                            max_seq_len=4, dropout=dropout, compute_dtype=compute)
    (la, ga), (lb, gb) = _value_and_grad(cfg, plan), _value_and_grad(cfg, "none")
    assert bits.equal(la, lb), (case, float(la), float(lb))
    bits.assert_tree(ga, gb, f"{case} grads")


def test_full_at_width_96_three_layers_bitwise_with_none_under_jit(bits):
    """Found by the search above: the causal mask hoisted out of ``none``'s one-trip loops but inlined in
    ``full``'s branches, where LLVM contracted the softmax's ``scores * scale - max`` into an FMA
    (``jaxremat.same_program.hoist_constants``; ``python scripts/bitwise_mechanisms.py hoist``)."""
    cfg = TransformerConfig(vocab_size=16, n_layer=3, d_model=96, n_head=2, d_ff=192, max_seq_len=4)
    (_, ga), (_, gb) = _value_and_grad(cfg, "full"), _value_and_grad(cfg, "none")
    bits.assert_tree(ga, gb, "d_model 96, N=3, full grads")
