"""parity.cases.gpu_pass: the peak-source selection (everywhere) and the device pass (GPU only)."""

import pytest
import torch

from parity.cases.gpu_pass import main, peak_source


def test_gpu_backend_selects_device_counters():
    assert "peak_bytes_in_use" in peak_source("jax", "gpu")
    assert "max_memory_allocated" in peak_source("torch", "cuda")
    assert "memory_analysis" in peak_source("jax", "cpu") and "cpu" in peak_source("torch", "cpu")
    with pytest.raises(ValueError):
        peak_source("tf", "gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_gpu_exits_2(tmp_path, capsys):
    assert main(["--out", str(tmp_path)]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device peak measurements need a CUDA GPU")
def test_gpu_pass_measures_device_peaks(tmp_path):
    assert main(["--out", str(tmp_path), "--schedules", "none,full"]) == 0
    assert (tmp_path / "gpu_pass.json").exists()
