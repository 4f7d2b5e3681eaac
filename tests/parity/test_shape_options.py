"""``--batch-size`` and ``--seq-len`` on ``run`` and ``plan``: a preset at another batch shape, refused in one
line where it cannot run."""

import json

import pytest

from parity.cli.run import main
from parity.inputs.model_preset import with_shape
from parity.inputs.presets import get_preset


def test_with_shape_grows_a_random_presets_positions_and_keeps_the_rest():
    base = get_preset("gpt-tiny")
    p = with_shape(base, batch_size=3, seq_len=4 * base.config.max_seq_len)
    assert (p.batch_size, p.seq_len) == (3, 4 * base.config.max_seq_len)
    assert p.config.max_seq_len == p.seq_len and p.config.replace(max_seq_len=base.config.max_seq_len) == base.config
    assert with_shape(base) is base and with_shape(base, seq_len=2).config == base.config


@pytest.mark.parametrize("kwargs, message", [({"batch_size": 0}, "--batch-size must be >= 1"),
                                             ({"seq_len": -1}, "--seq-len must be >= 1")])
def test_with_shape_refuses_sizes_below_one(kwargs, message):
    with pytest.raises(ValueError, match=message):
        with_shape(get_preset("gpt-tiny"), **kwargs)


def test_run_takes_the_shape_and_reports_it(tmp_path):
    out = tmp_path / "r"
    assert main(["run", "--model", "gpt-small", "--seq-len", "96", "--batch-size", "3", "--schedules", "full",
                 "--frameworks", "torch", "--repeats", "1", "--no-progress", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert (report["batch_size"], report["seq_len"]) == (3, 96)


@pytest.mark.parametrize("argv, message", [
    (["run", "--model", "gpt-small", "--seq-len", "100000", "--batch-size", "512"], "needs at least an estimated"),
    (["run", "--suite", "distributed", "--seq-len", "32"], "leave out --batch-size and --seq-len"),
    (["plan", "--model", "gpt-small", "--batch-size", "0"], "--batch-size must be >= 1"),
])
def test_shapes_that_cannot_run_are_one_line_and_exit_2(argv, message, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
