"""Each training run records its steps (digests of gradients and weights, threads), so that trained weights
apart from the reference say at which step, and in which part of it, the two runs parted."""

import dataclasses

import numpy as np
import pytest

from parity.cases.record import fill_case
from parity.inputs.presets import get_preset
from parity.inputs.pretrained import preset_inputs
from parity.runners.result import TrainingStep, digest, training_divergence



def test_digest_is_of_the_raw_bytes_shape_and_dtype():
    a = np.arange(6, dtype=np.float32)
    assert digest([a]) == digest([a.copy()]) and len(digest([a])) == 16
    b = a.copy()
    b.view(np.uint32)[3] += 1  # one ULP
    assert digest([b]) != digest([a])
    assert digest([a.reshape(2, 3)]) != digest([a])  # the same bytes in another shape
    assert digest([a.view(np.int32)]) != digest([a])  # ... or another dtype
    assert digest([a[:3], a[3:]]) != digest([a[3:], a[:3]])  # order counts
    assert digest([np.zeros(0, np.float32)]) == digest([np.zeros((0,), np.float32)])
    assert digest([np.float32(1.0)]) != digest([np.ones(1, np.float32)])  # a 0-d array is not a 1-element one
    assert digest([a[::2]]) == digest([a[::2].copy()])  # a strided view: its values, not its memory


def test_divergence_names_the_first_step_and_part_that_differ():
    ref = tuple(TrainingStep(f"g{i}", f"w{i}", 2) for i in range(3))
    assert training_divergence(ref, ref) is None
    assert training_divergence(None, ref) is None and training_divergence(ref, ref[:2]) is None
    grads_at_2 = (ref[0], TrainingStep("x", "y", 1), TrainingStep("x", "z", 2))
    assert training_divergence(grads_at_2, ref) == {"step": 2, "first": "gradients", "threads": [2, 1]}
    update_at_1 = (TrainingStep("g0", "other", 2), *ref[1:])
    assert training_divergence(update_at_1, ref) == {"step": 1, "first": "weights", "threads": [2, 2]}


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_runs_record_their_steps_and_a_case_apart_says_where(framework, run_framework):
    cfg, params, tokens = preset_inputs(get_preset("gpt-tiny"), "float32", 0)
    res = run_framework(framework, cfg, params, tokens, "none", timing_repeats=1, with_memory=True)
    steps = res.training_steps
    assert len(steps) == 3 and len({s.weights for s in steps}) == 3  # one record per AdamW step
    if framework == "jax":  # the last step's weights are the trained ones (JAX: canonical order)
        assert steps[-1].weights == digest(res.trained[k] for k in sorted(res.trained))
    assert all((s.threads is None) is (framework == "jax") for s in steps)
    again = run_framework(framework, cfg, params, tokens, "full", timing_repeats=1, with_memory=True)
    assert again.training_steps == steps  # bitwise runs: the same record, step for step
    case = {}
    fill_case(case, again, res)
    assert case["weights_bitwise_equal"] is True and "training_divergence" not in case
    # a run whose weights ended apart: the case says at which step the records first differ
    moved = {k: v.copy() for k, v in again.trained.items()}
    first = next(iter(moved))
    moved[first].view(np.uint32)[0] += 1
    apart = dataclasses.replace(again, trained=moved, training_steps=(
        steps[0], dataclasses.replace(steps[1], grads="0" * 16), steps[2]))
    fill_case(case, apart, res)
    assert case["weights_bitwise_equal"] is False and case["weights_max_ulp"] == 1
    assert case["training_divergence"]["step"] == 2 and case["training_divergence"]["first"] == "gradients"
