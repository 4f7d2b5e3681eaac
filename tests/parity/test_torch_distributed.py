"""Two gloo ranks on gpt-tiny: FSDP2 and DDP under a remat plan, bitwise against ``none`` and the one-process reference."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch.distributed")

from safetensors.numpy import load_file  # noqa: E402

from parity.distributed.torch_worker import REFERENCES_FILE, check_request, run_torch_distributed  # noqa: E402
from parity.inputs.presets import get_preset  # noqa: E402
from parity.inputs.pretrained import preset_inputs  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch_dist")
    return out, run_torch_distributed("gpt-tiny", 2, ("sqrt",), str(out))


def test_rows_cover_both_meshes_none_first(run):
    _, rows = run
    assert [(r.mesh, r.layout, r.plan) for r in rows] == [
        ("ddp=2", "data_parallel", "none"), ("ddp=2", "data_parallel", "sqrt"),
        ("fsdp2=2", "fully_sharded", "none"), ("fsdp2=2", "fully_sharded", "sqrt")]
    assert all(r.devices == 2 and r.processes == 2 and r.framework == "torch" for r in rows)


def test_sqrt_bitwise_against_none_on_each_mesh(run):
    _, rows = run
    for r in rows:
        assert (r.status, r.grads_bitwise, r.weights_bitwise, r.max_ulp, r.exception) == ("pass", True, True, 0, None), r
    assert len({r.loss for r in rows}) == 1


def test_gradients_equal_mean_of_per_shard_single_device_gradients(run):
    out, rows = run
    assert all(r.reference_ok and r.reference_err == 0.0 for r in rows)
    # Recompute the reference here, independently of the worker: per-shard gradients in one process.
    import torch

    from torchref.model import GPT
    from torchref.render import model_loss

    cfg, params, tokens = preset_inputs(get_preset("gpt-tiny"), "float32", 0)
    tokens = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    torch.set_num_threads(1)  # the ranks' thread count
    shard_grads = []
    for shard in (tokens[:1], tokens[1:]):
        model = GPT.from_params(cfg, params)
        model_loss(model, shard, "none").backward()
        shard_grads.append(model.to_params(grads=True))
    for r in rows:
        if r.plan == "none":
            saved = load_file(r.grads_file)
            for k, v in saved.items():
                mean = (shard_grads[0][k] + shard_grads[1][k]) / np.float32(2)
                assert np.array_equal(v.view(np.uint32), mean.view(np.uint32)), (r.mesh, k)


def test_full_batch_gradient_differs_by_summation_order_only(run):
    import json

    out, _ = run
    full = json.loads((out / REFERENCES_FILE).read_text())["full_batch_vs_reference"]
    assert not full["bitwise"] and 0 < full["max_abs"] < 1e-6


def test_per_rank_memory_falls_with_sharding_and_remat(run):
    _, rows = run
    mem = {(r.mesh, r.plan): r.memory for r in rows}
    for plan in ("none", "sqrt"):
        assert mem[("fsdp2=2", plan)].params_bytes * 2 == mem[("ddp=2", plan)].params_bytes
        assert mem[("fsdp2=2", plan)].peak_bytes < mem[("ddp=2", plan)].peak_bytes
    for mesh in ("ddp=2", "fsdp2=2"):
        assert mem[(mesh, "sqrt")].activation_bytes < mem[(mesh, "none")].activation_bytes
        assert mem[(mesh, "none")].params_bytes == mem[(mesh, "none")].predicted["params_bytes"]


def test_per_rank_activations_beside_their_prediction(run):
    # DDP: single-device activations with the gradients resident, / W; FSDP2: lazy gradients, / W, plus the
    # root's parameters and three gathered blocks. Measured 0.91 .. 1.31 here (gpt-tiny); without the
    # gathered term FSDP2 was 1.69 / 4.9, and DDP on the lazy-gradient basis 2.2 under sqrt.
    _, rows = run
    for r in rows:
        ratio = r.memory.activation_bytes / r.memory.predicted["activation_bytes"]
        assert 0.8 <= ratio <= 1.5, (r.mesh, r.plan, ratio)  # margin: FSDP2 buffers live by the ranks timing


@pytest.mark.parametrize("args, message", [
    (("gpt-tiny", 3, ("full",)), "does not divide"),
    (("gpt-tiny", 1, ("full",)), "world_size must be"),
    (("gpt-tiny", 2, ("segments(9)",)), "segments"),
])
def test_bad_request_says_what_is_wrong(args, message):
    with pytest.raises(ValueError, match=message):
        check_request(*args)
