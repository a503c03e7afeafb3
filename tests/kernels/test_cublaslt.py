"""The cuBLASLt GEMM with a device alpha (``fp4repro.kernels.cublaslt``) against its definition:
round(float32(a · bᵀ) · α) with an FP32 accumulation (torch's FP32-output GEMM), the product by α
in float32, and one rounding to the output dtype.

Integer-valued operands whose products and sums are exact in FP32 make the accumulation order
irrelevant, so the two agree bit for bit whatever algorithm each GEMM runs; α with a full mantissa
then makes the epilogue's multiplication and rounding the thing compared. The layout of each
operand (row- or column-major, a leading dimension wider than the row) is checked on the CPU.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from fp4repro.kernels.cublaslt import _OP_N, _OP_T, alignment, column_major_operand, cublas_layout


def seeded(name: str, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(
        int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    )


def read_as_cublas(t: torch.Tensor, operand) -> torch.Tensor:
    """op(A) of the column-major matrix (rows, cols, ld) over t's storage, as cuBLAS reads it."""
    flat = torch.as_strided(t, (t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    stored = torch.as_strided(flat, (operand.rows, operand.cols), (1, operand.ld), t.storage_offset())
    return stored.t() if operand.op == _OP_T else stored


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x,  # row-major
        lambda x: x.t().contiguous().t(),  # column-major: a transposed view
        lambda x: torch.cat([x, x], dim=1)[:, : x.shape[1]],  # row-major, ld wider than a row
        lambda x: torch.cat([x, x], dim=0).t().contiguous().t()[: x.shape[0]],  # column-major, ld wider than a column
        lambda x: x[:1],  # one row
        lambda x: x[:, :1],  # one column
        lambda x: torch.as_strided(x, (1, 10), (7, 1)),  # one row, an unused odd stride
        lambda x: torch.as_strided(x, (6, 1), (1, 7)),  # one column, an unused odd stride
    ],
    ids=["row", "column", "row_ld", "column_ld", "one_row", "one_column", "one_row_odd", "one_column_odd"],
)
def test_column_major_operand_reads_the_transposed_matrix(make):
    x = torch.arange(6 * 10, dtype=torch.float32).reshape(6, 10)
    t = make(x)
    operand = column_major_operand(t)
    assert operand is not None and operand.op in (_OP_N, _OP_T)
    assert operand.ld >= operand.rows
    assert torch.equal(read_as_cublas(t, operand), t.t())


@pytest.mark.parametrize("a_columns", [False, True], ids=["a_row", "a_column"])
@pytest.mark.parametrize("b_columns", [False, True], ids=["b_row", "b_column"])
def test_the_column_major_product_of_the_layout_is_the_row_major_out(a_columns, b_columns):
    # D = op(A) · op(B) as cuBLAS computes it from the two storages, stored column-major with
    # ld = ldd, must be out = a · bᵀ read row-major
    g = seeded(f"layout-{a_columns}-{b_columns}")
    a = torch.randint(-8, 9, (5, 7), generator=g).double()
    b = torch.randint(-8, 9, (3, 7), generator=g).double()
    a = a.t().contiguous().t() if a_columns else a
    b = b.t().contiguous().t() if b_columns else b
    layout = cublas_layout(a, b)
    d = read_as_cublas(b, layout.a) @ read_as_cublas(a, layout.b)
    assert d.shape == (layout.m, layout.n) and layout.ldd >= layout.m
    out = torch.empty(a.shape[0] * b.shape[0], dtype=d.dtype)
    torch.as_strided(out, d.shape, (1, layout.ldd)).copy_(d)
    assert torch.equal(out.reshape(a.shape[0], b.shape[0]), a @ b.t())


def test_the_alignment_is_the_largest_power_of_two_dividing_address_and_leading_dimension():
    storage = torch.empty(4096 + 128, dtype=torch.bfloat16)
    base = storage[(-storage.data_ptr() % 256) // 2 :]  # starts at a 256-byte boundary
    assert base.data_ptr() % 256 == 0
    assert alignment(base, 4096) == 256
    assert alignment(base[8:], 4096) == 16  # 16 bytes past an aligned address
    assert alignment(base[1:], 4096) == 2
    assert alignment(base, 40) == 16  # a leading dimension of 80 bytes
    assert alignment(base, 41) == 2
    assert alignment(base[:4096].view(torch.float32), 64) == 256  # 4-byte elements: a 256-byte row


def test_column_major_operand_refuses_a_matrix_with_no_unit_stride():
    x = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    assert column_major_operand(x[:, ::2]) is None
    assert column_major_operand(x[:1].expand(6, 10)) is None  # a broadcast row: stride 0


def integer_operand(rows: int, k: int, name: str, column_major: bool) -> torch.Tensor:
    """Integers in [-8, 8] in BF16: every product and partial sum over k <= 2^17 is exact in FP32."""
    x = torch.randint(-8, 9, (rows, k), generator=seeded(name, "cuda"), device="cuda").to(torch.bfloat16)
    return x.t().contiguous().t() if column_major else x


def by_definition(a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    acc = torch.mm(a, b.t(), out_dtype=torch.float32)
    return (acc * alpha).to(out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("a_columns", [False, True], ids=["a_row", "a_column"])
@pytest.mark.parametrize("b_columns", [False, True], ids=["b_row", "b_column"])
@pytest.mark.parametrize(
    "shape",
    # wide, tall, a wgrad's small output over a long K (where split-K pays: its partial sums must
    # stay FP32), a K of odd length (2-byte leading dimensions)
    [(512, 768, 1024), (8192, 256, 4096), (96, 64, 8192), (64, 128, 65536), (1000, 24, 40), (64, 48, 41)],
)
def test_device_alpha_gemm_equals_the_fp32_epilogue_bit_for_bit(shape, a_columns, b_columns, out_dtype):
    from fp4repro.kernels.cublaslt import mm_device_alpha

    m, n, k = shape
    name = f"{shape}-{a_columns}-{b_columns}"
    a = integer_operand(m, k, "a" + name, a_columns).to(out_dtype)
    b = integer_operand(n, k, "b" + name, b_columns).to(out_dtype)
    for alpha in (0.37109375 / 3, 1 / 2688.0, 2.0**-20 * 1.3, 3.3e-5, 1.0, 1e-30):
        alpha = torch.tensor(alpha, dtype=torch.float32, device="cuda")
        got = mm_device_alpha(a, b, alpha, out_dtype)
        assert got.dtype == out_dtype and got.shape == (m, n) and got.is_contiguous()
        assert torch.equal(got, by_definition(a, b, alpha, out_dtype)), (shape, float(alpha))


@pytest.mark.gpu
def test_device_alpha_gemm_takes_offset_views_a_second_stream_and_ignores_the_output_memory():
    # an operand view 2 bytes past an aligned address; output memory reused from a NaN-filled
    # tensor (beta = 0: never read); a side stream with a workspace of its own
    from fp4repro.kernels.cublaslt import mm_device_alpha

    base = integer_operand(257, 512, "offset-a", False)
    a, b = base[1:], integer_operand(384, 512, "offset-b", True)
    alpha = torch.tensor(0.3, device="cuda")
    expected = by_definition(a, b, alpha, torch.bfloat16)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            nan = torch.full((256, 384), float("nan"), dtype=torch.bfloat16, device="cuda")
            del nan  # its block is the next (256, 384) BF16 tensor's on this stream
            got = mm_device_alpha(a, b, alpha, torch.bfloat16)
        torch.cuda.current_stream().wait_stream(stream)
        assert torch.equal(got, expected)


@pytest.mark.gpu
def test_device_alpha_gemm_reads_alpha_when_it_runs():
    # the value at launch time is the one used (a device read, not a copy taken at the call)
    from fp4repro.kernels.cublaslt import mm_device_alpha

    a = integer_operand(256, 512, "late-a", False)
    b = integer_operand(128, 512, "late-b", False)
    alpha = torch.tensor(0.25, device="cuda")
    first = mm_device_alpha(a, b, alpha, torch.bfloat16)
    alpha.fill_(0.125)
    second = mm_device_alpha(a, b, alpha, torch.bfloat16)
    assert torch.equal(first, by_definition(a, b, torch.tensor(0.25, device="cuda"), torch.bfloat16))
    assert torch.equal(second, by_definition(a, b, alpha, torch.bfloat16))


@pytest.mark.gpu
def test_emulated_gemm_takes_current_scales_in_the_gemm_epilogue(monkeypatch):
    # current (device) decode scales: one cuBLASLt GEMM, no FP32 output and no scale-and-cast pass
    import fp4repro.kernels as kernels
    import fp4repro.kernels.cublaslt as cublaslt
    from fp4repro.kernels.cublaslt import mm_device_alpha
    from fp4repro.quant.gemm import emulated_gemm

    monkeypatch.setattr(kernels, "scale_cast", lambda *args: pytest.fail("scale_cast ran"))
    calls = []
    monkeypatch.setattr(cublaslt, "mm_device_alpha", lambda *args: calls.append(1) or mm_device_alpha(*args))
    a = integer_operand(512, 1024, "front-a", False)
    b = integer_operand(768, 1024, "front-b", True)
    da, db = torch.tensor(0.37109375 / 3, device="cuda"), torch.tensor(1 / 2688.0, device="cuda")
    got = emulated_gemm(a, da, b, db, torch.bfloat16)
    assert calls == [1]
    assert torch.equal(got, by_definition(a, b, da * db, torch.bfloat16))


@pytest.mark.gpu
def test_device_alpha_gemm_refuses_what_it_does_not_compute():
    from fp4repro.kernels.cublaslt import mm_device_alpha

    a = torch.ones(16, 32, dtype=torch.bfloat16, device="cuda")
    alpha = torch.tensor(1.0, device="cuda")
    with pytest.raises(TypeError, match="of one dtype"):
        mm_device_alpha(a.float(), a.float(), alpha, torch.bfloat16)
    with pytest.raises(TypeError, match="of one dtype"):
        mm_device_alpha(a, a, alpha, torch.float16)
    with pytest.raises(TypeError, match="one float32 value"):
        mm_device_alpha(a, a, alpha.double(), torch.bfloat16)
    with pytest.raises(ValueError, match="inner dimensions"):
        mm_device_alpha(a, a[:, :16], alpha, torch.bfloat16)
