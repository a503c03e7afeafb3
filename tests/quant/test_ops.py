"""The front that picks kernel or reference: the switch that forces the reference."""

import os
import subprocess
import sys
import threading

import pytest
import torch

from fp4repro.quant import QuantSpec, quantize, reference_only, scaled_operand
from fp4repro.quant.ops import _force_reference, operand_amaxes, operand_amaxes_and_bf16, uses_kernel


@pytest.fixture
def unforced():
    """The switch as it is without FP4REPRO_REFERENCE in the environment."""
    token = _force_reference.set(False)
    yield
    _force_reference.reset(token)


def test_reference_only_is_scoped_and_restored_after_an_error(unforced):
    assert not _force_reference.get()
    with reference_only():
        assert _force_reference.get()
        with reference_only():
            assert _force_reference.get()
        assert _force_reference.get()
    assert not _force_reference.get()
    with pytest.raises(RuntimeError):
        with reference_only():
            raise RuntimeError
    assert not _force_reference.get()


def test_reference_only_holds_for_this_thread_only(unforced):
    seen = []
    with reference_only():
        thread = threading.Thread(target=lambda: seen.append(_force_reference.get()))
        thread.start()
        thread.join()
    assert seen == [_force_reference.get()] == [False]


@pytest.mark.parametrize("value, forced", [("1", True), ("0", False), ("", False)])
def test_environment_variable_forces_the_reference(value, forced):
    out = subprocess.run(
        [sys.executable, "-c", "from fp4repro.quant.ops import _force_reference; print(_force_reference.get())"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "FP4REPRO_REFERENCE": value},
    ).stdout.strip()
    assert out == str(forced)


def test_cpu_tensors_take_the_reference_and_packing_needs_4_bit_elements(unforced):
    assert not uses_kernel(torch.randn(4, 32))
    with pytest.raises(ValueError, match="packed codes need a 4-bit element format, got 'e3m2'"):
        quantize(torch.randn(4, 32), QuantSpec(element="e3m2"))


@pytest.mark.gpu
def test_cuda_tensors_take_the_kernel_unless_the_reference_is_forced(unforced):
    x = torch.randn(512, 1024, device="cuda") * 3
    spec = QuantSpec(block=(16, 16), rht=True)
    assert uses_kernel(x) and not uses_kernel(x, generator=torch.Generator(device="cuda"))
    assert not uses_kernel(x, rand=torch.zeros_like(x))
    fast, d1, *_ = scaled_operand(x, spec)
    with reference_only():
        assert not uses_kernel(x)
        ref, d2, *_ = scaled_operand(x, spec)
    assert torch.equal(fast.float(), ref) and torch.equal(d1, d2)


#: An operand's specs as the recipes write them: 1x16 E4M3 (NVFP4), UE5M3 with a tensor scale,
#: 16x16 tiles with the RHT, and UE8M0 powers of two (MXFP4); round to nearest even throughout.
OUT_DTYPE_SPECS = (
    QuantSpec(),
    QuantSpec(scale="ue5m3"),
    QuantSpec(block=(16, 16), rht=True),
    QuantSpec(scale="ue8m0", block=(1, 32), target=None, scale_rounding="up"),
)


def _operand_values(shape: tuple[int, int], device: str = "cpu") -> torch.Tensor:
    """Values over many binades (blocks of very different scales), seeded from the shape."""
    g = torch.Generator().manual_seed(20261207 + shape[0] * 7919 + shape[1])
    x = torch.randn(shape, generator=g) * torch.exp(3 * torch.randn(shape, generator=g))
    return x.to(device)


@pytest.mark.parametrize("spec", OUT_DTYPE_SPECS, ids=str)
def test_the_reference_writes_the_operand_in_the_asked_dtype_with_its_values(unforced, spec):
    x = _operand_values((64, 128))
    wide = scaled_operand(x, spec)
    narrow = scaled_operand(x, spec, out_dtype=torch.bfloat16)
    assert wide.qs.dtype == torch.float32 and narrow.qs.dtype == torch.bfloat16
    # q · s_b of FP4 elements and these scales holds in BF16: the same values, and the same d
    assert torch.equal(narrow.qs.float(), wide.qs) and torch.equal(narrow.d, wide.d)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", OUT_DTYPE_SPECS, ids=str)
@pytest.mark.parametrize("columnwise", [False, True], ids=["rows", "columns"])
def test_the_kernel_writes_a_bf16_operand_of_a_float32_tensor_with_the_references_values(unforced, spec, columnwise):
    # the kernel's own output dtype against the reference in float32, a column-major view (the
    # wgrad operands) as well as a row-major tensor
    x = _operand_values((512, 1024), "cuda")
    x = x.t().contiguous().t() if columnwise else x
    fast = scaled_operand(x, spec, out_dtype=torch.bfloat16)
    with reference_only():
        ref = scaled_operand(x, spec)
    assert fast.qs.dtype == torch.bfloat16
    assert torch.equal(fast.qs.float(), ref.qs) and torch.equal(fast.d, ref.d)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_operand_amaxes_are_each_operands_own(device):
    # fprop.x (1x16, no RHT) of X and wgrad.x of Xᵀ: without the RHT one amax serves both (the
    # same elements); with it each is its operand's, from the kernel's one read on a GPU
    from fp4repro.reference.block import operand_amax_reference

    x = (torch.randn(48, 80, generator=torch.Generator().manual_seed(3)) * 5).to(torch.bfloat16)
    x[7, 9] = -300.0
    row, plain, rht = QuantSpec(), QuantSpec(rounding="sr"), QuantSpec(rounding="sr", rht=True)
    a, b = operand_amaxes(x.to(device), row, plain)
    assert a is b and float(a) == 300.0
    a, b = operand_amaxes(x.to(device), row, rht)
    assert torch.equal(a.cpu(), operand_amax_reference(x, row))
    assert torch.equal(b.cpu(), operand_amax_reference(x.t(), rht)) and float(b) < 300.0
    with pytest.raises(ValueError, match="row-wise spec takes no RHT"):
        operand_amaxes(x.to(device), rht, rht)


def test_operand_amaxes_take_the_kernel_for_a_row_major_tensor_only(monkeypatch):
    # the one-read kernel (here in Triton's interpreter, as the front would call it for a CUDA
    # tensor) for a row-major X; a contiguous (rows, 1) view whose column stride is not 1 (dY of a
    # linear with one output) is taken by the separate passes instead of refused by the kernel
    import fp4repro.kernels as kernels
    import fp4repro.quant.ops as ops
    from fp4repro.reference.block import operand_amax_reference

    reads = []
    original = kernels.operand_amax_with_rht_triton
    monkeypatch.setattr(kernels, "operand_amax_with_rht_triton", lambda x: reads.append(x.shape) or original(x))
    monkeypatch.setattr(ops, "uses_kernel", lambda x, *args: True)
    row, rht = QuantSpec(), QuantSpec(rounding="sr", rht=True)
    x = (torch.randn(48, 80, generator=torch.Generator().manual_seed(4)) * 5).to(torch.bfloat16)
    column = torch.randn(3, 1, 16, generator=torch.Generator().manual_seed(5)).transpose(1, 2).reshape(-1, 1)
    assert column.is_contiguous() and column.stride(1) != 1
    for t in (x, column.to(torch.bfloat16)):
        a, b = operand_amaxes(t, row, rht)
        assert torch.equal(a, operand_amax_reference(t, row)) and torch.equal(b, operand_amax_reference(t.t(), rht))
    assert reads == [(48, 80)]


def test_operand_amaxes_and_bf16_take_the_kernel_for_a_row_major_tensor_with_the_rht_only(monkeypatch):
    # a float32 X: its amax, its BF16 cast's transposed amax and the cast, from the one-read kernel
    # (Triton's interpreter, as the front would call it for a CUDA tensor) where wgrad's spec has
    # the RHT and X lies row by row; else the cast and each amax's own pass, the same values
    import fp4repro.kernels as kernels
    import fp4repro.quant.ops as ops
    from fp4repro.reference.block import operand_amax_reference

    reads = []
    original = kernels.operand_amax_with_rht_and_bf16_triton
    monkeypatch.setattr(
        kernels, "operand_amax_with_rht_and_bf16_triton", lambda x: reads.append(x.shape) or original(x)
    )
    monkeypatch.setattr(ops, "uses_kernel", lambda x, *args: True)
    row, plain, rht = QuantSpec(), QuantSpec(rounding="sr"), QuantSpec(rounding="sr", rht=True)
    x = torch.randn(48, 80, generator=torch.Generator().manual_seed(6)) * 5
    x[7, 9] = -(300.0 + 2.0**-7)  # the largest |x|: its BF16 cast rounds down to 300 (BF16's step is 2 there)
    for t, col in ((x, rht), (x, plain), (x.t().contiguous().t(), rht)):
        a, b, c = operand_amaxes_and_bf16(t, row, col)
        assert torch.equal(c, t.to(torch.bfloat16)) and c.dtype == torch.bfloat16
        assert torch.equal(a, operand_amax_reference(t, row)) and float(a) > 300.0
        assert torch.equal(b, operand_amax_reference(c.t(), col))
    assert float(operand_amaxes_and_bf16(x, row, plain)[1]) == 300.0
    assert reads == [(48, 80)]
    with pytest.raises(ValueError, match="row-wise spec takes no RHT"):
        operand_amaxes_and_bf16(x, rht, rht)
