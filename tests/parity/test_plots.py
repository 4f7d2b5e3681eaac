"""parity.report.plots: the frontier's Pareto set and the three PNGs from a small sweep report."""

import pytest

from jaxremat.models import TransformerConfig
from parity.report.plots import pareto, write_plots
from parity.cases.sweep import SweepConfig, run_sweep


def test_pareto_keeps_only_undominated_points():
    pts = [(0.0, 1.0), (0.5, 1.2), (0.4, 1.5), (0.9, 2.0), (0.8, 2.5)]
    assert pareto(pts) == [(0.0, 1.0), (0.5, 1.2), (0.9, 2.0)]


@pytest.mark.parametrize("frontier", [None, 2])
def test_write_plots_writes_pngs(tmp_path, frontier):
    cfg = TransformerConfig(vocab_size=32, n_layer=1, d_model=8, n_head=2, d_ff=16, max_seq_len=4)
    report = run_sweep(SweepConfig(depths=(1, 2), plans=("none", "full"), frameworks=("torch",), config=cfg,
                                   batch_size=1, seq_len=4, frontier_depth=frontier, frontier_plans=("none", "sqrt"),
                                   timing_repeats=1))
    files = write_plots(report, tmp_path)
    assert ("frontier" in files) == (frontier is not None)
    for name in files.values():
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
