"""``python -m parity run/sweep`` on bad checkpoints, odd option values and occupied output folders:
one plain-text line, exit 2, before any case runs, and nothing a user wrote is lost."""

import importlib.util
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="safetensors is a dev/minilm extra: pip install -e '.[dev]'")
pytest.importorskip("tokenizers", reason="tokenizers is a dev/minilm extra: pip install -e '.[dev]'")

import parity.inputs.pretrained  # noqa: E402
from jaxremat.models import TransformerConfig, init_params  # noqa: E402
from parity.cli import budget  # noqa: E402
from parity.inputs.checkpoints import save_hf_checkpoint  # noqa: E402
from parity.cli.run import main  # noqa: E402
from parity.report.files import OutDirLock  # noqa: E402

GPT2 = TransformerConfig(vocab_size=40, n_layer=2, d_model=8, n_head=2, d_ff=16, max_seq_len=16)


def _tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(GPT2.vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture
def ckpt(tmp_path):
    path = save_hf_checkpoint(tmp_path / "ckpt", GPT2, init_params(GPT2, seed=1))
    _tokenizer(path)
    return path


def _run(capsys, *argv):
    rc = main(list(argv))
    err = capsys.readouterr().err.strip()
    return rc, err


def _one_line(err):
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("error: "), err


def _rewrite(path, change):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize("damage, message", [
    (lambda f: f.write_bytes(b""), "not a valid safetensors file .*header too small.*empty, truncated or corrupt"),
    (lambda f: f.write_bytes(f.read_bytes()[:-100]), "not a valid safetensors file .*incomplete metadata"),
    (lambda f: f.write_bytes(pickle.dumps({"wte.weight": [1.0]})), "holds pickle bytes, not safetensors"),
    (lambda f: f.write_bytes(b"PK\x03\x04" + bytes(60)), r"holds zip \(torch.save\) bytes"),
    # Noise from a fixed seed: os.urandom failed one run in 256, when its first byte was pickle's 0x80.
    (lambda f: f.write_bytes(b"\x01" + np.random.default_rng(0).bytes(255)), "not a valid safetensors file"),
])
def test_damaged_weights_file_is_one_line_exit_2(ckpt, tmp_path, capsys, damage, message):
    damage(ckpt / "model.safetensors")
    rc, err = _run(capsys, "run", "--checkpoint", str(ckpt), "--out", str(tmp_path / "o"), "--no-progress")
    assert rc == 2
    _one_line(err)
    assert "model.safetensors" in err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "o").exists()  # refused before the output folder was touched


@pytest.mark.parametrize("change, dtype, message", [
    (lambda t: t.update({"wte.weight": t["wte.weight"].astype(np.int32)}), "float32", "'wte.weight' holds I32; weights must be floats"),
    (lambda t: t.update({"wpe.weight": t["wpe.weight"].astype(np.float64)}), "float32",
     "'wpe.weight' holds F64, which does not load exactly as float32; run with --dtype float64"),
    (lambda t: t.update({"h.1.mlp.c_fc.weight": np.zeros((8, 17), np.float32)}), "float32",
     r"'h.1.mlp.c_fc.weight': shape \(8, 17\) in the checkpoint, expected \(8, 16\)"),
    (lambda t: t.pop("h.1.ln_2.bias"), "float32", "missing key 'h.1.ln_2.bias'"),
])
def test_weights_that_do_not_match_config_are_refused_up_front(ckpt, tmp_path, capsys, change, dtype, message):
    _rewrite(ckpt, change)
    rc, err = _run(capsys, "run", "--checkpoint", str(ckpt), "--dtype", dtype, "--out", str(tmp_path / "o"))
    assert rc == 2
    _one_line(err)
    assert __import__("re").search(message, err), err


def test_bfloat16_weights_are_refused_with_what_to_do(ckpt, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / "model.safetensors"))
    save_file({**tensors, "wte.weight": tensors["wte.weight"].to(torch.bfloat16)}, str(ckpt / "model.safetensors"))
    rc, err = _run(capsys, "run", "--checkpoint", str(ckpt), "--out", str(tmp_path / "o"))
    assert rc == 2
    _one_line(err)
    assert "'wte.weight' holds BF16, which numpy (and so this loader) cannot read; save the weights as F32" in err


def test_float64_weights_run_in_float64_pass_the_check(ckpt):
    from parity.inputs.checkpoints import check_weights_file

    _rewrite(ckpt, lambda t: t.update({k: v.astype(np.float64) for k, v in t.items()}))
    assert check_weights_file(ckpt, GPT2, ("float64",)) == (ckpt / "model.safetensors").stat().st_size


def test_valid_weights_whose_first_byte_is_pickles_magic_are_read(ckpt):
    """A safetensors file starts with its header's length (u64, little endian): a 128-byte header
    makes its first byte 0x80, pickle's first byte; the file is read, not refused as pickle."""
    import struct

    from safetensors.numpy import load_file, save_file

    from parity.inputs.checkpoints import check_weights_file

    weights = ckpt / "model.safetensors"
    tensors = load_file(str(weights))
    for pad in range(300):  # metadata of a growing length until the header is 128 + 256 k bytes long
        save_file(tensors, str(weights), metadata={"format": "pt", "pad": "x" * pad})
        if weights.read_bytes()[0] == 0x80:
            break
    assert weights.read_bytes()[0] == 0x80, struct.unpack("<Q", weights.read_bytes()[:8])
    assert check_weights_file(ckpt, GPT2) == weights.stat().st_size


def test_pickle_only_directory_is_one_line_exit_2(ckpt, tmp_path, capsys):
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps({}))
    rc, err = _run(capsys, "run", "--checkpoint", str(ckpt), "--out", str(tmp_path / "o"))
    assert rc == 2
    _one_line(err)
    assert "pickle files are never loaded" in err


def test_corrupt_tokenizer_is_one_line_exit_2(ckpt, tmp_path, capsys):
    (ckpt / "tokenizer.json").write_text('{"model": ')
    rc, err = _run(capsys, "run", "--checkpoint", str(ckpt), "--out", str(tmp_path / "o"))
    assert rc == 2
    _one_line(err)
    assert "tokenizer.json cannot be read by `tokenizers`" in err


@pytest.mark.parametrize("field, value, message", [
    ("n_layer", 0, "TransformerConfig.n_layer must be an integer >= 1, got 0"),
    ("n_layer", "abc", "TransformerConfig.n_layer must be an integer >= 1, got 'abc'"),
    ("n_embd", None, "missing field 'n_embd' for model_type 'gpt2'"),
])
def test_bad_config_field_is_one_line_naming_the_file(ckpt, tmp_path, capsys, field, value, message):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k != field} if value is None else {**cfg, field: value}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rc, err = _run(capsys, "run", "--checkpoint", str(ckpt), "--out", str(tmp_path / "o"))
    assert rc == 2
    _one_line(err)
    assert err == f"error: {ckpt / 'config.json'}: {message}"


def test_config_depth_that_disagrees_with_the_weights_is_refused_at_once(ckpt, tmp_path):
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "n_layer": 10**9}))
    proc = subprocess.run([sys.executable, "-m", "parity", "run", "--checkpoint", str(ckpt), "--frameworks", "torch",
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    _one_line(err)
    assert "says 1000000000 layers but" in err and "holds layers 0..1 (2 in all)" in err and len(err) < 500


def test_run_larger_than_memory_is_refused_with_the_estimate(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(budget, "available_memory_bytes", lambda: 1 << 20)
    rc, err = _run(capsys, "run", "--model", "gpt-tiny", "--out", str(tmp_path / "o"))
    assert rc == 2
    _one_line(err)
    assert "this run needs at least an estimated" in err and "but 1.0 MiB is available" in err and "parameters in float32" in err


def test_sweep_of_a_billion_layers_is_refused_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "parity", "sweep", "--depths", "4,1000000000", "--frameworks", "torch",
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 2
    _one_line(proc.stderr.strip())
    assert "the sweep's deepest case (N=1000000000) needs at least an estimated" in proc.stderr


def test_second_run_into_a_locked_out_is_refused_with_the_pid(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "report.json").write_text('{"mine": 1}')
    with OutDirLock(out):
        rc, err = _run(capsys, "run", "--model", "gpt-tiny", "--frameworks", "torch", "--out", str(out))
        rc2, err2 = _run(capsys, "sweep", "--depths", "1,2", "--frameworks", "torch", "--out", str(out))
    assert rc == rc2 == 2
    for e in (err, err2):
        _one_line(e)
        assert f"another run (PID {os.getpid()}) is writing into {out}" in e
    assert (out / "report.json").read_text() == '{"mine": 1}' and not (out / "previous").exists()


BRACKETS = "[/x]"


@pytest.mark.parametrize("argv", [
    ["run", "--schedules", BRACKETS], ["run", "--dtype", BRACKETS], ["run", "--frameworks", BRACKETS],
    ["run", "--model", BRACKETS], ["run", "--checkpoint", f"ckpt{BRACKETS}"], ["run", "--schedules", f"full+{BRACKETS}"],
    ["sweep", "--depths", BRACKETS], ["sweep", "--schedules", BRACKETS], ["sweep", "--frameworks", BRACKETS],
    ["sweep", "--frontier-plans", BRACKETS],
])
def test_values_with_brackets_are_printed_as_text_not_markup(tmp_path, capsys, argv):
    rc, err = _run(capsys, *argv, "--out", str(tmp_path / "o"))
    assert rc == 2
    _one_line(err)
    assert BRACKETS in err


def test_paths_with_brackets_are_named_exactly(tmp_path, capsys):
    missing = tmp_path / "ckpt[red]"  # rich read "[red]" as a style and named tmp/ckpt instead
    rc, err = _run(capsys, "run", "--checkpoint", str(missing), "--out", str(tmp_path / "o"))
    assert rc == 2 and f"checkpoint directory {missing} does not exist" in err
    target = tmp_path / "out[bold]"
    target.write_text("a file")
    rc, err = _run(capsys, "run", "--model", "gpt-tiny", "--out", str(target))
    assert rc == 2
    assert f"output path {target} exists and is not a directory" in err


def test_missing_minilm_prints_the_install_command_whole(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(parity.inputs.pretrained, "MINILM_PACKAGE", "no_such_checkpoint_package")
    rc, err = _run(capsys, "run", "--model", "minilm-l6", "--out", str(tmp_path))
    assert rc == 2
    assert parity.inputs.pretrained.MINILM_INSTALL in err and "'.[minilm]'" in err


@pytest.mark.parametrize("argv, message", [
    (["run", "--out", ""], "--out is empty"),
    (["sweep", "--out", " "], "--out is empty"),
    (["run", "--checkpoint", "x", "--model", "gpt-tiny"], "--checkpoint and --model both given"),
    (["run", "--checkpoint", ""], "--checkpoint is empty"),
    (["run", "--model", ""], "--model is empty; give a preset (gpt-small, gpt-tiny, minilm-l6, minilm-l6-short)"),
    (["run", "--model", " "], "--model is empty"),
    (["run", "--frameworks", "torch,torch"], "--frameworks: 'torch' listed twice"),
    (["sweep", "--frameworks", "torch,torch"], "--frameworks: 'torch' listed twice"),
    (["run", "--schedules", "every_k(2),every_k(02)"], "--schedules: 'every_k(02)' is 'every_k(2)' listed twice"),
    (["run", "--dtype", "float32,float32"], "--dtype: 'float32' listed twice"),
    (["sweep", "--schedules", ""], "--schedules is empty"),
    (["sweep", "--frontier-plans", ""], "--frontier-plans is empty"),
    (["sweep", "--depths", "2,2_0"], "--depths must be comma-separated integers in ASCII digits"),
    (["sweep", "--depths", "2,\uff14"], "--depths must be comma-separated integers in ASCII digits"),
    (["sweep", "--depths", "4,4,8"], "--depths: '4' listed twice"),
    (["run", "--schedules", "every_k(2_0)"], "parameter '2_0' is not an integer"),
    (["run", "--schedules", "every_k(+2)"], "parameter '+2' is not an integer"),
])
def test_odd_option_values_are_refused(tmp_path, capsys, argv, message):
    if "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path / "o")]
    rc, err = _run(capsys, *argv)
    assert rc == 2
    _one_line(err)
    assert message in err
    assert os.listdir(tmp_path) == []  # nothing written, not even into the current directory


@pytest.mark.skipif(any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin")),
                    reason="a CUDA plugin for JAX is installed: JAX_PLATFORMS=cuda may well start here")
def test_jax_platform_that_is_not_available_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "parity", "run", "--model", "gpt-tiny", "--schedules", "full",
                           "--frameworks", "jax", "--out", str(tmp_path / "o")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "JAX_PLATFORMS": "cuda"})
    assert proc.returncode == 2
    err = proc.stderr.strip()
    _one_line(err)
    assert "JAX cannot start on JAX_PLATFORMS='cuda'" in err and "--frameworks torch" in err


@pytest.mark.parametrize("argv, message", [
    (["run", "--repeats", "1_0"], "argument --repeats: '1_0' is not an integer written in ASCII digits"),
    (["run", "--seed", "\uff12"], "argument --seed: '\uff12' is not an integer written in ASCII digits"),
    (["sweep", "--frontier-depth", "+3"], "argument --frontier-depth: '+3' is not an integer written in ASCII digits"),
    (["sweep", "--repeats", "\u0663"], "argument --repeats: '\u0663' is not an integer written in ASCII digits"),
    (["run", "--repeats", "x"], "argument --repeats: 'x' is not an integer"),
    (["run", "--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["sweep", "--depths"], "argument --depths: expected one argument"),
])
def test_integer_options_and_argparse_errors_are_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2
    _one_line(err)  # argparse alone printed its usage block first and read '1_0' as 10
    assert message in err and err.endswith("--help"), err
    assert os.listdir(tmp_path) == []
