"""The remat doctor on its corpus of user-like steps (tests/jaxremat/doctor_corpus/): each step flagged
with its one problem kind, the correct steps in the same forms with none; and what each region records.

Every step is diagnosed once per session (``diagnose``). XLA's compile is most of the doctor's time
(about 1 s per program here, two programs per step), so by default only the steps in ``COMPILED``
are compiled: every ``remat-not-surviving`` step and a correct one; the others are
traced (every check but the compiled ones). With ``JAXREMAT_SLOW_TESTS=1`` every step is also
diagnosed compiled (``test_doctor_compiled_*``).
"""

import functools
import importlib.util
import pathlib

import jax
import pytest

import jaxremat
from jaxremat.doctor import PROBLEM_KINDS
from jaxremat.doctor.__main__ import load_target
from jaxremat import RematPolicyWarning

# jaxremat.doctor refuses jax_remat3 (test_doctor_parts.py checks its one-line error)
pytestmark = pytest.mark.skipif(jax.config.jax_remat3, reason="jaxremat.doctor refuses jax_remat3: its jax.checkpoint "
                                "is another primitive, whose regions the doctor cannot see")

CORPUS = pathlib.Path(__file__).resolve().parent / "doctor_corpus"
COMPILED = {("jax_scan", "correct"), ("jax_scan", "python_loop"), ("jax_scan", "whole_stack"),
            ("renderers", "one_segment_loop")}


def expected(path: pathlib.Path) -> dict:
    spec = importlib.util.spec_from_file_location(f"_corpus_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EXPECTED


PYTHON_LOOP_MERGED = expected(CORPUS / "jax_scan.py")["python_loop"] == "remat-not-surviving"  # jaxlib < 0.12
CASES = [(path.stem, name, kind) for path in sorted(CORPUS.glob("*.py")) for name, kind in expected(path).items()]


@functools.lru_cache(maxsize=None)
def diagnose(form: str, name: str, compile: bool | None = None):
    fn, args = load_target(f"{CORPUS / form}.py:{name}")
    return jaxremat.doctor(fn, *args, compile=(form, name) in COMPILED if compile is None else compile)


def test_corpus_has_every_kind_and_a_correct_step_in_every_form():
    kinds = {kind for _, _, kind in CASES}
    assert kinds == {None, *PROBLEM_KINDS}
    for form in {f for f, _, _ in CASES}:
        assert any(f == form and kind is None for f, _, kind in CASES), form


def test_compiled_steps_cover_every_compiled_kind():
    kinds = {kind for form, name, kind in CASES if (form, name) in COMPILED}
    assert kinds == {None, "remat-not-surviving"}
    assert all((f, n) in COMPILED for f, n, kind in CASES if kind == "remat-not-surviving")
    assert ("jax_scan", "python_loop") in COMPILED  # flagged under jaxlib 0.10, checked clean under 0.12


@pytest.mark.parametrize("form, name, kind", CASES, ids=[f"{f}:{n}" for f, n, _ in CASES])
def test_doctor_flags_each_corpus_step_with_its_kind_only(form, name, kind):
    if name == "stack_name_missing":  # remat_stack itself warns as it traces the step; the doctor names the fault too
        with pytest.warns(RematPolicyWarning, match="marks no value with that name"):
            d = diagnose(form, name)
    else:
        d = diagnose(form, name)
    assert d.kinds() == ([kind] if kind else []), str(d)
    assert (d.compiled is not None) == ((form, name) in COMPILED)
    assert d.ok is (kind is None)
    for problem in d.problems:
        assert problem.message and problem.fix and "\n" not in str(problem)


def test_doctor_name_missing_names_the_tag_the_region_and_its_line():
    d = diagnose("jax_scan", "name_missing")
    (region,) = d.regions
    assert (region.position, region.calls, region.tags) == (("scan(4)",), 4, ("mlp_in", "mlp_out"))
    assert region.policy == "save_only_these_names('mlpwi')" and region.saved_names == ("mlpwi",)
    assert region.kept_bytes_per_call == 0 and region.everything_bytes_per_call > 0
    assert region.site.endswith("doctor_corpus/jax_scan.py:39")  # the lax.scan call in scan_loss
    (problem,) = d.problems
    assert problem.region == 1 and "'mlpwi'" in problem.message and "'mlp_in', 'mlp_out'" in problem.message


def test_doctor_correct_scan_keeps_its_tag_and_realizes_the_saving():
    d = diagnose("jax_scan", "correct")
    (region,) = d.regions
    b, dm = 16, 64
    assert region.kept_bytes_per_call == b * dm * 4  # one (B, D) float32 "mlp_in" per layer
    assert region.calls == 4 and region.kept_bytes == 4 * b * dm * 4
    assert region.promised_saving_bytes == 4 * (region.everything_bytes_per_call - region.kept_bytes_per_call)
    assert region.compiled_saving_bytes >= 0.4 * region.promised_saving_bytes > 0
    assert d.compiled["backend"] == jax.default_backend() and d.compiled["temp_bytes"] > 0
    text = str(d)
    assert "save_only_these_names('mlp_in')" in text and "scan(4)" in text and "0 problems" in text


def test_doctor_python_loop_is_one_region_of_four_calls_merged_by_xla_0_10_kept_by_0_12():
    d = diagnose("jax_scan", "python_loop")
    (region,) = d.regions
    assert region.calls == 4 and region.position == ()
    if PYTHON_LOOP_MERGED:  # jaxlib 0.10.2: the recompute merged into the forward pass, flagged
        assert region.compiled_saving_bytes < 0.4 * region.promised_saving_bytes
        assert d.compiled["dots_after"] < d.compiled["dots_before"]
        assert "merged the recompute" in d.problems[0].message
    else:  # jaxlib 0.12.0.1: every recompute kept and the saving realized, so nothing to report
        assert region.compiled_saving_bytes >= 0.4 * region.promised_saving_bytes > 0
        assert d.compiled["dots_after"] == d.compiled["dots_before"] and d.problems == ()


def test_doctor_sees_the_batched_region_under_vmap_and_offloads_in_host_memory():
    dropped = diagnose("jax_scan", "dropped_under_vmap")
    assert dropped.regions[0].position == ("vmap", "scan(4)")
    assert "batch dimensions" in dropped.problems[0].message
    offload = diagnose("jax_scan", "correct_offload").regions[0]
    assert offload.offloaded_names == ("mlp_in",) and offload.offloaded_bytes_per_call == 16 * 64 * 4
    wrong = diagnose("jax_scan", "offload_to_unpinned_host")
    assert wrong.regions[0].offloaded_bytes_per_call == 0 and "'unpinned_host'" in wrong.problems[0].message


def test_doctor_train_steps_are_checked_as_they_are():
    d = diagnose("jax_scan", "correct_train_step")
    assert d.program == "step" and d.regions[0].calls == 4
    nnx_step = diagnose("nnx_scan", "train_step")
    assert nnx_step.program == "step"
    assert "hands its scanned inputs back out" in nnx_step.problems[0].message


def test_doctor_stacked_outputs_name_their_shapes():
    hidden = diagnose("jax_scan", "every_layer_output").problems[0]
    assert "[4, 16, 64]" in hidden.message and "does not read" in hidden.message
    cast = diagnose("nnx_scan", "bf16_without_remat")
    assert cast.regions == () and "cast" in cast.problems[0].message and "[4, 64, 128]" in cast.problems[0].message


def test_doctor_regions_of_flax_and_jaxremat_forms():
    linen = diagnose("linen_scan", "correct").regions[0]
    assert linen.position == ("scan(2)",) and linen.calls == 2  # nn.remat_scan((2, 2)): 2 checkpointed segments
    reverse_loop = diagnose("renderers", "correct").regions[0]
    assert reverse_loop.position[0] == "custom_vjp fwd" and reverse_loop.policy == "dots_saveable"
    one = diagnose("renderers", "one_segment_loop")
    assert one.regions[0].position == ("scan(1)",) and "one iteration" in one.problems[0].message


def test_doctor_of_shape_structs_matches_arrays_without_compiling():
    fn, args = load_target(f"{CORPUS}/jax_scan.py:name_missing")
    structs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    d = jaxremat.doctor(fn, *structs, compile=False)
    assert d.compiled is None and d.kinds() == ["policy-name-missing"]
    assert d.regions == diagnose("jax_scan", "name_missing").regions


@pytest.mark.jaxremat_slow
@pytest.mark.parametrize("form, name, kind", CASES, ids=[f"{f}:{n}" for f, n, _ in CASES])
def test_doctor_compiled_flags_each_corpus_step_with_its_kind_only(form, name, kind):
    d = diagnose(form, name, compile=True)
    assert d.kinds() == ([kind] if kind else []), str(d)
