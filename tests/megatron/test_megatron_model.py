"""The megatron model's linears get the recipe of the reference model's linear in the same layer
(global layer numbers, from 1, against the reference's indices, from 0) and its QuantState key."""

import pytest

from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe
from fp4repro.megatron.linear import QuantColumnParallelLinear, QuantRowParallelLinear
from fp4repro.megatron.model import attach_recipe, layer_linears
from fp4repro.megatron.names import layer_index, quant_key
from fp4repro.model import NemotronH
from fp4repro.quant.state import QuantState

# a recipe whose overrides single out layers and linears by the reference's numbering
OVERRIDES = """name: overrides
base: ue5m3
overrides:
  - {layers: "1", linears: [fc2], defaults: bf16}
  - {layers: "3", linears: [qkv_proj], operands: {wgrad.dy: {target: 2048}}}
"""


# nvfp4: its last layer BF16; overrides: single linears of single layers
@pytest.mark.parametrize("name", ["bf16", "nvfp4", "ue5m3", "overrides"])
def test_each_linear_gets_the_reference_linears_specs_and_key(name, megatron_cpu, tmp_path):
    if name == "overrides":
        (tmp_path / "overrides.yaml").write_text(OVERRIDES)
        recipe = load_recipe(tmp_path / "overrides.yaml")
    else:
        recipe = load_recipe(name)
    tiny = load_model_config("tiny")
    reference = {k: v for k, v in NemotronH(tiny, recipe).describe().items() if k != "lm_head"}
    model = megatron_cpu(tiny)
    state = QuantState()
    attach_recipe(model, recipe, state, tiny.n_layers)
    linears = list(layer_linears(model))
    assert [n for n, _, _ in linears] == sorted(n for n, _, _ in linears) and linears[0][0] == 1
    got = {module.quant_key: module.describe() for _, _, module in linears}
    assert got == reference
    assert all(module.quant_state is state for _, _, module in linears)
    quantized = {module.quant_key for _, _, module in linears if module.specs is not None}
    assert quantized == {k for k, ops in reference.items() if set(ops.values()) != {"bf16"}}
    if name == "bf16":
        assert not quantized
    if name == "nvfp4":
        assert not any(k.startswith(f"layers.{tiny.n_layers - 1}.") for k in quantized)
    if name == "overrides":
        assert "layers.1.mixer.fc2" not in quantized and "layers.1.mixer.fc1" in quantized
        assert "2048" in got["layers.3.mixer.qkv_proj"]["wgrad.dy"] and "2048" not in got["layers.3.mixer.o_proj"]["wgrad.dy"]


def test_the_quantizable_linears_are_megatrons_parallel_linears(megatron_cpu):
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    model = megatron_cpu(load_model_config("tiny"))
    kinds = {name: type(module) for _, name, module in layer_linears(model)}
    assert kinds == {"in_proj": QuantColumnParallelLinear, "out_proj": QuantRowParallelLinear,
                     "linear_fc1": QuantColumnParallelLinear, "linear_fc2": QuantRowParallelLinear,
                     "linear_qkv": QuantColumnParallelLinear, "linear_proj": QuantRowParallelLinear}
    assert issubclass(QuantColumnParallelLinear, ColumnParallelLinear)
    assert issubclass(QuantRowParallelLinear, RowParallelLinear)


def test_layer_numbers_map_to_reference_indices_and_keys():
    assert layer_index(1) == 0 and layer_index(52) == 51
    assert quant_key(4, "linear_qkv") == "layers.3.mixer.qkv_proj"
    assert quant_key(2, "linear_fc2") == "layers.1.mixer.fc2"
    with pytest.raises(ValueError, match="start at 1"):
        layer_index(0)
