"""Time the remat doctor on a 24-layer GPT-2-medium-sized loss given as ``jax.ShapeDtypeStruct`` s.

The loss is written the way users write it: ``jax.checkpoint`` around the body of a ``lax.scan``
over the stacked blocks (:func:`jaxremat.model.block_forward`, which tags its activations), with a
name policy. Nothing is allocated or run: the doctor traces and compiles only.

    python scripts/doctor_gpt2.py [--layers 24] [--d-model 1024] [--seq 1024] [--batch 8] [--no-compile]

Prints the diagnosis and the wall time of ``jaxremat.doctor`` (docs/doctor.md quotes it).
"""

from __future__ import annotations

import argparse
import time

import jax
from jax import lax

import jaxremat
from jaxremat.model import block_forward, block_params_of, cross_entropy, embed, head
from jaxremat.models import TransformerConfig, param_shapes


def make_loss(cfg: TransformerConfig, policy):
    def loss(params, tokens):
        x = embed(params, tokens[:, :-1], cfg)
        body = jax.checkpoint(lambda h, p: (block_forward(p, h, cfg), None), policy=policy)
        x, _ = lax.scan(body, x, block_params_of(params))
        return cross_entropy(head(params, x, cfg), tokens[:, 1:])

    return loss


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args(argv)
    cfg = TransformerConfig(vocab_size=a.vocab, n_layer=a.layers, d_model=a.d_model, n_head=a.d_model // 64,
                            d_ff=4 * a.d_model, max_seq_len=a.seq)
    params = {k: jax.ShapeDtypeStruct(s, "float32") for k, s in param_shapes(cfg).items()}
    tokens = jax.ShapeDtypeStruct((a.batch, a.seq + 1), "int32")
    policy = jax.checkpoint_policies.save_only_these_names("qkv_proj", "mlp_hidden")
    t0 = time.perf_counter()
    diagnosis = jaxremat.doctor(make_loss(cfg, policy), params, tokens, compile=not a.no_compile)
    wall_s = time.perf_counter() - t0
    print(diagnosis)
    n_params = sum(int(jax.numpy.prod(jax.numpy.array(s.shape))) for s in params.values())
    print(f"doctor wall time: {wall_s:.1f} s ({a.layers} layers, D {a.d_model}, T {a.seq}, B {a.batch}, "
          f"V {a.vocab}, {n_params / 1e6:.0f}M parameters, backend {jax.default_backend()})")


if __name__ == "__main__":
    main()
