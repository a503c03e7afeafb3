"""A recipe's ``gemm:`` field: parsing, errors, the packaged recipes' models, and the fingerprint."""

from __future__ import annotations

import pytest

from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import RecipeError, load_recipe, recipe_from_config
from fp4repro.config.spec import GemmModel


def with_gemm(value):
    config = load_recipe("ue5m3").config
    config["gemm"] = value
    return recipe_from_config(config, "mine.yaml")


@pytest.mark.parametrize(
    "value, expected",
    [
        ("fp32", GemmModel("fp32")),
        ("probe_matched", GemmModel("probe_matched", 64, 2.0**-10)),
        ({"model": "probe_matched", "group": 32, "lattice": "1/4096"}, GemmModel("probe_matched", 32, 2.0**-12)),
        ({"model": "probe_matched", "lattice": "none"}, GemmModel("probe_matched", 64, None)),
        ({"model": "probe_matched", "lattice": 0.25}, GemmModel("probe_matched", 64, 0.25)),
    ],
)
def test_gemm_values_parse(value, expected):
    recipe = with_gemm(value)
    assert recipe.gemm == expected
    layers = load_model_config("tiny").layer_linears
    assert recipe.linear_specs(3, layers, "o_proj").gemm == expected  # every quantized linear carries it
    assert recipe_from_config(recipe.config, "again").gemm == expected  # a checkpoint's copy round-trips


@pytest.mark.parametrize(
    "value, field, allowed",
    [
        ("fp16", "gemm", "fp32, probe_matched, or {model: probe_matched"),
        ({"model": "probe_matched", "lattice": "1/1000"}, "gemm.lattice", "a power of two"),
        ({"model": "probe_matched", "lattice": 2}, "gemm.lattice", "a power of two"),
        ({"model": "probe_matched", "group": 48}, "gemm.group", "allowed [16, 32, 64, 128, 256]"),
        ({"model": "exact"}, "gemm.model", "allowed: ['fp32', 'probe_matched']"),
    ],
)
def test_bad_gemm_values_name_file_field_value_and_what_is_allowed(value, field, allowed):
    with pytest.raises(RecipeError) as err:
        with_gemm(value)
    assert str(err.value).startswith(f"mine.yaml: field '{field}': value ") and allowed in str(err.value)


def test_packaged_recipes_use_the_model_where_native_fp4_tensor_cores_would_compute():
    for name in ("nvfp4", "ue5m3", "ue5m3_t448", "ue5m3_b32", "ue5m3_te_settings", "nvfp4_no_rht"):
        assert load_recipe(name).gemm == GemmModel("probe_matched", 64, 2.0**-10), name
    for name in ("ue5m3_torch_gemm", "nvfp4_gemm_fp32", "mxfp4", "bf16"):
        assert load_recipe(name).gemm == GemmModel("fp32"), name
    # the controls differ from their bases in the GEMM model alone
    for control, base in (("ue5m3_torch_gemm", "ue5m3"), ("nvfp4_gemm_fp32", "nvfp4")):
        assert load_recipe(control).numerics()[:3] == load_recipe(base).numerics()[:3]


def test_the_gemm_model_enters_the_run_fingerprint():
    from fp4repro.config.study import load_study
    from fp4repro.train.runs import run_fingerprint

    study = load_study("tiny", add_recipes=("ue5m3_torch_gemm",))
    prints = {name: run_fingerprint(study, name, 0, "data")[1] for name in ("ue5m3", "ue5m3_torch_gemm")}
    assert prints["ue5m3"] != prints["ue5m3_torch_gemm"]
