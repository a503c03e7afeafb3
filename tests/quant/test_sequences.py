"""Per-sequence activations: row groups in the reference, ``sequence_operand`` and QuantLinear.

A group of rows quantized with ``groups=`` equals that group quantized alone, bit for bit; a
QuantLinear whose state gives sequence lengths computes each sequence's rows exactly as it would
compute that sequence alone, whatever the other sequences and the padding hold.
"""

from dataclasses import replace

import pytest
import torch

import fp4repro.quant.linear as linear
from fp4repro.config.recipe import load_recipe
from fp4repro.quant import QuantLinear, QuantState, scaled_operand
from fp4repro.quant.gemm import gemm_function
from fp4repro.quant.linear import sequence_operand

#: A model's layers as recipes resolve them (``ModelConfig.layer_linears``): 8 MLP layers. Recipes
#: may select layers by a share among those with a given linear, which needs the layers themselves.
LAYERS = (("fc1", "fc2"),) * 8

FPROP_X = {  # the activation operand of each kind of recipe, and variants its spec allows
    "ue5m3": load_recipe("ue5m3").linear_specs(0, LAYERS).fprop_x,
    "nvfp4": load_recipe("nvfp4").linear_specs(0, LAYERS).fprop_x,
    "nvfp4_rht": replace(load_recipe("nvfp4").linear_specs(0, LAYERS).fprop_x, rht=True),
    "mxfp4": load_recipe("mxfp4").linear_specs(0, LAYERS).fprop_x,
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
    qs, d, amax, _, _ = scaled_operand(x, spec, groups=groups)
    for g in range(4):
        rows = groups == g
        qs_g, d_g, amax_g, _, _ = scaled_operand(x[rows], spec)
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


def _batch(count: int = 3):
    """(``count`` sequences of 24 positions, their lengths 10, 24, 3, 10, ...): every third from
    the second on 1000x larger than the others, every padding row 1e6."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(count, 24, 64, generator=gen)
    x[1::3] *= 1000
    lengths = tuple((10, 24, 3)[b % 3] for b in range(count))
    for b, n in enumerate(lengths):
        x[b, n:] = 1e6
    return x, lengths


@pytest.mark.parametrize(
    "device, dtype",
    [
        ("cpu", torch.float32),
        pytest.param("cuda", torch.float32, marks=pytest.mark.gpu),
        pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu),
    ],
)
@pytest.mark.parametrize("count", [3, linear.KERNEL_GROUPS_MAX + 1])  # on CUDA: kernel launches, grouped reference
@pytest.mark.parametrize("name", ["ue5m3", "nvfp4", "nvfp4_rht", "nvfp4_tiles"])
def test_sequence_operand_by_groups_equals_one_quantization_per_sequence(name, count, device, dtype):
    """Each sequence's rows equal that sequence quantized alone (on CUDA: by the kernels, whether
    the batch went through them sequence by sequence or through one grouped reference call)."""
    spec = FPROP_X.get(name) or replace(FPROP_X["nvfp4"], block=(16, 16))
    x, lengths = _batch(count)
    x = x.to(device, dtype)
    qs, d = sequence_operand(x, lengths, spec, None, "l")
    qs, d = qs.view(count, 24, 64), d.view(count, 24, 1)
    for b, n in enumerate(lengths):
        qs_b, d_b, _, _, _ = scaled_operand(x[b, :n], spec)
        assert _same(qs[b, :n], qs_b) and _same(d[b, :n], d_b.expand(n, 1)), b


class _Sequences(QuantState):
    """A QuantState that gives the batch's sequence lengths and holds no amax (as the evaluation
    policy's does)."""

    def __init__(self, lengths=None):
        super().__init__()
        self.lengths = lengths

    def sequence_lengths(self, batch, width):
        return self.lengths

    def held_amax(self, key, scaling):
        return None


@pytest.mark.parametrize("recipe", ["ue5m3", "nvfp4", "mxfp4"])
def test_a_sequences_output_is_its_output_alone(recipe):
    torch.manual_seed(0)
    lin = QuantLinear(64, 48, specs=load_recipe(recipe).linear_specs(0, LAYERS), state=_Sequences(), name="l")
    x, lengths = _batch()
    with torch.no_grad():
        lin.state.lengths = lengths
        y = lin(x)
        for b, n in enumerate(lengths):
            lin.state.lengths = (n,)
            assert torch.equal(y[b, :n], lin(x[b : b + 1, :n])[0]), b  # bit for bit
        lin.state.lengths = None  # one tensor: the training path
        y_whole = lin(x)
    if recipe == "mxfp4":  # no tensor scale: rows never depended on each other
        assert torch.equal(y_whole, y)
    else:
        assert not torch.equal(y_whole[0, :10], y[0, :10])


def test_training_quantizes_the_activation_as_one_tensor():
    assert QuantState().sequence_lengths(4, 16) is None
    spec = FPROP_X["ue5m3"]
    torch.manual_seed(0)
    lin = QuantLinear(64, 48, specs=load_recipe("ue5m3").linear_specs(0, LAYERS), state=QuantState(), name="l")
    x, _ = _batch()
    with torch.no_grad():
        qx, dx = linear.quantized_operand(x.reshape(-1, 64), spec, None, "l", "fprop.x")
        qw, dw = linear.quantized_operand(lin.weight, lin.specs.fprop_w, None, "l", "fprop.w")
        gemm = gemm_function(lin.specs, "fprop")
        assert torch.equal(lin(x).reshape(-1, 48), gemm(qx, dx, qw, dw, torch.float32))
