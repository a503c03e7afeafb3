"""The cached direct launch gives what the JIT launch gives, and keeps kernels apart that Triton
compiles apart (here: a 16-byte-aligned input and one that is not)."""

import pytest
import torch

from fp4repro.kernels import _quantize_launcher, quantize_2d
from fp4repro.kernels.launch import _arg_key
from fp4repro.quant import QuantSpec, reference_only, scaled_operand


def test_arg_key_separates_what_triton_specializes_on():
    assert _arg_key(16) != _arg_key(8)  # divisibility by 16
    assert _arg_key(1) != _arg_key(3)  # the value 1
    assert _arg_key(2**31) != _arg_key(2**31 - 16 * 2**20)  # int32 against int64
    x = torch.zeros(64)
    assert _arg_key(x) != _arg_key(x[1:])  # 16-byte alignment
    assert _arg_key(x) != _arg_key(x.to(torch.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1])
def test_direct_launch_equals_jit_and_reference(offset):
    launcher = _quantize_launcher()
    spec = QuantSpec(scale="ue5m3", rounding="sr")
    storage = torch.randn(256 * 512 + 1, device="cuda", dtype=torch.bfloat16) * 3
    x = storage[offset : offset + 256 * 512].view(256, 512)  # offset 1: 2 bytes past alignment
    amax = x.float().abs().max()
    first = quantize_2d(x, spec, amax=amax, seed=11)["qs"]  # compiles (or finds) through the JIT
    cached = len(launcher._compiled)
    second = quantize_2d(x, spec, amax=amax, seed=11)["qs"]  # the direct call
    assert len(launcher._compiled) == cached and launcher.direct
    launcher.direct = False
    try:
        jit = quantize_2d(x, spec, amax=amax, seed=11)["qs"]
    finally:
        launcher.direct = True
    assert torch.equal(first, second) and torch.equal(second, jit)
    rne = QuantSpec(scale="ue5m3")
    with reference_only():
        ref, *_ = scaled_operand(x.float(), rne, amax=amax)
    assert torch.equal(quantize_2d(x, rne, amax=amax)["qs"].float(), ref)


def test_launches_compile_without_fp_contraction():
    # bit-exactness with the reference must not depend on where LLVM would fuse a multiply into an
    # add: every launch passes enable_fp_fusion=False (here through the JIT, as a first launch does)
    from fp4repro.kernels.launch import Launcher

    seen = []

    class Jit:
        arg_names = ["x", "BLOCK"]

        @staticmethod
        def fn(x, BLOCK=4):
            pass

        def __getitem__(self, grid):
            return lambda *args, **options: seen.append(options)

    launcher = Launcher(Jit())
    launcher.direct = False
    launcher((1,), (torch.zeros(1),), (("BLOCK", 4),), 4)
    assert seen == [{"BLOCK": 4, "num_warps": 4, "enable_fp_fusion": False}]
