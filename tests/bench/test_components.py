"""The body's parts timed alone, on CPU (Triton's interpreter, the wall clock): every GEMM and
quantization of the recipes' steps gets its row, an amax pass only where a recipe takes one, and
the file keeps other models' entries."""

import json

import pytest

from fp4repro.bench import components
from fp4repro.bench.body_work import body_work
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe
from fp4repro.errors import FP4ReproError

T = 16


@pytest.fixture(scope="module")
def timed():
    recipes = {n: load_recipe(n) for n in ("nvfp4", "ue5m3")}
    return recipes, components.run(load_model_config("tiny"), recipes, T, device="cpu", progress=lambda m: None)


def test_every_gemm_and_quantization_of_the_steps_is_timed(timed):
    recipes, result = timed
    config = load_model_config("tiny")
    for recipe in recipes.values():
        gemms, quants = body_work(config, recipe, T)
        for g in gemms:
            row = result["gemms"][components.gemm_key(g.m, g.n, g.k)]
            assert (row["m"], row["n"], row["k"]) == (g.m, g.n, g.k)
            assert min(row["bf16_ms"], row["fp8_ms"], row["cast_a_ms"], row["cast_b_ms"]) > 0
        for q in quants:
            row = result["quantizations"][components.quant_key(q.rows, q.cols, q.case)]
            assert row["quantize_ms"] > 0 and (row["rows"], row["cols"]) == (q.rows, q.cols)
    # a case only ue5m3 quantizes (held amaxes) gets no amax pass; every case nvfp4 quantizes
    # (current amaxes) gets one, shared or not
    only_held = {components.quant_key(q.rows, q.cols, q.case) for q in body_work(config, recipes["ue5m3"], T)[1]} - {
        components.quant_key(q.rows, q.cols, q.case) for q in body_work(config, recipes["nvfp4"], T)[1]
    }
    assert only_held and all("amax_ms" not in result["quantizations"][k] for k in only_held)
    assert all(
        "amax_ms" in result["quantizations"][components.quant_key(q.rows, q.cols, q.case)]
        for q in body_work(config, recipes["nvfp4"], T)[1]
    )
    assert result["device"] == "cpu" and result["tokens"] == T and result["model"] == "tiny"


def test_the_file_keeps_other_models_and_token_counts_and_the_table_names_every_part(timed, tmp_path):
    _, result = timed
    out = tmp_path / "components_cpu.json"
    components.record(out, {**result, "model": "small"})
    components.record(out, {**result, "tokens": 1024})
    components.record(out, result)
    components.record(out, result)  # the same model and tokens again: replaced
    content = json.loads(out.read_text())
    assert set(content["shapes"]) == {"small 16 tokens", "tiny 16 tokens", "tiny 1024 tokens"}
    assert "provenance" in content
    # a file that filed its entries under the model alone: the same model and tokens replace it
    out.write_text(json.dumps({"shapes": {"tiny": result}}))
    components.record(out, {**result, "copy": "again"})
    assert json.loads(out.read_text())["shapes"] == {"tiny 16 tokens": {**result, "copy": "again"}}
    lines = components.table(result).splitlines()
    assert lines[0].startswith("tiny: components at 16 tokens on cpu")
    assert len(lines) == 3 + len(result["gemms"]) + len(result["quantizations"])
    out.write_text('{"shapes": {"tiny": {"gemms": {}}}}')
    with pytest.raises(FP4ReproError, match="body-components file"):
        components.record(out, result)
