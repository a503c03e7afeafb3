"""One cuBLASLt GEMM whose alpha is read from device memory: the ``fp32`` GEMM model's epilogue
inside the GEMM.

The ``fp32`` GEMM model (``fp4repro.quant.gemm.emulated_gemm``) computes, for BF16 operands a
(M, K) and b (N, K) and a float32 scalar α = d_a·d_b::

    out = round_to_out_dtype(float32(acc) · α),    acc = a · bᵀ accumulated in FP32

Under current scaling α is computed on the device every step. torch takes a GEMM's alpha only as a
host number (``addmm``), which would need a device-to-host read per GEMM, and its device-scaled
GEMM (``torch._scaled_mm``) only FP8/FP4 operands; so the product used to be taken with an FP32
output and scaled by a second kernel (``scale_cast``): 4 bytes written, then 4 read and 2
written again, per output element. cuBLASLt's pointer mode DEVICE reads α (and β = 0) from
device memory in the GEMM's own epilogue, which multiplies the FP32 accumulator by α in FP32 and
rounds once to the output dtype: the same arithmetic, one pass.

The binding goes through ctypes to the cuBLASLt library torch itself loaded (no build step, the
same library as torch's own GEMMs). Each shape, layout and alignment gets its descriptors and
algorithm once (cuBLASLt's heuristic, first choice, as torch's GEMMs take it), so a shape runs
the same algorithm every time. ``loaded()`` says whether the library is there; callers fall
back to the FP32 output and ``scale_cast`` where it is not.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from typing import NamedTuple

import torch

_SUCCESS = 0
_COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F
_CUDA_TYPES = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 14}  # cudaDataType
_OP_N, _OP_T = 0, 1  # cublasOperation_t
_DESC_POINTER_MODE, _DESC_TRANSA, _DESC_TRANSB = 2, 3, 4  # cublasLtMatmulDescAttributes_t
_POINTER_MODE_DEVICE = 1  # alpha and beta: one value each, in device memory
# cublasLtMatmulPreferenceAttributes_t
_PREF_MAX_WORKSPACE_BYTES, _PREF_REDUCTION_SCHEME_MASK, _PREF_MIN_ALIGNMENT = 1, 3, {"a": 5, "b": 6, "c": 7, "d": 8}
#: split-K partial sums only in the compute type (FP32) or no split: the other schemes (in place,
#: output type) would add BF16 partials, no longer one FP32 accumulation rounded once
_REDUCTION_SCHEMES = 2  # CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE (| NONE, 0)
WORKSPACE_BYTES = 32 * 2**20  # torch's cuBLAS workspace on Hopper; split-K algorithms need one


class _HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t; ``algo`` (cublasLtMatmulAlgo_t, 8 uint64) comes first."""

    _fields_ = [
        ("algo", ctypes.c_uint64 * 8),
        ("workspace_size", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves_count", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


_P = ctypes.c_void_p
_SIGNATURES = {
    "cublasLtCreate": [ctypes.POINTER(_P)],
    "cublasLtMatmulDescCreate": [ctypes.POINTER(_P), ctypes.c_int, ctypes.c_int],
    "cublasLtMatmulDescSetAttribute": [_P, ctypes.c_int, _P, ctypes.c_size_t],
    "cublasLtMatrixLayoutCreate": [ctypes.POINTER(_P), ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
    "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(_P)],
    "cublasLtMatmulPreferenceSetAttribute": [_P, ctypes.c_int, _P, ctypes.c_size_t],
    "cublasLtMatmulPreferenceDestroy": [_P],
    "cublasLtMatmulAlgoGetHeuristic": [_P] * 7
    + [ctypes.c_int, ctypes.POINTER(_HeuristicResult), ctypes.POINTER(ctypes.c_int)],
    "cublasLtMatmul": [_P] * 14 + [ctypes.c_size_t, _P],
}


def _loaded_library_path(prefix: str) -> str | None:
    """The path of the shared library named ``prefix*`` this process has mapped (Linux), if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.rstrip("\n").split(maxsplit=5)  # address perms offset dev inode [path]
                if len(fields) == 6 and fields[5].rpartition("/")[2].startswith(prefix):
                    return fields[5]
    except OSError:
        return None
    return None


@functools.cache
def _library() -> ctypes.CDLL | None:
    """torch's cuBLASLt with the signatures this module calls, or None (no CUDA torch, no Linux)."""
    if not torch.cuda.is_available():
        return None
    path = _loaded_library_path("libcublasLt.so")
    if path is None:  # torch loads it with its first GEMM
        torch.mm(torch.ones(8, 8, device="cuda"), torch.ones(8, 8, device="cuda"))
        path = _loaded_library_path("libcublasLt.so")
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    for name, argtypes in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
    return lib


def loaded() -> bool:
    """Whether the cuBLASLt that torch uses can be called here (CUDA torch on Linux)."""
    return _library() is not None


def _check(status: int, call: str) -> None:
    if status != _SUCCESS:
        raise RuntimeError(f"cuBLASLt: {call} returned cublasStatus_t {status}")


_handles = threading.local()  # one handle per thread and device: autograd's backward has a thread of its own


def _handle(device: int) -> _P:
    per_device = getattr(_handles, "by_device", None)
    if per_device is None:
        per_device = _handles.by_device = {}
    if device not in per_device:
        handle = _P()
        with torch.cuda.device(device):
            _check(_library().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
        per_device[device] = handle
    return per_device[device]


@functools.cache
def _zero(device: int) -> torch.Tensor:
    """β = 0, a float32 scalar in the device's memory (pointer mode DEVICE reads β there too); the
    fill is waited for, since GEMMs on any stream read it."""
    zero = torch.zeros((), dtype=torch.float32, device=torch.device("cuda", device))
    torch.cuda.synchronize(device)
    return zero


@functools.cache
def _workspace(device: int, stream: int) -> torch.Tensor:
    """The workspace of GEMMs on one stream (as torch keeps one per stream: two streams' GEMMs may
    overlap), allocated by the first GEMM there; a CUDA-graph capture's warm-up run makes it
    outside the capture."""
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=torch.device("cuda", device))


class _Operand(NamedTuple):
    """A matrix as cuBLAS's column-major operand: op (N or T), its stored rows, cols and ld."""

    op: int
    rows: int
    cols: int
    ld: int


def column_major_operand(t: torch.Tensor) -> _Operand | None:
    """How cuBLAS (column-major) reads the row-major matrix t (R, C) as op(A) of shape (C, R) —
    that is, tᵀ: a row-major t is a column-major (C, R) matrix with ld = stride(0), taken as is
    (N); a column-major t (stride(0) == 1, a transposed view) is taken transposed (T). None where
    neither stride is 1 (the caller makes such a tensor contiguous). The stride of a dimension of
    size 1 is never used, whatever it is (torch calls such a tensor contiguous)."""
    rows, cols = t.shape
    s0, s1 = t.stride()
    s0, s1 = (max(cols, 1) if rows == 1 else s0), (1 if cols == 1 else s1)
    if s1 == 1 and s0 >= max(cols, 1):
        return _Operand(_OP_N, cols, rows, max(s0, 1))
    if s0 == 1 and s1 >= max(rows, 1):
        return _Operand(_OP_T, rows, cols, max(s1, 1))
    return None


def alignment(t: torch.Tensor, ld: int) -> int:
    """The largest power of two up to 256 bytes that divides both t's address and its leading
    dimension in bytes: what cuBLASLt's algorithm may assume of the matrix (the lowest set bit of
    the three ORed together)."""
    bits = t.data_ptr() | (ld * t.element_size()) | 256
    return bits & -bits


class Layout(NamedTuple):
    """out (M, N) = a (M, K) · b (N, K)ᵀ as cuBLAS's column-major D (m, n) = op(A) · op(B): D is
    outᵀ (m = N, n = M, ld = N, the row-major out as it is), A is read from b (op(A) = b) and B
    from a (op(B) = aᵀ)."""

    a: _Operand
    b: _Operand
    m: int
    n: int
    ldd: int


def cublas_layout(a: torch.Tensor, b: torch.Tensor) -> Layout | None:
    """The layout of ``a · bᵀ`` (``Layout``), None where an operand has no unit stride."""
    a_op, b_op = column_major_operand(b.t()), column_major_operand(a)
    if a_op is None or b_op is None:
        return None
    return Layout(a_op, b_op, b.shape[0], a.shape[0], max(b.shape[0], 1))


class _Plan(NamedTuple):
    desc: _P
    layouts: tuple[_P, _P, _P]  # A, B, D (C = D: β = 0)
    algo: _HeuristicResult


_plans: dict[tuple, _Plan] = {}
_plans_lock = threading.Lock()


def _plan(key: tuple) -> _Plan:
    device, dtype, (a_op, b_op, m, n, ldd), alignments = key
    lib = _library()
    desc = _P()
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _CUDA_TYPES[torch.float32]), "DescCreate")
    for attribute, value in (
        (_DESC_POINTER_MODE, _POINTER_MODE_DEVICE),
        (_DESC_TRANSA, a_op.op),
        (_DESC_TRANSB, b_op.op),
    ):
        v = ctypes.c_int32(value)
        _check(lib.cublasLtMatmulDescSetAttribute(desc, attribute, ctypes.byref(v), 4), "DescSetAttribute")
    layouts = []
    for cuda_type, rows, cols, ld in (
        (_CUDA_TYPES[dtype], a_op.rows, a_op.cols, a_op.ld),
        (_CUDA_TYPES[dtype], b_op.rows, b_op.cols, b_op.ld),
        (_CUDA_TYPES[dtype], m, n, ldd),
    ):
        layout = _P()
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), cuda_type, rows, cols, ld), "LayoutCreate")
        layouts.append(layout)
    preference = _P()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "PreferenceCreate")
    try:
        workspace = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(
            lib.cublasLtMatmulPreferenceSetAttribute(preference, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(workspace), 8),
            "PreferenceSetAttribute",
        )
        schemes = ctypes.c_uint32(_REDUCTION_SCHEMES)
        _check(
            lib.cublasLtMatmulPreferenceSetAttribute(preference, _PREF_REDUCTION_SCHEME_MASK, ctypes.byref(schemes), 4),
            "PreferenceSetAttribute",
        )
        for name, alignment in zip("abcd", alignments, strict=True):
            v = ctypes.c_uint32(alignment)
            _check(
                lib.cublasLtMatmulPreferenceSetAttribute(preference, _PREF_MIN_ALIGNMENT[name], ctypes.byref(v), 4),
                "PreferenceSetAttribute",
            )
        algo, found = _HeuristicResult(), ctypes.c_int(0)
        a_layout, b_layout, d_layout = layouts
        with torch.cuda.device(device):
            _check(
                lib.cublasLtMatmulAlgoGetHeuristic(
                    _handle(device),
                    desc,
                    a_layout,
                    b_layout,
                    d_layout,
                    d_layout,
                    preference,
                    1,
                    ctypes.byref(algo),
                    ctypes.byref(found),
                ),
                "AlgoGetHeuristic",
            )
    finally:
        lib.cublasLtMatmulPreferenceDestroy(preference)
    if found.value < 1 or algo.state != _SUCCESS:
        raise RuntimeError(f"cuBLASLt has no algorithm for {key}")
    return _Plan(desc, tuple(layouts), algo)


def mm_device_alpha(a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """round_to_out_dtype(float32(a · bᵀ) · α) in one cuBLASLt GEMM (FP32 accumulation, FP32
    epilogue), α read from device memory.

    a: (M, K), b: (N, K), CUDA tensors of out_dtype (BF16 or FP16), each row- or column-major
    (else copied contiguous); alpha: a float32 CUDA scalar on their device. Returns a contiguous
    (M, N) tensor of out_dtype (``cublas_layout``: no transposition).
    """
    if a.dtype != out_dtype or b.dtype != out_dtype or out_dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(
            f"mm_device_alpha takes BF16 or FP16 operands and output of one dtype, "
            f"got {a.dtype}, {b.dtype} -> {out_dtype}"
        )
    if alpha.dtype != torch.float32 or alpha.numel() != 1 or alpha.device != a.device or b.device != a.device:
        raise TypeError("mm_device_alpha: alpha must be one float32 value on the operands' device")
    (m, k), (n, k_b) = a.shape, b.shape
    if k != k_b:
        raise ValueError(f"mm_device_alpha: inner dimensions differ, a {tuple(a.shape)} and b {tuple(b.shape)}")
    layout = cublas_layout(a, b)
    if layout is None:  # an operand with no unit stride: made contiguous
        a = a if column_major_operand(a) is not None else a.contiguous()
        b = b if column_major_operand(b.t()) is not None else b.contiguous()
        layout = cublas_layout(a, b)
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if out.numel() == 0 or k == 0:
        return out.zero_()
    device = a.device.index if a.device.index is not None else torch.cuda.current_device()
    out_alignment = alignment(out, layout.ldd)
    key = (
        device,
        out_dtype,
        layout,
        (alignment(b, layout.a.ld), alignment(a, layout.b.ld), out_alignment, out_alignment),
    )
    plan = _plans.get(key)
    if plan is None:
        with _plans_lock:
            plan = _plans.get(key) or _plans.setdefault(key, _plan(key))
    stream = torch.cuda.current_stream(a.device).cuda_stream
    workspace = _workspace(device, stream)
    on_device = contextlib.nullcontext() if torch.cuda.current_device() == device else torch.cuda.device(device)
    with on_device:
        _launch(plan, device, alpha, a, b, out, workspace, stream)
    return out


def _launch(plan: _Plan, device: int, alpha, a, b, out, workspace, stream: int) -> None:
    """One cublasLtMatmul of ``plan`` on ``stream`` (cuBLAS's A from b, B from a, C = D = out)."""
    a_layout, b_layout, d_layout = plan.layouts
    _check(
        _library().cublasLtMatmul(
            _handle(device),
            plan.desc,
            alpha.data_ptr(),
            b.data_ptr(),
            a_layout,
            a.data_ptr(),
            b_layout,
            _zero(device).data_ptr(),
            out.data_ptr(),
            d_layout,
            out.data_ptr(),
            d_layout,
            ctypes.addressof(plan.algo),
            workspace.data_ptr(),
            WORKSPACE_BYTES,
            stream,
        ),
        "cublasLtMatmul",
    )
