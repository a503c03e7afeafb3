"""The megatron model's linears get the recipe of the reference model's linear in the same layer
(global layer numbers, from 1, against the reference's indices, from 0) and its QuantState key."""

import dataclasses

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


# nvfp4: its last layer BF16; overrides: single linears of single layers; separate: the q/k/v
# linears of the paper's 8B (one override of qkv_proj names the three)
@pytest.mark.parametrize("qkv", ["fused", "separate"])
@pytest.mark.parametrize("name", ["bf16", "nvfp4", "ue5m3", "overrides"])
def test_each_linear_gets_the_reference_linears_specs_and_key(name, qkv, megatron_cpu, tmp_path):
    if name == "overrides":
        (tmp_path / "overrides.yaml").write_text(OVERRIDES)
        recipe = load_recipe(tmp_path / "overrides.yaml")
    else:
        recipe = load_recipe(name)
    tiny = dataclasses.replace(load_model_config("tiny"), qkv=qkv)
    reference = {k: v for k, v in NemotronH(tiny, recipe).describe().items() if k != "lm_head"}
    model = megatron_cpu(tiny)
    state = QuantState()
    attach_recipe(model, recipe, state, tiny)
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
        projections = ["qkv_proj"] if qkv == "fused" else ["q_proj", "k_proj", "v_proj"]
        assert all("2048" in got[f"layers.3.mixer.{p}"]["wgrad.dy"] for p in projections)
        assert "2048" not in got["layers.3.mixer.o_proj"]["wgrad.dy"]


@pytest.mark.parametrize("qkv", ["fused", "separate"])
def test_the_quantizable_linears_are_megatrons_parallel_linears(qkv, megatron_cpu):
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    from fp4repro.megatron.linear import SeparateQKVLinear

    model = megatron_cpu(dataclasses.replace(load_model_config("tiny"), qkv=qkv))
    kinds = {name: type(module) for _, name, module in layer_linears(model)}
    projections = ["linear_qkv"] if qkv == "fused" else ["linear_q", "linear_k", "linear_v"]
    assert kinds == {
        "in_proj": QuantColumnParallelLinear,
        "out_proj": QuantRowParallelLinear,
        "linear_fc1": QuantColumnParallelLinear,
        "linear_fc2": QuantRowParallelLinear,
        **dict.fromkeys(projections, QuantColumnParallelLinear),
        "linear_proj": QuantRowParallelLinear,
    }
    assert issubclass(QuantColumnParallelLinear, ColumnParallelLinear)
    assert issubclass(QuantRowParallelLinear, RowParallelLinear)
    attention = model.decoder.layers[3].self_attention
    assert isinstance(attention.linear_qkv, SeparateQKVLinear) == (qkv == "separate")


def test_layer_numbers_map_to_reference_indices_and_keys():
    assert layer_index(1) == 0 and layer_index(52) == 51
    assert quant_key(4, "linear_qkv") == "layers.3.mixer.qkv_proj"
    assert quant_key(4, "linear_k") == "layers.3.mixer.k_proj"
    assert quant_key(2, "linear_fc2") == "layers.1.mixer.fc2"
    with pytest.raises(ValueError, match="start at 1"):
        layer_index(0)


def _pipeline_stage(rank: int, init: str, out: str, recipe_path: str) -> None:
    """One of two pipeline stages: build its layers of a 6-layer model, attach the recipe, save
    (layer number, key, describe) of its linears."""
    import torch
    import torch.distributed as dist
    from cpu_build import build, cpu_adaptations
    from megatron.core import parallel_state

    from fp4repro.config.model import ModelConfig
    from fp4repro.config.parallel import ParallelConfig

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=2)
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(0, inference_rng_tracker=True)
        cpu_adaptations()
        config = ModelConfig(**{**SIX_LAYERS})
        model = build(config, parallel=ParallelConfig(pipeline=2))
        attach_recipe(model, load_recipe(recipe_path), QuantState(), config)
        torch.save([(n, module.quant_key, module.describe()) for n, _, module in layer_linears(model)], f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


SIX_LAYERS = dict(
    name="six",
    pattern="M-*-M-",
    hidden_size=32,
    vocab_size=64,
    mlp_hidden_size=64,
    attn_heads=4,
    attn_kv_heads=2,
    attn_head_dim=8,
    mamba_heads=8,
    mamba_head_dim=8,
    mamba_state_size=8,
    mamba_groups=2,
    mamba_conv_kernel=4,
    mamba_chunk_size=8,
)


def test_pipeline_stages_attach_the_recipe_by_global_layer_number(tmp_path):
    # two stages of three layers: the second stage's first layer is global layer 4 (reference
    # index 3), and each stage's linears get exactly the specs of the reference's same layers
    import torch
    import torch.multiprocessing as mp

    from fp4repro.config.model import ModelConfig

    recipe = tmp_path / "overrides.yaml"
    recipe.write_text(OVERRIDES.replace("linears: [qkv_proj]", "linears: [fc1]"))  # layer 3: stage 2's MLP
    out = str(tmp_path / "linears")
    mp.start_processes(
        _pipeline_stage,
        args=(f"file://{tmp_path}/rendezvous", out, str(recipe)),
        nprocs=2,
        start_method="spawn",
        join=True,
    )
    stages = [torch.load(f"{out}.{rank}") for rank in (0, 1)]
    assert sorted({n for n, _, _ in stages[0]}) == [1, 2, 3] and sorted({n for n, _, _ in stages[1]}) == [4, 5, 6]
    reference = NemotronH(ModelConfig(**SIX_LAYERS), load_recipe(recipe)).describe()
    got = {key: described for stage in stages for _, key, described in stage}
    assert got == {k: v for k, v in reference.items() if k != "lm_head"}
    assert "2048" in got["layers.3.mixer.fc1"]["wgrad.dy"] and "2048" not in got["layers.3.mixer.fc2"]["wgrad.dy"]


@pytest.mark.parametrize("name", ["linear_proj", "linear_fc1"])
def test_a_quantized_linear_returns_its_input_gradient_in_the_inputs_layout(name, megatron_cpu):
    """megatron's activations are [sequence, batch, hidden] and the modules before a linear take
    their output's gradient in that layout (megatron's own GEMMs return it so); the quantized GEMM
    runs on the [batch, sequence] view, so its input gradient must be laid out again."""
    import torch

    tiny = load_model_config("tiny")
    model = megatron_cpu(tiny)
    attach_recipe(model, load_recipe("ue5m3"), QuantState(), tiny)
    module = next(m for _, n, m in layer_linears(model) if n == name and m.specs is not None)
    gen = torch.Generator().manual_seed(7)
    leaf = torch.randn(32, 2, module.weight.shape[1], generator=gen).requires_grad_()
    x = leaf * 1.0  # not a leaf: a leaf's .grad is re-laid out by autograd itself
    arriving = []
    x.register_hook(arriving.append)
    out, _ = module(x)
    out.backward(torch.randn(out.shape, generator=gen))
    (grad,) = arriving
    assert grad.shape == x.shape and grad.stride() == x.stride()


def test_the_output_layer_multiplies_bf16_copies_in_fp32_and_its_weight_gradient_is_the_copys(megatron_cpu):
    import torch

    from fp4repro.megatron.linear import FP32OutputColumnParallelLinear

    tiny = load_model_config("tiny")
    head = megatron_cpu(tiny).output_layer
    assert type(head) is FP32OutputColumnParallelLinear
    torch.manual_seed(7)
    x = torch.randn(5, 2, tiny.hidden_size, requires_grad=True)  # megatron's [sequence, batch, hidden]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = head(x)
    xb, wb = x.detach().to(torch.bfloat16).double(), head.weight.detach().to(torch.bfloat16).double()
    exact = xb @ wb.t()
    assert y.dtype == torch.float32 and y.shape == (5, 2, tiny.vocab_size)
    # FP32 sums of exact products: within FP32 summation's bound, far inside a BF16 output's rounding
    bound = (tiny.hidden_size + 1) * 2.0**-24 * (xb.abs() @ wb.abs().t())
    assert ((y.detach().double() - exact).abs() <= bound).all()
    g = torch.randn_like(y)
    y.backward(g)
    # the gradient reaches the parameter through its BF16 copy: BF16 values, within a BF16 ulp of exact
    want = g.double().reshape(-1, tiny.vocab_size).t() @ xb.reshape(-1, tiny.hidden_size)
    assert torch.equal(head.weight.grad, head.weight.grad.to(torch.bfloat16).float())
    assert ((head.weight.grad.double() - want).abs() <= want.abs() * 2.0**-7 + 1e-30).all()
