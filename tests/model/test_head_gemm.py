"""The FP32 LM head's GEMMs on BF16 operands (fp4repro.model.head_gemm): the split of the FP32
gradient is exact, each GEMM is within FP32 summation's bound of the exact float64 result (which
a BF16-rounded gradient is not), and the head's gradients are what the FP32 GEMM of the BF16
copies gives them, rounded to BF16 by the copies' casts."""

import zlib

import pytest
import torch

from fp4repro.model.head_gemm import fp32_head_linear, mm_float32, mm_split
from fp4repro.model.layers import FP32OutputHead
from fp4repro.quant.ops import split_bf16

U = 2.0**-24  # FP32's unit roundoff


def stable_seed(name: str) -> int:
    return zlib.crc32(name.encode())


def _gradient(shape, name: str, device="cpu") -> torch.Tensor:
    """An FP32 gradient whose entries span 2⁻¹⁰⁰ .. 2³⁰ in magnitude, with both signs, zeros and
    values one FP32 ulp off a BF16 rounding tie."""
    g = torch.Generator().manual_seed(stable_seed(name))
    mantissa = torch.randn(shape, generator=g)
    exponent = torch.randint(-100, 30, shape, generator=g).float()
    out = mantissa * torch.exp2(exponent)
    flat = out.view(-1)
    flat[:7] = torch.tensor([0.0, -0.0, 1.0 + 2**-8, 1.0 + 2**-8 + 2**-23, -(1.0 + 3 * 2**-8), 2**-110, 3.0 * 2**-60])
    return out.to(device)


def test_the_three_pieces_sum_to_the_gradient_exactly_and_each_is_the_nearest_bf16_of_what_is_left():
    g = _gradient((64, 257), "split")
    hi, mid, lo = split_bf16(g)
    assert hi.dtype == mid.dtype == lo.dtype == torch.bfloat16
    assert torch.equal(hi.double() + mid.double() + lo.double(), g.double())
    assert torch.equal(hi, g.to(torch.bfloat16))  # round to nearest, ties to even
    assert torch.equal(mid, (g - hi.float()).to(torch.bfloat16))
    # 1 + 2⁻⁸ is a tie between BF16's 1 and 1 + 2⁻⁷: even is 1, and 2⁻⁸ is left exactly
    assert (hi.view(-1)[2].item(), mid.view(-1)[2].item(), lo.view(-1)[2].item()) == (1.0, 2**-8, 0.0)
    # 1 + 2⁻⁸ + 2⁻²³ rounds up to 1 + 2⁻⁷; what is left, 2⁻²³ − 2⁻⁸, to −2⁻⁸; the last piece is 2⁻²³
    assert (hi.view(-1)[3].item(), mid.view(-1)[3].item(), lo.view(-1)[3].item()) == (1.0 + 2**-7, -(2**-8), 2**-23)
    with pytest.raises(TypeError, match="float32"):
        split_bf16(g.double())


def _bound(a: torch.Tensor, b: torch.Tensor, additions: int) -> torch.Tensor:
    """|fl(Σ products) − Σ products| for exact products summed in FP32 in any order: at most
    (terms − 1 + additions) · u · Σ |products| (each addition one rounding of a partial sum)."""
    return (a.shape[1] - 1 + additions) * U * (a.double().abs() @ b.double().abs())


def test_each_gemm_is_within_fp32_summations_bound_of_the_exact_result_where_a_bf16_gradient_is_not():
    g = _gradient((48, 320), "gemm")
    w = torch.randn(320, 96, generator=torch.Generator().manual_seed(stable_seed("w"))).to(torch.bfloat16)
    exact = g.double() @ w.double()
    got = mm_split(split_bf16(g), w)
    assert got.dtype == torch.float32
    assert ((got.double() - exact).abs() <= _bound(g, w, additions=2)).all()
    # the gradient rounded to BF16 once (the first piece alone) is far outside it
    rounded = mm_float32(g.to(torch.bfloat16), w).double()
    assert ((rounded - exact).abs() > _bound(g, w, additions=2)).float().mean() > 0.5
    with pytest.raises(TypeError, match="bfloat16"):
        mm_float32(g, w)


def test_the_heads_gradients_are_the_fp32_gemms_of_the_bf16_copies_rounded_to_bf16():
    torch.manual_seed(stable_seed("head"))
    head = FP32OutputHead(64, 200, bias=False)
    x = torch.randn(2, 9, 64, requires_grad=True)
    g = _gradient((2, 9, 200), "head-grad") * 1e-20  # entries spread over many binades
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = head(x)
    assert y.dtype == torch.float32 and y.shape == (2, 9, 200)
    y.backward(g)
    xb, wb = x.detach().to(torch.bfloat16).double(), head.weight.detach().to(torch.bfloat16).double()
    g64 = g.double().reshape(-1, 200)
    assert ((y.detach().double() - xb @ wb.t()).abs() <= _bound(xb.reshape(-1, 64), wb.t(), 0).reshape(2, 9, 200)).all()
    # dX and dW: within the bound before their BF16 rounding, so at most one BF16 ulp from the
    # exact values' nearest BF16, and equal to it nearly everywhere
    for grad, exact in ((x.grad.reshape(-1, 64), g64 @ wb), (head.weight.grad, g64.t() @ xb.reshape(-1, 64))):
        assert grad.dtype == torch.float32 and torch.equal(grad, grad.to(torch.bfloat16).float())
        nearest = exact.to(torch.bfloat16).double()
        ulp = torch.exp2(torch.floor(torch.log2(nearest.abs().clamp_min(2.0**-126))) - 7)
        assert ((grad.double() - nearest).abs() <= ulp).all()
        assert (grad.double() == nearest).float().mean() > 0.99


def test_the_head_refuses_operands_that_are_not_bf16():
    with pytest.raises(TypeError, match="BF16 copies"):
        fp32_head_linear(torch.randn(3, 4), torch.randn(5, 4))


@pytest.mark.gpu
def test_on_a_gpu_the_bf16_tensor_core_gemms_stay_within_the_bound_of_the_exact_result():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    g = _gradient((512, 4096), "gpu")
    w = torch.randn(4096, 768, generator=torch.Generator().manual_seed(stable_seed("gpu-w"))).to(torch.bfloat16)
    exact = g.double() @ w.double()
    got = mm_split(split_bf16(g.cuda()), w.cuda()).cpu()
    assert ((got.double() - exact).abs() <= _bound(g, w, additions=2)).all()
    x = torch.randn(512, 768, generator=torch.Generator().manual_seed(stable_seed("gpu-x"))).to(torch.bfloat16)
    y = mm_float32(x.cuda(), w.cuda().t()).cpu()
    assert ((y.double() - x.double() @ w.double().t()).abs() <= _bound(x, w.t(), 0)).all()
