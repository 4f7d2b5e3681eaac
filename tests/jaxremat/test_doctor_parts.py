"""The remat doctor's parts: policies read (names, descriptions), bytes formatted, recompute runs counted."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import jaxremat
from jaxremat.doctor.diagnosis import Diagnosis, Problem, format_bytes
from jaxremat.doctor.policy_probe import describe_policy, policy_names, region_answers
from jaxremat.doctor.regions import region_calls
from jaxremat.doctor.measure import trace_program
from jaxremat.policies import to_jax_policy

cp = jax.checkpoint_policies


@pytest.mark.parametrize("policy, description, saved, offloaded", [
    (None, "nothing_saveable", (), ()),
    (cp.dots_with_no_batch_dims_saveable, "dots_with_no_batch_dims_saveable", (), ()),
    (cp.save_only_these_names("b", "a"), "save_only_these_names('a', 'b')", ("a", "b"), ()),
    (cp.save_any_names_but_these("x"), "save_any_names_but_these('x')", (), ()),  # 'x' is the one it refuses
    (cp.save_and_offload_only_these_names(names_which_can_be_saved=["s"], names_which_can_be_offloaded=["o"],
                                          offload_src="device", offload_dst="pinned_host"),
     "save_and_offload_only_these_names(save=('s',), offload=('o',) to 'pinned_host')", ("s",), ("o",)),
    (cp.save_from_both_policies(cp.dots_saveable, cp.save_only_these_names("q")),
     "save_from_both_policies(dots_saveable, save_only_these_names('q'))", ("q",), ()),
    (to_jax_policy("offload_names(qkv_proj,mlp_hidden)"), None, (), ("mlp_hidden", "qkv_proj")),
])
def test_policy_probe_describes_and_reads_the_names_a_policy_keeps(policy, description, saved, offloaded):
    if description is not None:
        assert describe_policy(policy) == description
    got_saved, got_offloaded = policy_names(policy)
    assert (tuple(sorted(got_saved)), tuple(sorted(got_offloaded))) == (saved, offloaded)


def test_region_answers_count_batched_products_and_offload_destinations():
    jaxpr = jax.make_jaxpr(lambda a, b: jnp.einsum("bij,bjk->bik", a, b) @ jnp.ones((3, 3)))(
        jnp.ones((2, 3, 3)), jnp.ones((2, 3, 3))).jaxpr
    answers = region_answers(cp.dots_with_no_batch_dims_saveable, jaxpr)
    assert (answers.dots, answers.batched_dots, answers.kept_ops) == (2, 1, 1)
    offload = region_answers(cp.offload_dot_with_no_batch_dims("device", "unpinned_host"), jaxpr)
    assert offload.offload_dsts == {"unpinned_host"} and offload.kept_ops == 1


@pytest.mark.skipif(jax.config.jax_remat3, reason="the doctor's regions are JAX's default jax.checkpoint; "
                    "under jax_remat3 it records none (and jaxremat.doctor refuses the flag)")
def test_region_calls_count_recomputes_through_scans_and_loops():
    def loss(w, x):
        body = jax.checkpoint(lambda h, wi: (jnp.tanh(h @ wi), None))
        h, _ = lax.scan(lambda c, ws: lax.scan(body, c, ws), x, w)  # 2 x 3 layers
        return jnp.sum(jax.checkpoint(jnp.sin)(h))

    traced, regions = trace_program(jax.grad(loss), (jnp.ones((2, 3, 4, 4)), jnp.ones((5, 4))))
    assert [r.position for r in regions] == [("scan(2)", "scan(3)"), ()]
    assert region_calls(traced.jaxpr) == {0: 6, 1: 1}


def test_doctor_under_jax_remat3_is_one_clear_error(remat3_flag):
    remat3_flag(True)
    with pytest.raises(ValueError, match=r"jax_remat3 is on: diagnose with it off \(jax.config.update"):
        jaxremat.doctor(lambda x: jnp.sum(jax.checkpoint(jnp.sin)(x)), jnp.ones(3), compile=False)


def test_format_bytes_and_problem_lines():
    assert [format_bytes(n) for n in (None, 0, 1023, 1536, 5 * 2**20, 3 * 2**30)] == [
        "-", "0 B", "1023 B", "1.5 KiB", "5.0 MiB", "3.0 GiB"]
    p = Problem("policy-dropped", "region #1 (x)", "it keeps nothing", "use y", 1)
    d = Diagnosis("step", (), (p,), None, ("a note",))
    assert str(p) == "policy-dropped: region #1 (x): it keeps nothing; fix: use y"
    assert str(d).splitlines() == ["remat doctor: step: 0 remat region(s), 1 problem", "note: a note", str(p)]
    assert d.kinds() == ["policy-dropped"] and not d.ok


def test_program_kind_tells_a_loss_from_a_step_that_differentiates_inside():
    from jaxremat.doctor import program_kind

    x = jnp.ones(3)
    assert program_kind(lambda w: jnp.sin(w).sum(), x) == ("loss", False)
    assert program_kind(lambda w: (jnp.sin(w).sum(), {"aux": w}), x) == ("loss", True)
    assert program_kind(lambda w: jax.grad(lambda v: jnp.sin(v).sum())(w).sum(), x) == ("step", False)  # no remat
    assert program_kind(lambda w: w * 2, x) == ("step", False)
