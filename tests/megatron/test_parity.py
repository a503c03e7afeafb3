"""The parity measurement's arithmetic and table on recorded numbers (the measurement itself needs
a GPU: test_parity_gpu.py)."""

import pytest

from fp4repro.megatron.parity import bf16_bounds, linear_gradients, table_header, table_row


def test_bf16_bounds_follow_the_rounding_argument():
    # u = 2^-8, L = 4 layers: spread u·sqrt(L) = 2^-7; loss 2·spread·max|logit|, gradients 4·spread
    assert bf16_bounds(4, 3.0) == {"loss": 2 * 2 ** -7 * 3.0, "gradient": 4 * 2 ** -7}
    assert bf16_bounds(16, 1.0)["gradient"] == 2 * bf16_bounds(4, 1.0)["gradient"]


def test_linear_gradients_are_the_internal_linears_weights():
    differences = {"embedding.weight": 9.0, "lm_head.weight": 9.0, "final_norm.weight": 9.0,
                   "layers.0.norm.weight": 9.0, "layers.0.mixer.in_proj.weight": 1.0,
                   "layers.0.mixer.out_proj.weight": 2.0, "layers.0.mixer.conv1d.weight": 9.0,
                   "layers.0.mixer.A_log": 9.0, "layers.0.mixer.norm.weight": 9.0,
                   "layers.1.mixer.fc1.weight": 3.0, "layers.1.mixer.fc2.weight": 4.0,
                   "layers.3.mixer.qkv_proj.weight": 5.0, "layers.3.mixer.o_proj.weight": 6.0}
    assert linear_gradients(differences) == {k: v for k, v in differences.items() if v < 9}


def test_a_row_prints_under_its_header():
    result = {"model": "tiny", "batch": 4, "length": 256, "seed": 0}
    row = {"recipe": "ue5m3", "autocast": "bf16", "loss_reference": 7.62512, "loss_difference": -1.3e-3,
           "yardstick_loss_difference": 2.4e-4, "bounds": {"loss": 0.05, "gradient": 0.035},
           "linear_gradient_max": 0.25, "yardstick_linear_gradient_max": 0.19}
    header = table_header(result).splitlines()
    assert header[0].startswith("tiny: batch 4 x 256 tokens") and "lin grad" in header[1]
    assert table_row(row).split() == ["ue5m3", "bf16", "7.62512", "-1.30e-03", "+2.40e-04", "5.00e-02",
                                      "2.50e-01", "1.90e-01", "3.50e-02"]
    assert table_row({**row, "autocast": "fp32", "bounds": None}).split()[5] == "nan"


def test_loss_curves_compare_megatron_with_three_times_the_larger_reference_drift():
    from fp4repro.train.backend_curves import compare, table_row

    curves = {"reference": [5.0, 4.0, 3.0], "again": [5.0, 4.0, 3.0], "yardstick": [5.0, 4.01, 2.98],
              "megatron": [5.0, 4.03, 3.05]}
    got = compare(curves)
    assert got["max_difference"]["yardstick"] == pytest.approx(0.02)
    assert got["band"] == pytest.approx(0.06) and got["within"]
    curves["megatron"][2] = 3.07                      # 0.07 > 3 x 0.02
    outside = compare(curves)
    assert not outside["within"]
    assert table_row({"recipe": "ue5m3", **outside}).endswith("NO")


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
