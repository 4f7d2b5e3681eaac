"""jaxremat.models.registry: one ModelSpec per family, lazy framework parts, a clear error for unknown names."""

import dataclasses
import inspect
import subprocess
import sys
import types

import numpy as np
import pytest

from jaxremat.models import (
    LAZY_PARTS, ModelSpec, TransformerConfig, check_params, get_model, init_params, param_shapes, register_model,
    registered_models, unregister_model,
)


def test_builtin_families_are_gpt_then_bert():
    assert registered_models()[:2] == ("gpt", "bert")
    assert get_model("gpt").name == "gpt" and get_model("bert").name == "bert"


def _torch_part(spec, part: str) -> bool:
    """Whether a family's lazy part lives in torchref (it needs torch installed to load)."""
    path = getattr(spec, part)
    return isinstance(path, str) and path.split(":")[0].split(".")[0] == "torchref"


@pytest.mark.parametrize("arch", registered_models())
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_every_lazy_part_of_every_registered_family_resolves(arch, framework):
    spec = get_model(arch)
    if framework == "torch":  # jaxremat alone (no torch installed) still checks every other part
        pytest.importorskip("torch", reason="the torchref parts need torch (pip install 'jaxremat[torch]')")
    for part in (p for p in LAZY_PARTS if _torch_part(spec, p) == (framework == "torch")):
        if getattr(spec, part) is None:
            with pytest.raises(ValueError, match=f"{arch!r} has no {part}"):
                spec.load(part)
            continue
        obj = spec.load(part)
        if part in ("checkpoint", "activation_account"):
            assert isinstance(obj, types.ModuleType), (part, obj)
        else:
            assert callable(obj), (part, obj)
    if framework == "torch":
        assert inspect.isclass(spec.load("torch_model")) and hasattr(spec.load("torch_model"), "from_params")


def test_builtin_parts_are_the_modules_they_name():
    from jaxremat import encoder, model

    assert get_model("gpt").load("jax_loss") is model.loss_fn
    assert get_model("bert").load("jax_loss") is encoder.loss_fn
    pytest.importorskip("torch", reason="the torchref parts need torch (pip install 'jaxremat[torch]')")
    from torchref import encoder as t_encoder
    from torchref.model import GPT

    assert get_model("gpt").load("torch_model") is GPT and get_model("bert").load("torch_model") is t_encoder.Encoder


def test_checkpoint_adapters_follow_the_protocol():
    for arch in (a for a in registered_models() if get_model(a).checkpoint is not None):
        adapter = get_model(arch).load("checkpoint")
        for name in ("PREFIX", "LAYER_KEY", "IGNORED_KEYS", "config_from_hf", "hf_config", "hf_shapes",
                     "to_canonical", "from_canonical"):
            assert hasattr(adapter, name), (arch, name)
        cfg = get_model(arch).config(n_layer=2, d_model=8, n_head=2, d_ff=16, max_seq_len=6, vocab_size=20)
        assert adapter.config_from_hf(adapter.hf_config(cfg), "float32") == cfg


def test_capabilities_are_fields_not_arch_tests():
    gpt, bert = get_model("gpt"), get_model("bert")
    assert (gpt.block_names_measurable, bert.block_names_measurable) == (True, False)
    assert (gpt.stress_suite, bert.stress_suite) == (True, False)
    assert (gpt.batch, bert.batch) == ("windows", "sentence_pairs")
    assert gpt.compute_dtypes == ("bfloat16",) and bert.compute_dtypes == ()
    assert gpt.activation_account is not None and bert.activation_account is None
    assert gpt.peer_checks is None and bert.peer_checks is not None


def test_family_config_constructor_sets_arch():
    cfg = get_model("bert").config(n_layer=2, d_model=8, n_head=2, d_ff=16)
    assert isinstance(cfg, TransformerConfig) and cfg.arch == "bert"
    assert list(param_shapes(cfg))[:3] == ["wte", "wpe", "wtt"]


def test_unknown_family_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown model family 'nope'; registered families: gpt, bert"):
        get_model("nope")
    with pytest.raises(ValueError, match="unknown model family"):
        unregister_model("nope")


def test_load_refuses_a_field_that_is_not_lazy():
    with pytest.raises(ValueError, match="'name' is not a lazy part"):
        get_model("gpt").load("name")


def test_registering_twice_or_a_bad_path_is_refused():
    with pytest.raises(ValueError, match="'gpt' is registered already"):
        register_model(get_model("gpt"))
    with pytest.raises(ValueError, match="jax_loss must be an import path"):
        dataclasses.replace(get_model("gpt"), name="gpt_bad", jax_loss="not a path")
    with pytest.raises(ValueError, match="batch must be"):
        dataclasses.replace(get_model("gpt"), name="gpt_bad", batch="images")
    with pytest.raises(TypeError, match="takes a ModelSpec"):
        register_model({"name": "x"})


def test_registry_imports_neither_framework():
    code = ("import sys, jaxremat.models, jaxremat.models.registry, jaxremat.models.gpt.activation, "
            "jaxremat.models.gpt.checkpoint, jaxremat.models.bert.checkpoint; "
            "from jaxremat.models import TransformerConfig, get_model, init_params; "
            "init_params(TransformerConfig(arch='bert', n_layer=1)); [get_model(a) for a in ('gpt', 'bert')]; "
            "bad = [m for m in ('jax', 'torch', 'flax') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@dataclasses.dataclass(frozen=True)
class _ToyConfig:
    """A third family's own config: a stack of N linear layers of width D."""

    n_layer: int = 2
    d_model: int = 3
    dtype: str = "float32"
    arch: str = "toy"


def _toy_shapes(cfg):
    return {"h.w": (cfg.n_layer, cfg.d_model, cfg.d_model), "h.b": (cfg.n_layer, cfg.d_model)}


def _toy_init(cfg, seed=0, perturb=True):
    rng = np.random.default_rng(seed)
    return {k: rng.normal(0.0, 0.02, s).astype(cfg.dtype) for k, s in _toy_shapes(cfg).items()}


@pytest.fixture
def toy():
    spec = register_model(ModelSpec(
        name="toy", description="a stack of linear layers", config=_ToyConfig, param_shapes=_toy_shapes,
        init_params=_toy_init, jax_loss="jaxremat.model:loss_fn",
        jax_reverse_loop="jaxremat.reverse_loop:reverse_loop_value_and_grad", torch_model="torchref.model:GPT",
        torch_loss="torchref.render:model_loss", torch_reverse_loop="torchref.reverse_loop:reverse_segment_loop",
    ))
    yield spec
    unregister_model("toy")


def test_one_register_model_entry_makes_a_third_family_visible(toy):
    assert registered_models() == ("gpt", "bert", "toy") and get_model("toy") is toy
    cfg = toy.config(n_layer=4)
    assert param_shapes(cfg) == {"h.w": (4, 3, 3), "h.b": (4, 3)}
    params = init_params(cfg, seed=1)
    check_params(cfg, params)
    with pytest.raises(ValueError, match=r"parameter 'h\.b': expected shape \(4, 3\)"):
        check_params(cfg, {**params, "h.b": np.zeros((4, 2), np.float32)})
    assert TransformerConfig(arch="toy").arch == "toy"  # the shared config accepts any registered family


def test_unregister_removes_the_family(toy):
    unregister_model("toy")
    assert "toy" not in registered_models()
    with pytest.raises(ValueError, match="must be one of gpt, bert, got 'toy'"):
        TransformerConfig(arch="toy")
    register_model(toy)  # for the fixture's teardown
