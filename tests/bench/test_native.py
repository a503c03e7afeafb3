"""Which recipes Transformer Engine's NVFP4BlockScaling computes, and with which arguments: checked
on CPU without Transformer Engine (the table of ``fp4repro.bench.native``, read in its source).
The native timing itself needs FP4 tensor cores: test_native_gpu.py."""

import pytest

from fp4repro.bench.native import NoTEEquivalent, native_available, te_mapping, te_specs
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe

TE_DEFAULTS = {"disable_rht": False, "disable_stochastic_rounding": False, "disable_2d_quantization": False}


@pytest.mark.parametrize(
    "recipe, arguments, tail",
    [
        ("nvfp4", TE_DEFAULTS, tuple(range(44, 52))),  # the authors' final eight blocks
        ("nvfp4_no_rht", {**TE_DEFAULTS, "disable_rht": True}, tuple(range(44, 52))),
        ("nvfp4_no_bf16_tail", TE_DEFAULTS, ()),
        ("nvfp4_no_rht_no_bf16_tail", {**TE_DEFAULTS, "disable_rht": True}, ()),
        ("nvfp4_first_last_bf16", TE_DEFAULTS, (0, 51)),
        ("bf16", None, tuple(range(52))),
    ],
)
def test_the_nvfp4_family_maps_to_nvfp4blockscaling_with_its_exempt_layers_outside_autocast(recipe, arguments, tail):
    mapping = te_mapping(load_recipe(recipe), load_model_config("nemotron_h_8b"))
    assert mapping.arguments == arguments and mapping.bf16_layers == tail


def test_transformer_engines_per_tensor_settings_in_this_suites_operands():
    # TE's __post_init__: inputs RHT only column-wise (wgrad), weights 16x16 without RHT or SR,
    # gradients SR with RHT column-wise; the current amax and 6 x 448 everywhere
    specs = te_specs()
    assert specs.fprop_w.block == specs.dgrad_w.block == (16, 16) and specs.fprop_x.block == (1, 16)
    assert {op for op, s in specs.items() if s.rht} == {"wgrad.x", "wgrad.dy"}
    assert {op for op, s in specs.items() if s.rounding == "sr"} == {"dgrad.dy", "wgrad.dy"}
    assert {(s.element, s.scale, s.target, s.tensor_scaling.kind) for _, s in specs.items()} == {
        ("e2m1", "e4m3", 448.0, "current")
    }
    flat = te_specs(True, True, True)
    assert not any(s.rht or s.rounding == "sr" or s.block != (1, 16) for _, s in flat.items())


@pytest.mark.parametrize(
    "recipe, why", [("ue5m3", "e2m1/ue5m3"), ("mxfp4", "e2m1/ue8m0"), ("ue5m3_te_settings", "ue5m3")]
)
def test_recipes_outside_nvfp4blockscaling_say_why(recipe, why):
    with pytest.raises(NoTEEquivalent, match=f"{recipe}: layers.0.mixer.in_proj quantizes .*{why}"):
        te_mapping(load_recipe(recipe), load_model_config("tiny"))


def test_a_partly_quantized_layer_has_no_equivalent(tmp_path):
    path = tmp_path / "nvfp4_fc2_bf16.yaml"
    path.write_text(
        "name: nvfp4_fc2_bf16\nbase: nvfp4\noverrides:\n  - {layers: '1:2', linears: [fc2], defaults: bf16}\n"
    )
    with pytest.raises(NoTEEquivalent, match="layer 1 is partly quantized"):
        te_mapping(load_recipe(path), load_model_config("tiny"))


def test_the_native_column_says_why_it_does_not_run_here():
    import torch

    available, reason = native_available()
    if not torch.cuda.is_available():
        assert (available, reason) == (False, "not run: no CUDA device")
    elif torch.cuda.get_device_capability() < (10, 0):
        assert not available and "compute capability >= 10.0" in reason
