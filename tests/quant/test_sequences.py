"""Per-sequence activations: row groups in the reference.

A group of rows quantized with ``groups=`` equals that group quantized alone, bit for bit.
"""

from dataclasses import replace

import pytest
import torch

from fp4repro.config.recipe import load_recipe
from fp4repro.quant import scaled_operand

FPROP_X = {  # the activation operand of each kind of recipe, and variants its spec allows
    "ue5m3": load_recipe("ue5m3").linear_specs(0, 8).fprop_x,
    "nvfp4": load_recipe("nvfp4").linear_specs(0, 8).fprop_x,
    "nvfp4_rht": replace(load_recipe("nvfp4").linear_specs(0, 8).fprop_x, rht=True),
    "mxfp4": load_recipe("mxfp4").linear_specs(0, 8).fprop_x,
}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equal, NaN where NaN."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _rows():
    """40 rows in 4 interleaved groups: ordinary, 1000x larger, all zero, and one with NaN and inf."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 64, generator=gen)
    groups = torch.arange(40) % 4
    x[groups == 1] *= 1000
    x[groups == 2] = 0
    x[3, 5], x[7, 60] = float("nan"), float("inf")
    return x, groups


@pytest.mark.parametrize("name", sorted(FPROP_X))
def test_row_groups_equal_each_group_quantized_alone(name):
    spec = FPROP_X[name]
    x, groups = _rows()
    qs, d, amax, _ = scaled_operand(x, spec, groups=groups)
    for g in range(4):
        rows = groups == g
        qs_g, d_g, amax_g, _ = scaled_operand(x[rows], spec)
        assert _same(qs[rows], qs_g), g
        assert _same(torch.as_tensor(d).expand(40, 1)[rows], d_g.expand(int(rows.sum()), 1)), g
        if spec.target is not None:
            assert _same(amax[rows], amax_g.expand(int(rows.sum()), 1)), g


def test_row_groups_need_the_current_amax_and_one_row_blocks():
    x, groups = _rows()
    with pytest.raises(ValueError, match="1-row blocks"):
        scaled_operand(x, replace(FPROP_X["ue5m3"], block=(16, 16)), groups=groups)
    with pytest.raises(ValueError, match="held amax"):
        scaled_operand(x, FPROP_X["ue5m3"], amax=1.0, groups=groups)

