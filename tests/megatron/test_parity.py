"""The parity measurement's arithmetic and table on recorded numbers (the measurement itself needs
a GPU: test_parity_gpu.py), and its first step on a CPU for a model without Mamba layers."""

import pytest

from fp4repro.megatron.parity import bf16_bounds, linear_gradients, table_header, table_row, verdict


def test_bf16_bounds_follow_the_rounding_argument():
    # u = 2^-8, L = 4 layers: spread u·sqrt(L) = 2^-7; loss 2·spread·max|logit|, gradients 4·spread
    assert bf16_bounds(4, 3.0) == {"loss": 2 * 2**-7 * 3.0, "gradient": 4 * 2**-7}
    assert bf16_bounds(16, 1.0)["gradient"] == 2 * bf16_bounds(4, 1.0)["gradient"]


def test_linear_gradients_are_the_internal_linears_weights():
    differences = {
        "embedding.weight": 9.0,
        "lm_head.weight": 9.0,
        "final_norm.weight": 9.0,
        "layers.0.norm.weight": 9.0,
        "layers.0.mixer.in_proj.weight": 1.0,
        "layers.0.mixer.out_proj.weight": 2.0,
        "layers.0.mixer.conv1d.weight": 9.0,
        "layers.0.mixer.A_log": 9.0,
        "layers.0.mixer.norm.weight": 9.0,
        "layers.1.mixer.fc1.weight": 3.0,
        "layers.1.mixer.fc2.weight": 4.0,
        "layers.3.mixer.qkv_proj.weight": 5.0,
        "layers.3.mixer.o_proj.weight": 6.0,
    }
    assert linear_gradients(differences) == {k: v for k, v in differences.items() if v < 9}


def test_a_row_prints_under_its_header():
    result = {"model": "tiny", "batch": 4, "length": 256, "seed": 0}
    row = {
        "recipe": "ue5m3",
        "autocast": "bf16",
        "loss_reference": 7.62512,
        "loss_difference": -1.3e-3,
        "yardstick_loss_difference": 2.4e-4,
        "bounds": {"loss": 0.05, "gradient": 0.035},
        "linear_gradient_max": 0.25,
        "yardstick_linear_gradient_max": 0.19,
        "bf16_effect_linear_gradient_max": 0.31,
        "worst_ratio": 0.87,
        "megatron_effect_ratio": 1.02,
        "within": True,
    }
    header = table_header(result).splitlines()
    assert header[0].startswith("tiny: batch 4 x 256 tokens") and "lin grad" in header[1]
    assert table_row(row).split() == [
        "ue5m3",
        "bf16",
        "7.62512",
        "-1.30e-03",
        "+2.40e-04",
        "5.00e-02",
        "2.50e-01",
        "1.90e-01",
        "3.50e-02",
        "3.10e-01",
        "0.87",
        "1.02",
        "yes",
    ]
    fp32 = table_row(
        {
            **row,
            "autocast": "fp32",
            "bounds": None,
            "within": None,
            "bf16_effect_linear_gradient_max": float("nan"),
            "worst_ratio": float("nan"),
            "megatron_effect_ratio": float("nan"),
        }
    ).split()
    assert fp32[5] == fp32[9] == fp32[10] == fp32[11] == "nan" and fp32[12] == "-"
    assert table_row({**row, "within": False}).split()[-1] == "NO"


def _differences(**linears):
    names = {"in_proj": "layers.0.mixer.in_proj.weight", "fc1": "layers.1.mixer.fc1.weight"}
    return {"gradient_difference": {"embedding.weight": 5.0, **{names[k]: v for k, v in linears.items()}}}


def test_a_quantized_row_is_within_when_every_linear_moves_at_most_sqrt2_times_as_far_as_bf16_rounding_moves_it():
    # two BF16 roundings of one FP32 computation, each moving a gradient by E in unrelated
    # directions, end sqrt(E^2 + E^2) apart
    bounds = {"loss": 0.02, "gradient": 0.035}
    effect = _differences(in_proj=0.20, fc1=0.10)
    ok = verdict(
        True,
        {"loss_difference": -4e-4, **_differences(in_proj=0.28, fc1=0.09)},
        effect,
        bounds,
        megatron_effect=_differences(in_proj=0.22, fc1=0.08),
    )
    assert (
        ok["within"] and ok["worst_ratio"] == pytest.approx(1.4) and ok["worst_ratio_linear"].endswith("in_proj.weight")
    )
    assert ok["bf16_effect_linear_gradient_max"] == 0.20 and ok["megatron_effect_ratio"] == pytest.approx(1.1)
    # fc1 exceeds sqrt(2) times its own effect though it stays under in_proj's
    per_linear = verdict(True, {"loss_difference": -4e-4, **_differences(in_proj=0.05, fc1=0.15)}, effect, bounds)
    assert not per_linear["within"] and per_linear["worst_ratio"] == pytest.approx(1.5)
    assert "megatron_effect_ratio" not in per_linear
    # the loss bound holds for quantized rows too; embedding differences are not the linears'
    assert not verdict(True, {"loss_difference": 0.03, **_differences(in_proj=0.01, fc1=0.01)}, effect, bounds)[
        "within"
    ]
    # a NaN anywhere is outside, wherever it sits
    for nan in ({"in_proj": 0.01, "fc1": float("nan")}, {"in_proj": float("nan"), "fc1": 0.01}):
        assert not verdict(True, {"loss_difference": 0.0, **_differences(**nan)}, effect, bounds)["within"]
        assert not verdict(False, {"loss_difference": 0.0, **_differences(**nan)}, effect, bounds)["within"]
    assert not verdict(True, {"loss_difference": float("nan"), **_differences(in_proj=0.01, fc1=0.01)}, effect, bounds)[
        "within"
    ]


def test_a_bf16_row_is_judged_by_the_rounding_bounds_not_by_the_bf16_effect():
    bounds = {"loss": 0.02, "gradient": 0.035}
    effect = _differences(in_proj=0.001, fc1=0.001)
    assert verdict(False, {"loss_difference": 1e-4, **_differences(in_proj=0.03, fc1=0.01)}, effect, bounds)["within"]
    assert not verdict(False, {"loss_difference": 1e-4, **_differences(in_proj=0.04, fc1=0.01)}, effect, bounds)[
        "within"
    ]


def test_loss_curves_compare_megatron_with_three_times_the_larger_reference_drift():
    from fp4repro.train.backend_curves import compare, table_row

    curves = {
        "reference": [5.0, 4.0, 3.0],
        "again": [5.0, 4.0, 3.0],
        "yardstick": [5.0, 4.01, 2.98],
        "megatron": [5.0, 4.03, 3.05],
    }
    got = compare(curves)
    assert got["max_difference"]["yardstick"] == pytest.approx(0.02)
    assert got["band"] == pytest.approx(0.06) and got["within"]
    curves["megatron"][2] = 3.07  # 0.07 > 3 x 0.02
    outside = compare(curves)
    assert not outside["within"]
    assert table_row({"recipe": "ue5m3", **outside}).endswith("NO")
    # a curve that diverges after its first step is outside whichever curve it is (Python's max
    # would pass over a NaN that is not first)
    for name in ("megatron", "again", "reference"):
        diverged = {k: list(v) for k, v in curves.items()} | {"megatron": [5.0, 4.03, 3.05]}
        diverged[name][2] = float("nan")
        got = compare(diverged)
        assert not got["within"] and (got["max_difference"]["megatron"] == float("inf") or name != "megatron"), name


def test_the_yardstick_leaves_the_references_stochastic_rounding_draws_alone():
    """first_step, yardstick, first_step: the second first_step must draw the same SR bits in both
    models, so the yardstick may not draw from the reference's QuantState."""
    import torch

    from fp4repro.config.model import load_model_config
    from fp4repro.config.recipe import load_recipe
    from fp4repro.megatron.parity import yardstick
    from fp4repro.model import NemotronH
    from fp4repro.quant.state import QuantState

    config = load_model_config("tiny")
    reference = NemotronH(config, load_recipe("ue5m3"), state=QuantState(seed=3))
    tokens = torch.randint(0, config.vocab_size, (1, 33), generator=torch.Generator().manual_seed(3))
    before = dict(reference.quant_state._sr_draws)
    result = yardstick(reference, tokens, seed=1, bf16=False)
    assert result["gradient_difference"] and reference.quant_state._sr_draws == before


def test_the_bf16_effect_compares_the_reference_under_autocast_with_itself_in_fp32():
    """On CPU (autocast on the inputs' device): a nonzero effect, the same bits again on a repeat,
    and the reference's own SR draws untouched."""
    import torch

    from fp4repro.config.model import load_model_config
    from fp4repro.config.recipe import load_recipe
    from fp4repro.megatron.parity import bf16_effect
    from fp4repro.model import NemotronH
    from fp4repro.quant.state import QuantState

    config = load_model_config("tiny")
    reference = NemotronH(config, load_recipe("ue5m3"), state=QuantState(seed=4))
    tokens = torch.randint(0, config.vocab_size, (1, 33), generator=torch.Generator().manual_seed(4))
    before = dict(reference.quant_state._sr_draws)
    first = bf16_effect(reference, tokens, seed=1)
    assert reference.quant_state._sr_draws == before
    lin = linear_gradients(first["gradient_difference"])
    assert min(lin.values()) > 1e-3 and first["loss_difference"] != 0.0
    assert bf16_effect(reference, tokens, seed=1) == first


@pytest.mark.parametrize("qkv", ["fused", "separate"])
def test_a_model_without_mamba_takes_the_references_first_fp32_step_on_a_cpu(qkv, megatron_cpu):
    """megatron-core's Mamba mixer needs mamba-ssm's GPU kernels, its attention and MLP do not: a
    model of attention and MLP layers runs whole on a CPU, fused or separate q/k/v. In FP32 its
    loss is the reference's and its weight gradients agree to FP32 rounding; the key and value
    weights swapped break that."""
    import dataclasses

    import torch

    from fp4repro.config.model import load_model_config
    from fp4repro.config.recipe import load_recipe
    from fp4repro.megatron.convert import to_megatron
    from fp4repro.megatron.parity import first_step
    from fp4repro.model import NemotronH

    config = dataclasses.replace(load_model_config("tiny"), pattern="-*-", qkv=qkv)
    torch.manual_seed(0)
    reference = NemotronH(config, load_recipe("bf16"))
    megatron = megatron_cpu(config)
    state = to_megatron(reference.state_dict(), config)
    megatron.load_state_dict(state, strict=True)
    tokens = torch.randint(0, config.vocab_size, (2, 65), generator=torch.Generator().manual_seed(1))
    step = first_step(reference, megatron, tokens, seed=2, bf16=False)
    assert abs(step["loss_difference"]) <= 1e-6 * step["loss_reference"]
    assert max(linear_gradients(step["gradient_difference"]).values()) <= 1e-5
    attention = "decoder.layers.1.self_attention.linear_qkv"
    if qkv == "fused":  # the K rows of every group in the V rows' place
        w = state[f"{attention}.weight"].unflatten(0, (config.attn_kv_heads, -1, config.attn_head_dim))
        state[f"{attention}.weight"] = w[:, [0, 1, 3, 2]].flatten(0, 2)  # r = 2 query heads per group
    else:
        key, value = f"{attention}.linear_k.weight", f"{attention}.linear_v.weight"
        state[key], state[value] = state[value], state[key]
    megatron.load_state_dict(state, strict=True)
    swapped = first_step(reference, megatron, tokens, seed=2, bf16=False)
    assert max(linear_gradients(swapped["gradient_difference"]).values()) > 0.1
