"""The saturating E4M3 cast against torch's clamp-then-cast (the CPU path of
``fp4repro.bench.fp8_gemm.e4m3``), in Triton's interpreter without CUDA, compiled with it."""

import torch

from fp4repro.kernels import saturating_e4m3

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _ulp(v: torch.Tensor) -> torch.Tensor:
    """The E4M3 spacing at |v| (3 mantissa bits; 2^-9 below the normals)."""
    e = torch.floor(torch.log2(v.abs().clamp(min=2.0**-6)))
    return 2.0 ** (e - 3)


def test_values_beyond_448_saturate_and_the_rest_round_to_a_neighbour():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(70, 90, generator=g) * 900).to(torch.bfloat16)  # a third beyond ±448
    x[0, :4] = torch.tensor([2688.0, -12288.0, 448.0, -449.0])
    got = saturating_e4m3(x.to(DEVICE)).cpu()
    want = x.clamp(-448, 448).to(torch.float8_e4m3fn)
    assert got.dtype == torch.float8_e4m3fn and got.shape == (70, 90) and got.is_contiguous()
    g32, w32 = got.float(), want.float()
    assert torch.isfinite(g32).all()
    assert g32[0, :4].tolist() == [448.0, -448.0, 448.0, -448.0]
    beyond = x.float().abs() >= 448
    assert torch.equal(g32[beyond], w32[beyond])
    if DEVICE == "cuda":  # the GPU's conversion rounds to nearest even, as torch's
        assert torch.equal(g32, w32)
    else:
        # Triton's interpreter rounds ties up and does not carry a mantissa overflow into the
        # exponent (124 -> 64, where the GPU and torch give 128): within one step, where torch's
        # result is not a power of two
        power_of_two = torch.frexp(w32).mantissa.abs() == 0.5
        near = ~beyond & ~power_of_two
        assert ((g32 - w32).abs()[near] <= _ulp(w32)[near]).all()


def test_a_transposed_view_is_read_in_its_strides_and_written_row_major():
    x = (torch.randn(48, 80, generator=torch.Generator().manual_seed(2)) * 100).to(torch.bfloat16)
    xt = x.t().contiguous().t()  # column-major, the same values
    assert not xt.is_contiguous()
    assert torch.equal(saturating_e4m3(xt.to(DEVICE)).cpu().float(), saturating_e4m3(x.to(DEVICE)).cpu().float())
