"""Which operands of which linears each recipe quantizes, as the model builds them."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fp4repro.config.recipe as recipes
import fp4repro.quant as quant
from fp4repro.config.files import SCHEMAS
from fp4repro.config.model import SEPARATE_QKV, ModelConfig, load_model_config
from fp4repro.config.spec import OPERANDS
from fp4repro.model import NemotronH
from fp4repro.model.layers import FP32OutputHead

INTERNAL = ("in_proj", "out_proj", "qkv_proj", "o_proj", "fc1", "fc2")


def build(recipe_name: str, config_name: str = "tiny", device: str = "cpu") -> NemotronH:
    with torch.device(device):
        return NemotronH(load_model_config(config_name), recipes.load_recipe(recipe_name))


def quantized_operands(model: NemotronH) -> dict[str, set[str]]:
    return {name: {op for op, spec in ops.items() if spec != "bf16"} for name, ops in model.describe().items()}


def assert_embedding_and_lm_head_plain(model: NemotronH) -> None:
    assert type(model.embedding) is nn.Embedding
    assert type(model.lm_head) is FP32OutputHead  # never quantized; FP32 GEMM of BF16 copies
    assert model.describe()["lm_head"] == {op: "bf16" for op in OPERANDS}


def test_recipe_schema_knows_every_linear_name():
    import json

    schema = json.loads((SCHEMAS / "recipe.schema.json").read_text())
    allowed = schema["properties"]["overrides"]["items"]["properties"]["linears"]["items"]["enum"]
    assert set(allowed) == set(INTERNAL) | set(SEPARATE_QKV)
    among = schema["$defs"]["layers"]["oneOf"][1]["properties"]["among"]["enum"]
    assert set(among) == set(INTERNAL) | set(SEPARATE_QKV)


def test_every_internal_linear_is_a_quant_linear_sharing_one_state():
    model = build("ue5m3")
    internal = [(name, m) for name, m in model.linears() if name != "lm_head"]
    assert {name.rsplit(".", 1)[1] for name, _ in internal} == set(INTERNAL)
    assert all(isinstance(m, quant.QuantLinear) and m.name == name for name, m in internal)
    assert all(m.state is model.quant_state for _, m in internal)
    assert isinstance(model.quant_state, quant.QuantState)


def test_bf16_quantizes_nothing_and_matches_the_plain_model():
    model = build("bf16")
    assert all(not ops for ops in quantized_operands(model).values())
    assert_embedding_and_lm_head_plain(model)
    plain = NemotronH(model.config)
    plain.load_state_dict(model.state_dict())
    tokens = torch.randint(0, model.config.vocab_size, (2, 16))
    torch.testing.assert_close(model(tokens), plain(tokens), rtol=0, atol=0)


def test_nvfp4_quantizes_all_operands_except_in_its_bf16_final_layers():
    model = build("nvfp4", "small", device="meta")
    recipe, n = model.recipe, model.config.n_layers
    described = quantized_operands(model)
    exempt = [i for i in range(n) if recipe.linear_specs(i, n) is None]
    assert exempt == [14, 15]  # 8/52 of the 16 layers, rounded: the last two
    for name, ops in described.items():
        if name == "lm_head":
            continue
        layer = int(name.split(".")[1])
        assert ops == (set() if layer in exempt else set(OPERANDS)), name
    assert_embedding_and_lm_head_plain(model)
    # The RHT sits on the wgrad operands only.
    first = model.describe()["layers.0.mixer.in_proj"]
    assert [op for op in OPERANDS if "RHT" in first[op]] == ["wgrad.dy", "wgrad.x"]


def _bf16_layers(model: NemotronH) -> list[int]:
    """The layers whose every linear the model built unquantized."""
    by_layer: dict[int, set[bool]] = {}
    for name, ops in quantized_operands(model).items():
        if name != "lm_head":
            by_layer.setdefault(int(name.split(".")[1]), set()).add(bool(ops))
    return [i for i, quantized in sorted(by_layer.items()) if quantized == {False}]


@pytest.mark.parametrize(
    "recipe, config, expected",
    [
        ("nvfp4", "nemotron_h_8b", list(range(44, 52))),  # the 8B's final eight blocks of 52
        ("nvfp4", "small", [14, 15]),  # 16 x 8/52 = 2.5 -> 2
        ("nvfp4", "tiny", [4]),  # 5 x 8/52 = 0.8 -> 1
        ("nvfp4_tail4", "nemotron_h_8b", [48, 49, 50, 51]),  # the earlier reading: 4 of 52
        ("nvfp4_no_rht", "tiny", [4]),
        ("nvfp4_no_bf16_tail", "small", []),
        ("nvfp4_first_last_bf16", "nemotron_h_8b", [0, 51]),
        ("nvfp4_first_last_bf16", "tiny", [0, 4]),
        ("ue5m3_w1x16", "small", []),
    ],
)
def test_bf16_layers_as_the_model_builds_them(recipe, config, expected):
    model = build(recipe, config, device="meta")
    assert _bf16_layers(model) == expected
    assert model.recipe.bf16_layers(model.config.layer_linears) == expected


def test_the_config_knows_the_linears_of_each_layer():
    model = build("ue5m3", "tiny", device="meta")
    assert model.config.layer_linears == tuple(tuple(layer.mixer.LINEARS) for layer in model.layers)
    assert model.config.layer_linears == (
        ("in_proj", "out_proj"),
        ("fc1", "fc2"),
        ("in_proj", "out_proj"),
        ("qkv_proj", "o_proj"),
        ("fc1", "fc2"),
    )


def test_the_papers_8b_under_its_recipes():
    """nemotron_h_8b_paper's 112 linears: ue5m3 quantizes all, T = 2048 only on wgrad dY of the fc2
    of layers 45, 47, 49, 51; nvfp4 keeps the 16 projections of the final eight blocks in BF16. The
    LM head is never quantized (an FP32 GEMM)."""
    ue5m3 = build("ue5m3", "nemotron_h_8b_paper", device="meta")
    described = ue5m3.describe()
    internal = {name: ops for name, ops in described.items() if name != "lm_head"}
    assert len(internal) == 112 and all(ops == set(OPERANDS) for ops in quantized_operands(ue5m3).values() if ops)
    assert sum(name.endswith(("q_proj", "k_proj", "v_proj")) for name in internal) == 12
    t2048 = sorted((name, op) for name, ops in internal.items() for op, spec in ops.items() if "T=2048" in spec)
    assert t2048 == [(f"layers.{i}.mixer.fc2", "wgrad.dy") for i in (45, 47, 49, 51)]
    assert_embedding_and_lm_head_plain(ue5m3)
    nvfp4 = quantized_operands(build("nvfp4", "nemotron_h_8b_paper", device="meta"))
    bf16 = [name for name, ops in nvfp4.items() if not ops and name != "lm_head"]
    assert len(bf16) == 16 and {int(name.split(".")[1]) for name in bf16} == set(range(44, 52))
    assert sum(bool(ops) for ops in nvfp4.values()) == 96


def test_qkv_proj_in_a_recipe_names_separate_q_k_v_too(tmp_path):
    """An override of `qkv_proj` (and a share `among` it) reaches a model's separate q_proj, k_proj
    and v_proj, so that a recipe means the same on either model; q_proj alone reaches only it."""
    recipe = tmp_path / "attention_bf16.yaml"
    recipe.write_text(
        "name: attention_bf16\nbase: ue5m3\noverrides:\n"
        "  - {layers: {last_share: 0.5, among: qkv_proj}, linears: [qkv_proj], defaults: bf16}\n"
        "  - {layers: '0', linears: [q_proj], operands: {fprop.x: {target: 2048}}}\n"
    )
    for qkv, bf16 in (("fused", ["qkv_proj"]), ("separate", ["q_proj", "k_proj", "v_proj"])):
        config = load_model_config("tiny").to_dict() | {"pattern": "*-*-", "qkv": qkv}
        with torch.device("meta"):
            model = NemotronH(ModelConfig(**config), recipes.load_recipe(recipe))
        ops = quantized_operands(model)
        assert [name for name, o in ops.items() if not o and name != "lm_head"] == [f"layers.2.mixer.{n}" for n in bf16]
        assert all(ops[f"layers.0.mixer.{n}"] == set(OPERANDS) for n in bf16)
        fprop_x = {name: ops["fprop.x"] for name, ops in model.describe().items() if name.startswith("layers.0.")}
        assert [name for name, spec in fprop_x.items() if "T=2048" in spec] == (
            ["layers.0.mixer.q_proj"] if qkv == "separate" else []
        )


def test_separate_q_k_v_each_hold_their_own_amax():
    config = ModelConfig(**load_model_config("tiny").to_dict() | {"qkv": "separate"})
    model = NemotronH(config, recipes.load_recipe("ue5m3"))
    model(torch.randint(0, config.vocab_size, (2, 16)))
    held = model.quant_state._held
    amaxes = [float(held[f"layers.3.mixer.{n}.fprop.w"]) for n in SEPARATE_QKV]
    assert len(set(amaxes)) == 3
    assert amaxes == [float(getattr(model.layers[3].mixer, n).weight.detach().abs().max()) for n in SEPARATE_QKV]


def test_ue5m3_w1x16_quantizes_weights_in_1x16_blocks():
    described = build("ue5m3_w1x16", "tiny", device="meta").describe()
    assert described["layers.0.mixer.in_proj"]["fprop.w"] == "e2m1/ue5m3 1x16 T=448 RNE periodic(50) zero-scale-one"
    assert described["layers.3.mixer.o_proj"]["dgrad.w"] == "e2m1/ue5m3 1x16 T=448 RNE periodic(50) zero-scale-one"
    assert (
        build("ue5m3", "tiny", device="meta").describe()["layers.0.mixer.in_proj"]["fprop.w"]
        == "e2m1/ue5m3 16x16 T=448 RNE periodic(50) zero-scale-one"
    )


def test_ue5m3_quantizes_every_operand_of_every_internal_linear():
    model = build("ue5m3", "small", device="meta")
    for name, ops in quantized_operands(model).items():
        assert ops == (set() if name == "lm_head" else set(OPERANDS)), name
    assert_embedding_and_lm_head_plain(model)
    assert all("ue5m3" in spec for name, ops in model.describe().items() if name != "lm_head" for spec in ops.values())


def test_quantized_tiny_model_trains_on_cpu():
    model = build("ue5m3")
    tokens = torch.randint(0, model.config.vocab_size, (2, 33))
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["nvfp4", "ue5m3", "mxfp4"])
def test_fp4_training_step_on_cuda_under_bf16_autocast(recipe):
    torch.manual_seed(0)
    model = build(recipe, device="cuda")
    tokens = torch.randint(0, model.config.vocab_size, (2, 65), device="cuda")
    model.quant_state.telemetry = True
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    rows = model.quant_state.pop_telemetry()
    assert rows and {r["operand"] for r in rows} == set(OPERANDS)


def test_attaching_a_recipe_gives_the_model_that_recipe_builds():
    """One model timed under several recipes (``fp4repro bench throughput``): attaching ue5m3 to a
    model built for nvfp4 computes what a model built for ue5m3 with the same weights computes."""
    from fp4repro.model import attach_recipe
    from fp4repro.quant.state import QuantState

    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(11))
    built = build("ue5m3")
    attached = build("nvfp4")
    attached.load_state_dict(built.state_dict())
    before = attached(tokens)
    state = QuantState()
    attach_recipe(attached, recipes.load_recipe("ue5m3"), state)
    assert attached.quant_state is state and attached.recipe.name == "ue5m3"
    assert quantized_operands(attached) == quantized_operands(built)
    assert torch.equal(attached(tokens), built(tokens)) and not torch.equal(before, built(tokens))
    assert all(m.state is state for _, m in attached.linears() if hasattr(m, "specs"))


def test_a_recipe_cannot_be_attached_to_a_model_built_without_one():
    from fp4repro.model import attach_recipe
    from fp4repro.quant.state import QuantState

    plain = NemotronH(load_model_config("tiny"), None)
    with pytest.raises(TypeError, match="build the model with a recipe"):
        attach_recipe(plain, recipes.load_recipe("ue5m3"), QuantState())
