"""State dicts between the reference model and megatron-core's MambaModel: exact both ways, the
layout megatron's real modules have and load strictly, and attention heads that land where
megatron's attention reads them."""

import dataclasses

import pytest
import torch

from fp4repro.config.model import load_model_config
from fp4repro.megatron.convert import ConversionError, from_megatron, qkv_to_megatron, to_megatron
from fp4repro.model import NemotronH


@pytest.fixture(scope="module", params=["fused", "separate"])
def tiny(request):
    """tiny with its fused QKV projection, and with separate q/k/v linears (the paper's 8B's)."""
    return dataclasses.replace(load_model_config("tiny"), qkv=request.param)


def _reference_state(config, seed=0):
    torch.manual_seed(seed)
    return NemotronH(config).state_dict()


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_reference_layout_round_trips_exactly(tiny):
    state = _reference_state(tiny)
    there = to_megatron(state, tiny)
    assert set(there).isdisjoint(state) and len(there) == len(state)
    assert _equal(from_megatron(there, tiny), state)


def test_megatron_modules_load_the_converted_state_strictly_and_give_it_back(tiny, megatron_cpu):
    state = _reference_state(tiny)
    model = megatron_cpu(tiny)
    model.load_state_dict(to_megatron(state, tiny), strict=True)
    assert _equal(from_megatron(model.state_dict(), tiny), state)
    # and the other way: megatron's own initialization, through the reference model and back
    fresh = megatron_cpu(tiny).state_dict()
    reference = NemotronH(tiny)
    reference.load_state_dict(from_megatron(fresh, tiny), strict=True)
    back = to_megatron(reference.state_dict(), tiny)
    assert _equal(back, {k: v for k, v in fresh.items() if not k.endswith("._extra_state")})


def test_query_key_value_heads_reach_megatrons_attention_as_the_reference_splits_them(tiny, megatron_cpu):
    # megatron's own SelfAttention splits the converted fused projection (or the output of the
    # three separate ones): each of its query, key and value heads must be the reference's head
    # of the same number
    state = _reference_state(tiny, seed=3)
    model = megatron_cpu(tiny)
    model.load_state_dict(to_megatron(state, tiny), strict=True)
    i = tiny.layer_types.index("attention")
    attention = model.decoder.layers[i].self_attention
    x = torch.randn(6, 2, tiny.hidden_size, generator=torch.Generator().manual_seed(7))  # [s, b, h]
    h, kv, d = tiny.attn_heads, tiny.attn_kv_heads, tiny.attn_head_dim
    with torch.no_grad():
        query, key, value = attention.get_query_key_value_tensors(x)[:3]
        if tiny.qkv == "fused":
            q, k, v = torch.split(x @ state[f"layers.{i}.mixer.qkv_proj.weight"].t(), [h * d, kv * d, kv * d], dim=-1)
        else:
            q, k, v = (x @ state[f"layers.{i}.mixer.{name}.weight"].t() for name in ("q_proj", "k_proj", "v_proj"))
    torch.testing.assert_close(query, q.unflatten(-1, (h, d)), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(key, k.unflatten(-1, (kv, d)), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(value, v.unflatten(-1, (kv, d)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "name, parameters, tensors",
    [("nemotron_h_8b", 8_100_852_736, 303), ("nemotron_h_8b_paper", 8_084_075_520, 311)],  # fused / separate q/k/v
)
def test_the_8b_models_layouts_match_tensor_for_tensor(name, parameters, tensors, megatron_cpu):
    # NVIDIA's 8B (32 query heads in 8 KV groups, fused QKV) and the paper's (4 KV groups, separate
    # q/k/v), on the meta device: 52 layers, Mamba in_proj
    config = load_model_config(name)
    with torch.device("meta"):
        reference = NemotronH(config)
    megatron = megatron_cpu(config, device="meta")
    theirs = {k: v.shape for k, v in megatron.state_dict().items() if not k.endswith("._extra_state")}
    ours = {k: v.shape for k, v in to_megatron(reference.state_dict(), config).items()}
    assert ours == theirs and len(theirs) == tensors
    assert sum(s.numel() for s in theirs.values()) == reference.num_parameters() == parameters
    assert from_megatron(megatron.state_dict(), config).keys() == reference.state_dict().keys()


def test_qkv_groups_by_kv_head():
    # 4 query heads, 2 KV heads, head dim 1: rows q0 q1 q2 q3 k0 k1 v0 v1 -> q0 q1 k0 v0 q2 q3 k1 v1
    rows = torch.arange(8.0)[:, None]
    assert qkv_to_megatron(rows, 4, 2, 1).flatten().tolist() == [0, 1, 4, 6, 2, 3, 5, 7]


def test_a_state_of_another_model_is_refused_by_name(tiny):
    state = _reference_state(tiny)
    state.pop("layers.3.mixer.o_proj.weight")
    state["layers.9.norm.weight"] = torch.ones(tiny.hidden_size)
    with pytest.raises(
        ConversionError,
        match=r"missing \['layers.3.mixer.o_proj.weight'\]; "
        r"unknown \['layers.9.norm.weight'\]",
    ):
        to_megatron(state, tiny)
    with pytest.raises(ConversionError, match="not a megatron state dict"):
        from_megatron(_reference_state(tiny), tiny)
