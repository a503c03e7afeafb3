"""The native column on FP4 tensor cores: Transformer Engine's NVFP4 times the NVFP4 family and lists
the recipes it cannot compute. Runs only where ``native_available`` says it can (compute
capability >= 10.0 and Transformer Engine); elsewhere it skips with that reason."""

import pytest

from fp4repro.bench import throughput
from fp4repro.bench.native import native_available
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe

pytestmark = pytest.mark.gpu


def test_transformer_engine_times_the_nvfp4_family_natively():
    available, reason = native_available()
    if not available:
        pytest.skip(reason)
    recipes = {n: load_recipe(n) for n in ("bf16", "nvfp4", "nvfp4_no_rht_no_bf16_tail", "ue5m3")}
    result = throughput.run(
        load_model_config("small"),
        recipes,
        seq_len=2048,
        steps=5,
        warmup=1,
        columns=["emulated"],
        progress=lambda m: None,
    )
    native = result["columns"]["native"]
    assert set(native["recipes"]) == {"bf16", "nvfp4", "nvfp4_no_rht_no_bf16_tail"}
    assert "ue5m3" in native["no_equivalent"] and "native" not in result["not_measured"]
    assert native["mappings"]["nvfp4_no_rht_no_bf16_tail"]["arguments"]["disable_rht"] is True
    assert set(native["effects"]) == {"both"}
