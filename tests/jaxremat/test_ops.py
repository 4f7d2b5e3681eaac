"""jaxremat.ops: lean LayerNorm / GELU / masked softmax.

Pinned here: forward values bitwise those of the plain formulas; gradients (reverse and forward
mode) within float32/float64 rounding of autodiff through the plain formulas; what each op keeps
for its backward pass (PyTorch's bytes); and under remat the rule's forward runs once per forward
pass and once per recompute, never more.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxremat.memory import saved_residuals
from jaxremat.ops import batched_matmul, gelu, layer_norm, masked_softmax
from jaxremat.render import remat_scan
from jaxremat.tags import sub_jaxprs

RTOL = {"float32": 2e-6, "float64": 1e-13}


def _plain_layer_norm(x, w, b, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    c = x - mean
    return c * lax.rsqrt(jnp.mean(jnp.square(c), axis=-1, keepdims=True) + eps) * w + b


def _plain_softmax(s, mask, scale):
    return jax.nn.softmax(jnp.where(mask, s * scale, -jnp.inf), axis=-1)


def _inputs(dtype, shape=(2, 5, 8)):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=shape), dtype)
    w = jnp.asarray(rng.normal(1.0, 0.2, shape[-1:]), dtype)
    b = jnp.asarray(rng.normal(0.0, 0.2, shape[-1:]), dtype)
    return x, w, b


CASES = {
    "layer_norm": (lambda x, w, b: layer_norm(x, w, b, 1e-5), lambda x, w, b: _plain_layer_norm(x, w, b, 1e-5)),
    "gelu_tanh": (lambda x, w, b: gelu(x * w + b), lambda x, w, b: jax.nn.gelu(x * w + b, approximate=True)),
    "gelu_erf": (lambda x, w, b: gelu(x * w + b, False), lambda x, w, b: jax.nn.gelu(x * w + b, approximate=False)),
    "masked_softmax": (
        lambda x, w, b: masked_softmax(x * w, jnp.tril(jnp.ones((5, 8), bool)), 0.5),
        lambda x, w, b: _plain_softmax(x * w, jnp.tril(jnp.ones((5, 8), bool)), 0.5)),
}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", CASES)
def test_forward_bitwise_and_gradients_within_rounding_of_the_plain_formula(op, dtype):
    lean, plain = CASES[op]
    with jax.enable_x64(dtype == "float64"):
        x, w, b = _inputs(dtype)
        assert np.array_equal(np.asarray(jax.jit(lean)(x, w, b)), np.asarray(jax.jit(plain)(x, w, b)))
        ct = jnp.asarray(np.random.default_rng(1).normal(size=x.shape), dtype)
        loss = lambda f: lambda *a: jnp.sum(f(*a) * ct)  # noqa: E731
        g_lean = jax.grad(loss(lean), argnums=(0, 1, 2))(x, w, b)
        g_plain = jax.grad(loss(plain), argnums=(0, 1, 2))(x, w, b)
        for gl, gp in zip(g_lean, g_plain):
            assert gl.dtype == gp.dtype == jnp.dtype(dtype)
            assert _rel(gl, gp) <= RTOL[dtype], (op, _rel(gl, gp))
        # forward mode: the rule is a JVP, so jax.jvp works and agrees
        tangents = tuple(jnp.ones_like(a) for a in (x, w, b))
        _, t_lean = jax.jvp(lean, (x, w, b), tangents)
        _, t_plain = jax.jvp(plain, (x, w, b), tangents)
        assert _rel(t_lean, t_plain) <= RTOL[dtype], (op, _rel(t_lean, t_plain))


def _kept(fn, *args):
    return sorted((r.shape, r.dtype) for r in saved_residuals(fn, *args) if not r.is_argument)


def test_each_op_keeps_what_pytorch_keeps():
    x, w, b = _inputs("float32")
    # LayerNorm: the normalised input and rsqrt(var + eps) (PyTorch: input, mean, rstd)
    assert _kept(lambda x, w, b: layer_norm(x, w, b, 1e-5).sum(), x, w, b) == [((2, 5, 1), "float32"),
                                                                               ((2, 5, 8), "float32")]
    # GELU: one tensor of the input's size (PyTorch: the input)
    assert _kept(lambda x: (gelu(x) * x).sum(), x) == [((2, 5, 8), "float32"), ((2, 5, 8), "float32")]
    assert len(_kept(lambda x: gelu(x).sum(), x)) == 1
    # masked softmax: its output only (PyTorch: output and mask)
    mask = jnp.tril(jnp.ones((5, 8), bool))
    ct = jnp.arange(8.0)  # a linear loss: only the softmax's own residual
    assert _kept(lambda s: (masked_softmax(s, mask, 0.5) * ct).sum(), x) == [((2, 5, 8), "float32")]
    # the plain formulas keep more
    assert len(_kept(lambda x, w, b: _plain_layer_norm(x, w, b, 1e-5).sum(), x, w, b)) > 2


def test_masked_softmax_tag_is_the_one_residual():
    mask = jnp.tril(jnp.ones((5, 8), bool))
    x = _inputs("float32")[0]
    ct = jnp.arange(8.0)
    recs = [r for r in saved_residuals(lambda s: (masked_softmax(s, mask, 0.5, "attn_probs") * ct).sum(), x)
            if not r.is_argument]
    assert len(recs) == 1 and "attn_probs" in recs[0].description


def test_batched_matmul_keeps_unit_axes_and_matches_matmul():
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(1, 1, 4, 3)), jnp.float32)
    b = jnp.asarray(rng.normal(size=(1, 1, 5, 3)), jnp.float32)
    out = batched_matmul(a, b, transpose_b=True)
    assert out.shape == (1, 1, 4, 5)
    np.testing.assert_allclose(out, a @ jnp.swapaxes(b, -1, -2), rtol=1e-6)
    kept = _kept(lambda a, b: (batched_matmul(a, b, transpose_b=True) ** 2).sum(), a, b)
    assert all(len(s) == 4 for s, _ in kept)  # no squeezed copies


def _runs(jaxpr, op: str) -> int:
    """How many times primitive ``op`` runs per pass of ``jaxpr``: loop bodies count once per body,
    a ``cond`` counts its largest branch (one branch runs), other sub-programs in full."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == op
        subs = [j.jaxpr if hasattr(j, "jaxpr") else j for j in sub_jaxprs(eqn)]  # jax_remat3's regions too
        if eqn.primitive.name == "cond":
            n += max(_runs(j, op) for j in subs)
        else:
            n += sum(_runs(j, op) for j in subs)
    return n


def _count(fn, args, op: str) -> int:
    return _runs(jax.make_jaxpr(fn)(*args).jaxpr, op)


@pytest.mark.parametrize("method", ["reverse_loop", "checkpoint"])
def test_rule_forward_runs_once_per_pass_and_once_per_recompute(method):
    """Under ``full`` the program holds none's ops plus one recompute of the forward, no more.

    ``rsqrt`` (LayerNorm) and ``tanh`` (GELU) are counted in the program (:func:`_runs`): the forward
    alone, ``grad`` under ``none`` (the rule's forward once), ``grad`` under ``full``. With
    ``jax.checkpoint`` (``method="checkpoint"``): a plain forward pass, then the recompute, which
    repeats the rule's forward less what nothing reads. In the reverse loop every layer's forward
    pass and its recompute are the same isolated program, ``none``'s forward with its residuals
    (:mod:`jaxremat.layer_pass`): twice what ``none``'s forward pass computes, backward excluded.
    """
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(1, 0.1, (4, 8)), jnp.float32),
              "b": jnp.zeros((4, 8), jnp.float32), "m": jnp.asarray(rng.normal(0, 0.3, (4, 8, 8)), jnp.float32)}
    x = jnp.ones((3, 8))

    def block(p, x, _):
        return x + gelu(layer_norm(x, p["w"], p["b"], 1e-5) @ p["m"])

    def loss(schedule):
        return lambda p, x: jnp.sum(remat_scan(block, p, x, schedule, method=method) ** 2)

    for op in ("rsqrt", "tanh"):
        forward = _count(loss("none"), (params, x), op)
        none_grad = _count(jax.grad(loss("none")), (params, x), op)
        full_grad = _count(jax.grad(loss("full")), (params, x), op)
        assert forward >= 1 and none_grad >= forward, (op, forward, none_grad)
        if method == "checkpoint":  # the recompute is there, and repeats at most one forward
            assert forward < full_grad <= none_grad + forward, (op, forward, none_grad, full_grad)
        else:  # forward pass and recompute: each the forward program of none's jax.vjp
            none_forward = _count(lambda p, x: jax.vjp(loss("none"), p, x), (params, x), op)
            assert full_grad == 2 * none_forward and forward <= none_forward, (op, forward, none_forward, full_grad)
    g = jax.grad(loss("full"))(params, x)
    assert all(math.isfinite(float(v.sum())) for v in g.values())
