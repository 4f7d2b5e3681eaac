"""``jax.custom_vjp`` ops under remat: where the rule runs, what is saved, and the bits, per choice.

The block is ``h + dense_gelu(h, w)``, ``dense_gelu`` a ``custom_vjp`` whose ``fwd`` keeps ``(x, w,
x @ w)``. The first operation of its primal and of its ``fwd`` carry tags of their own, counted in
the program of ``jax.grad`` (:func:`jaxremat.custom_vjp.count_named_runs`), N=4 layers.
"""

import functools
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxremat.custom_vjp import CUSTOM_VJP_RESIDUAL, count_named_runs
from jaxremat.flax import RematStack, linen_init_stack, linen_remat_stack, remat_stack
from jaxremat.lint import check_plan
from jaxremat.memory import saved_activation_bytes
from jaxremat.render import remat_scan
from jaxremat.spec import parse_schedule
from jaxremat.spec.lint import RematPolicyWarning

N, B, D = 4, 2, 8
UNIT = B * D * 4  # bytes of one (B, D) float32 activation
PRIMAL, FWD = "rule_primal", "rule_fwd"
SCHEDULES = ["none", "full", "every_k(2)", "sqrt"]
SLOW = pytest.mark.jaxremat_slow
# JAX's jax_remat3 flag (docs/usage.md, "JAX versions"): jax.checkpoint then runs a custom_vjp's primal in a
# checkpointed forward pass and its fwd in the recompute (what optimize_remat=True does without the flag), so
# custom_vjp_residuals="save" through jax.checkpoint would keep nothing, and remat_scan refuses it.
REMAT3 = jax.config.jax_remat3
REFUSED = "custom_vjp_residuals='save' keeps nothing through jax.checkpoint under jax_remat3"
CPU_ONLY = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's fusion and rounding are pinned here")


def dense_gelu_op(optimize_remat: bool = False, effect: bool = False):
    """``gelu(x @ w)`` as a ``jax.custom_vjp``; ``effect`` puts a ``jax.debug.callback`` in ``fwd``."""
    @jax.custom_vjp
    def dense_gelu(x, w):
        return jax.nn.gelu(checkpoint_name(x @ w, PRIMAL))

    def fwd(x, w):
        if effect:
            jax.debug.callback(lambda v: None, x)
        h = checkpoint_name(x @ w, FWD)
        return jax.nn.gelu(h), (x, w, h)

    def bwd(res, g):
        x, w, h = res
        dh = jax.vjp(jax.nn.gelu, h)[1](g)[0]
        return dh @ w.T, x.T @ dh

    dense_gelu.defvjp(fwd, bwd, optimize_remat=optimize_remat)
    return dense_gelu


OPS = {key: dense_gelu_op(*key) for key in [(False, False), (True, False), (True, True)]}
W = X = None  # the stacked weights and the input, set when the module's first test runs (stack_inputs)


@pytest.fixture(scope="module", autouse=True)
def _module_arrays(stack_inputs):
    global W, X
    W, X = stack_inputs(N, D, B)


def loss(schedule, method="reverse_loop", choice="recompute", policy=None, op=(False, False), combine="add"):
    dense_gelu = OPS[op]

    def block(w, h, _):
        return h + dense_gelu(h, w) if combine == "add" else h * dense_gelu(h, w)

    return lambda w, x: jnp.sum(remat_scan(block, w, x, schedule, method=method, policy=policy,
                                           custom_vjp_residuals=choice) ** 2)


def runs(*case, **kw) -> dict:
    out = count_named_runs(jax.grad(loss(*case, **kw)), W, X)
    out.pop(CUSTOM_VJP_RESIDUAL, None)
    return out


@functools.cache
def jit_grads(*case, **kw):
    return np.asarray(jax.jit(jax.grad(loss(*case, **kw)))(W, X))


def eager_grads(*case):
    with jax.disable_jit():
        return np.asarray(jax.grad(loss(*case))(W, X))


def ulp_per_layer(a, b) -> list[int]:
    ia, ib = (np.asarray(t).view(np.int32).astype(np.int64) for t in (a, b))
    return [int(np.abs(ia[i] - ib[i]).max()) for i in range(N)]


# {schedule: runs} of the rule's primal and fwd, per (method, choice)
RUNS = {
    ("reverse_loop", "recompute"): {"none": {FWD: 4}, "full": {FWD: 8}, "every_k(2)": {FWD: 8}, "sqrt": {FWD: 6}},
    ("reverse_loop", "save"): dict.fromkeys(SCHEDULES, {FWD: 4}),
    ("checkpoint", "recompute"): {"none": {FWD: 4}, "full": {FWD: 8}, "every_k(2)": {FWD: 8}, "sqrt": {FWD: 6}},
    ("checkpoint", "save"): dict.fromkeys(SCHEDULES, {FWD: 4}),
}
if REMAT3:
    RUNS["checkpoint", "recompute"] = {"none": {FWD: 4}, "full": {PRIMAL: 4, FWD: 4},
                                       "every_k(2)": {PRIMAL: 4, FWD: 4}, "sqrt": {PRIMAL: 2, FWD: 4}}
    RUNS["checkpoint", "save"] = {"none": {FWD: 4}, "full": REFUSED, "every_k(2)": REFUSED, "sqrt": REFUSED}


def or_refusal(measure, *case):
    """``measure(*case)``, or the refusal's text (:data:`REFUSED`) where ``remat_scan`` raises it."""
    try:
        return measure(*case)
    except ValueError as e:
        assert REFUSED in str(e), e
        return REFUSED


@pytest.mark.parametrize("method,choice", list(RUNS))
def test_custom_vjp_rule_runs_per_schedule_and_choice(method, choice):
    """Recompute: ``fwd`` in a checkpointed layer's forward pass and again in its recompute (8 for 4
    layers under full), in the reverse loop (whose forward pass is the program of ``jax.vjp`` of the
    layer, the same as ``none``'s) as in ``jax.checkpoint``. Save: ``fwd`` once per layer. Under
    ``jax_remat3``, ``jax.checkpoint`` runs the primal in the forward pass and refuses save."""
    assert {s: or_refusal(runs, s, method, choice) for s in SCHEDULES} == RUNS[method, choice]


def test_custom_vjp_rule_runs_with_a_policy():
    """Under a policy too: ``fwd`` twice per layer unless saved."""
    assert runs("full", policy="save_dots") == {FWD: 8}
    assert runs("full", choice="save", policy="save_dots") == {FWD: 4}


def test_runs_counted_in_the_program_match_callbacks_at_run_time():
    """The counts are executions: a ``jax.debug.callback`` per rule body, run under ``jit``."""
    calls = {PRIMAL: 0, FWD: 0}

    @jax.custom_vjp
    def dense_gelu(x, w):
        jax.debug.callback(lambda v: calls.__setitem__(PRIMAL, calls[PRIMAL] + 1), x)
        return jax.nn.gelu(x @ w)

    def fwd(x, w):
        jax.debug.callback(lambda v: calls.__setitem__(FWD, calls[FWD] + 1), x)
        return jax.nn.gelu(x @ w), (x, w, x @ w)

    dense_gelu.defvjp(fwd, OPS[False, False].bwd)
    for method, expected in [("reverse_loop", {PRIMAL: 0, FWD: 8}),
                             ("checkpoint", {PRIMAL: 4, FWD: 4} if REMAT3 else {PRIMAL: 0, FWD: 8})]:
        calls.update({PRIMAL: 0, FWD: 0})
        f = lambda w, x: jnp.sum(remat_scan(lambda w, h, _: h + dense_gelu(h, w), w, x, "full", method=method) ** 2)
        jax.block_until_ready(jax.jit(jax.grad(f))(W, X))
        jax.effects_barrier()
        assert calls == expected, method


# saved activation bytes (jaxpr level), in units of one (B, D) float32 activation; none keeps 9
BYTES = {
    "reverse_loop": {"recompute": {"full": 5, "every_k(2)": 3, "sqrt": 5},
                     "save": {"none": 9, "full": 9, "every_k(2)": 9, "sqrt": 9}},
    "checkpoint": {"recompute": {"full": 5, "every_k(2)": 3, "sqrt": 6},
                   "save": {"none": 9, "full": 9, "every_k(2)": 11, "sqrt": 10}},
}
if REMAT3:
    BYTES["checkpoint"]["save"] = {"none": 9, "full": REFUSED, "every_k(2)": REFUSED, "sqrt": REFUSED}


@pytest.mark.parametrize("method", list(BYTES))
def test_saved_bytes_per_choice_beside_none(method):
    """Save keeps the rule's ``x @ w`` per checkpointed layer, beside each segment's boundary; in the
    reverse loop every checkpointed layer is then a segment of its own whose input is its boundary
    (the rule's ``x``), so every schedule keeps what ``none`` keeps: 4 inputs, 4 ``x @ w`` and the
    loss's ``2 * out``, and the rule's ``fwd`` runs once per layer."""
    none = saved_activation_bytes(loss("none", method), W, X)
    assert none == 9 * UNIT
    for choice, per_schedule in BYTES[method].items():
        got = {s: or_refusal(lambda *case: saved_activation_bytes(loss(*case), W, X) // UNIT, s, method, choice)
               for s in per_schedule}
        assert got == per_schedule, choice


@functools.cache
def eager_none(method):
    return eager_grads("none", method, "recompute")


@pytest.mark.parametrize("method,schedule", [
    pytest.param(m, s, marks=() if (m, s) == ("reverse_loop", "every_k(2)") else SLOW, id=f"{m}-{s}")
    for m in ("reverse_loop", "checkpoint") for s in SCHEDULES[1:]])
def test_every_choice_bitwise_with_none_op_by_op(method, schedule):
    for choice in ("recompute",) if REMAT3 and method == "checkpoint" else ("recompute", "save"):  # save refused
        assert ulp_per_layer(eager_grads(schedule, method, choice), eager_none(method)) == [0] * N, choice


def test_recompute_and_save_bitwise_with_none_under_jit():
    """The reverse loop: both choices, every schedule, bitwise with ``none`` under ``jit``."""
    ref = jit_grads("none")
    for schedule in SCHEDULES:
        assert ulp_per_layer(jit_grads(schedule), ref) == [0] * N, schedule
        assert ulp_per_layer(jit_grads(schedule, "reverse_loop", "save"), ref) == [0] * N, schedule


@pytest.mark.parametrize("method", [pytest.param("checkpoint", marks=SLOW)])
def test_recompute_bitwise_with_none_under_jit_and_save_at_full(method):
    ref = jit_grads("none", method)
    for schedule in SCHEDULES:
        assert ulp_per_layer(jit_grads(schedule, method), ref) == [0] * N, schedule
    if not REMAT3:  # save refused through jax.checkpoint under the flag
        assert ulp_per_layer(jit_grads("full", method, "save"), ref) == [0] * N


@CPU_ONLY
@pytest.mark.skipif(REMAT3, reason="custom_vjp_residuals='save' through jax.checkpoint is refused under jax_remat3")
@pytest.mark.parametrize("method,schedule,recomputed_inputs", [
    pytest.param("checkpoint", "every_k(2)", {1, 3}, marks=SLOW), pytest.param("checkpoint", "sqrt", {1}, marks=SLOW)])
def test_save_under_jit_rounds_apart_where_a_saved_output_meets_a_fused_add(method, schedule, recomputed_inputs):
    """``method="checkpoint"``: under ``jit`` XLA:CPU computes ``h + gelu(x @ w)`` as one fused
    multiply-add (the gelu's last product and the residual add, rounded once); a saved gelu output is
    rounded on its own, so a layer input recomputed from it (the 2nd layer of a segment) is a few ULP
    off the forward's, and so is that layer's weight gradient. The same block with ``h * gelu(...)``
    is bitwise. (The reverse loop keeps each checkpointed layer's input under ``"save"`` instead.)"""
    save, none = jit_grads(schedule, method, "save"), jit_grads("none", method)
    ulp = ulp_per_layer(save, none)
    differing = {i for i, u in enumerate(ulp) if u}
    assert differing and differing <= recomputed_inputs and max(ulp) <= 16, ulp
    assert all(np.abs(save[i] - none[i]).max() < 1e-7 * np.abs(none[i]).max() for i in range(N))
    mul_ulp = ulp_per_layer(jit_grads(schedule, method, "save", combine="mul"),
                            jit_grads("none", method, combine="mul"))
    assert mul_ulp == [0] * N, mul_ulp


@CPU_ONLY
def test_forward_residual_add_is_one_fused_multiply_add_on_xla_cpu():
    """The cause above, shown directly: the scanned forward's next carry equals ``fma(h, j, c)``
    (``gelu(h) = h * j``) and not ``c + round(h * j)`` in some entries."""
    def body(c, w):
        h = c @ w
        j = 0.5 * (1 + jnp.tanh(0.7978845834732056 * (h + 0.044714998453855515 * h ** 3)))
        return c + jax.nn.gelu(h), (c, h, j, jax.nn.gelu(h))

    last, (c, h, j, out) = jax.tree.map(np.asarray, jax.jit(lambda w, x: jax.lax.scan(body, x, w))(W, X))
    nxt = np.concatenate([c[1:], last[None]])
    fma = (h.astype(np.float64) * j + c).astype(np.float32)
    assert np.array_equal(out, (h * j).astype(np.float32))
    assert np.array_equal(nxt, fma)
    assert not np.array_equal(nxt, c + out)


def test_optimize_remat_runs_the_primal_in_the_checkpoints_forward_pass():
    """``optimize_remat=True``: ``jax.checkpoint`` runs the primal in the forward pass, then ``fwd`` in
    the recompute (bytes unchanged); the reverse loop, whose forward pass is the program of
    ``jax.vjp`` of the layer (``none``'s), runs ``fwd`` in both, policy or not."""
    opt = (True, False)
    assert runs("full", "checkpoint", op=opt) == {PRIMAL: 4, FWD: 4}
    assert runs("every_k(2)", "checkpoint", op=opt) == {PRIMAL: 4, FWD: 4}
    assert runs("full", op=opt) == runs("full") == {FWD: 8}
    assert runs("full", policy="save_dots", op=opt) == {FWD: 8}
    assert saved_activation_bytes(loss("full", "checkpoint", op=opt), W, X) == 5 * UNIT
    assert saved_activation_bytes(loss("full", policy="save_dots", op=opt), W, X) == 5 * UNIT
    if REMAT3:
        with pytest.raises(ValueError, match=REFUSED):
            runs("full", "checkpoint", "save", op=opt)
    else:
        assert runs("full", "checkpoint", "save", op=opt) == {FWD: 4}
    assert ulp_per_layer(jit_grads("full", "checkpoint", op=opt), jit_grads("none", "checkpoint")) == [0] * N


def test_optimize_remat_with_an_effect_in_fwd_is_not_recomputed_and_saves_more_than_none():
    """With a ``jax.debug.callback`` in ``fwd`` (how one would count calls), JAX keeps the rule's
    ``fwd`` in the forward pass: it never runs again, and ``every_k(2)`` keeps more than ``none``.
    Under ``jax_remat3`` the op is recomputed as any other (primal, then ``fwd``; 3 units kept)."""
    eff = (True, True)
    assert runs("full", "checkpoint", op=eff) == ({PRIMAL: 4, FWD: 4} if REMAT3 else {FWD: 4})
    assert saved_activation_bytes(loss("every_k(2)", "checkpoint", op=eff), W, X) == (3 if REMAT3 else 11) * UNIT
    assert saved_activation_bytes(loss("none", "checkpoint", op=eff), W, X) == 9 * UNIT


def test_save_through_jax_checkpoint_under_jax_remat3_is_one_clear_error(remat3_flag):
    """The flag toggled here, so the default run checks it too: ``method="checkpoint"`` and a stack of one
    layer are refused with the ways out; ``none`` (nothing checkpointed) and, on JAX >= 0.11, the reverse
    loop are not."""
    remat3_flag(True)
    with pytest.raises(ValueError, match=REFUSED + r": JAX runs each custom_vjp's primal .* pass method='reverse_"
                                                 r"loop', turn the flag off" if jax.__version_info__ >= (0, 11)
                       else REFUSED):
        jax.make_jaxpr(jax.grad(loss("full", "checkpoint", "save")))(W, X)
    with pytest.raises(ValueError, match=REFUSED + r" \(a stack of one layer runs jax.checkpoint under either"):
        jax.make_jaxpr(jax.grad(loss("full", "reverse_loop", "save")))(W[:1], X)
    jax.make_jaxpr(jax.grad(loss("none", "checkpoint", "save")))(W, X)
    if jax.__version_info__ >= (0, 11):
        jax.make_jaxpr(jax.grad(loss("full", "reverse_loop", "save")))(W, X)


@pytest.mark.parametrize("bad", ["keep", "Save", None, True])
def test_custom_vjp_residuals_bad_value_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="custom_vjp_residuals must be 'recompute' .* or 'save'"):
        remat_scan(lambda w, h, _: h, W, X, "full", custom_vjp_residuals=bad)
    with pytest.raises(ValueError, match="custom_vjp_residuals must be"):
        RematStack(nnx.Linear(D, D, rngs=nnx.Rngs(0)), "full", custom_vjp_residuals=bad)


def test_save_on_a_block_without_custom_vjp_warns():
    with pytest.warns(RematPolicyWarning, match="holds no jax.custom_vjp op"):
        jax.grad(lambda w: remat_scan(lambda w, h, _: jnp.tanh(h @ w), w, X, "full",
                                      custom_vjp_residuals="save").sum())(W)


def test_save_tags_rules_inside_jit_and_scan_of_the_block():
    """A rule under ``jax.jit`` or a ``lax.scan`` inside the layer is found and saved as well."""
    op = OPS[False, False]
    inner = jax.jit(op)

    def block(w, h, _):
        h = h + inner(h, w)
        return jax.lax.scan(lambda c, _: (c + op(c, w), None), h, None, length=1)[0]

    f = lambda w, x: jnp.sum(remat_scan(block, w, x, "full", custom_vjp_residuals="save") ** 2)
    got = count_named_runs(jax.grad(f), W, X)
    assert got[FWD] == 2 * N and PRIMAL not in got
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = jax.jit(jax.grad(f))(W, X)
    assert np.isfinite(np.asarray(g)).all()


class _DenseGelu(nnx.Module):
    def __init__(self, rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (D, D)) * 0.3)

    def __call__(self, h):
        return h + OPS[False, False](h, self.w[...])


def test_nnx_remat_stack_and_linen_pass_the_choice_on():
    @nnx.split_rngs(splits=N)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def build(rngs):
        return _DenseGelu(rngs)

    stack = build(nnx.Rngs(0))

    def nnx_loss(choice, schedule="full"):
        return lambda x: jnp.sum(remat_stack(stack, x, schedule, custom_vjp_residuals=choice) ** 2)

    with pytest.warns(RematPolicyWarning, match="fwd.*runs in the forward pass and again in every recompute of its layer: 8 runs for 4 layers"):
        assert count_named_runs(jax.grad(nnx_loss("recompute")), X) == {FWD: 8}
    got = count_named_runs(jax.grad(nnx_loss("save")), X)
    assert got.get(FWD) == 4 and PRIMAL not in got
    module = RematStack(stack, "full", custom_vjp_residuals="save")
    g_save = jax.jit(jax.grad(lambda x: jnp.sum(module(x) ** 2)))(X)
    g_none = jax.jit(jax.grad(nnx_loss("recompute", "none")))(X)
    assert np.array_equal(np.asarray(g_save).view(np.int32), np.asarray(g_none).view(np.int32))

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h):
            w = self.param("w", lambda k: jax.random.normal(k, (D, D)) * 0.3)
            return h + OPS[False, False](h, w)

    variables = linen_init_stack(Block(), jax.random.key(0), X, N)
    lin = lambda choice: lambda v: jnp.sum(linen_remat_stack(Block(), v, X, "full", custom_vjp_residuals=choice) ** 2)
    assert count_named_runs(jax.grad(lin("save")), variables).get(FWD) == 4
    with pytest.warns(RematPolicyWarning, match="fwd.*runs in the forward pass and again in every recompute of its layer: 8 runs for 4 layers"):
        assert count_named_runs(jax.grad(lin("recompute")), variables) == {FWD: 8}


@pytest.mark.parametrize("schedule, policy", [
    ("sqrt", None), ("nested(sqrt,sqrt)", None), ("nested(every_k(2),full)", None), ("full", "save_dots"),
    ("nested(full,full)", "save_everything"), ("plan(1+save_everything,3)", None), ("nested(every_k(2),none)", None),
    ("full", "save_everything")])
def test_lint_counts_the_fwd_runs_it_warns_of(schedule, policy):
    """The warning's run counts are the program's (:func:`count_named_runs`): nested schedules recompute their inner
    checkpointed segments twice; a policy that keeps everything recomputes nothing (a nested segment's outer
    recompute still runs); ``"save"`` is offered only where it runs ``fwd`` fewer times."""
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        messages = [m for m in check_plan(lambda w, h, _: h + OPS[False, False](h, w), W, X, parse_schedule(schedule),
                                          policy=policy) if "jax.custom_vjp op" in m]
    fwd_runs, save_runs = runs(schedule, policy=policy)[FWD], runs(schedule, choice="save", policy=policy)[FWD]
    if fwd_runs == N:
        assert not messages
        return
    (message,) = messages
    assert f": {fwd_runs} runs for {N} layers, against {N} without remat" in message, message
    if save_runs < fwd_runs:
        assert f"pass custom_vjp_residuals='save' to keep fwd's outputs from the forward pass: {save_runs} runs" \
            in message, message
    else:
        assert "custom_vjp_residuals='save'" not in message, message


@pytest.mark.skipif(jax.__version_info__ >= (0, 11), reason="JAX 0.10's jax_remat3 only: 'save' runs in the reverse loop on 0.11+")
def test_reverse_loop_under_old_jax_remat3_does_not_offer_save(remat3_flag):
    """Under JAX 0.10's flag the reverse loop refuses ``"save"`` (a policy there); the lint says so, not "pass
    save" (toggled here)."""
    remat3_flag(True)
    with pytest.warns(RematPolicyWarning):
        (message,) = check_plan(lambda w, h, _: h + OPS[False, False](h, w), W, X, parse_schedule("full"))
    assert "8 runs for 4 layers" in message and "pass custom_vjp_residuals='save'" not in message
    assert "custom_vjp_residuals='save', which keeps fwd's outputs from the forward pass, is refused under jax_remat3" \
        in message, message
    with pytest.raises(ValueError, match="custom_vjp_residuals='recompute'"):
        jax.grad(loss("full", choice="save"))(W, X)


def test_one_layer_stack_under_jax_remat3_warns_of_the_primal_run_and_refuses_save(remat3_flag):
    """A stack of one layer runs ``jax.checkpoint``; with the flag on (toggled here) the lint names what JAX
    runs there (the primal, then ``fwd`` in the recompute) and ``"save"`` is one clear error."""
    @nnx.split_rngs(splits=1)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def build(rngs):
        return _DenseGelu(rngs)

    stack = build(nnx.Rngs(0))
    remat3_flag(True)
    with pytest.warns(RematPolicyWarning, match="with jax_remat3 on, each runs its primal in the forward pass "
                                                "and its forward rule .fwd. in the recompute"):
        got = count_named_runs(jax.grad(lambda x: jnp.sum(remat_stack(stack, x, "full") ** 2)), X)
    assert got == {PRIMAL: 1, FWD: 1}
    with pytest.raises(ValueError, match=REFUSED):
        jax.grad(lambda x: jnp.sum(remat_stack(stack, x, "full", custom_vjp_residuals="save") ** 2))(X)
