"""Triton kernels with the exact semantics of the torch reference (``fp4repro.reference``).

A leaf below the front: this package knows nothing of when it is used. ``fp4repro.quant``
dispatches CUDA tensors here when Triton imports (and the reference is not forced); the
kernels take their geometry and the RHT sign vector from the reference they must equal. Under
``TRITON_INTERPRET=1`` the same kernels run on CPU tensors, which is how ``make test`` checks
them without a GPU.
"""

from __future__ import annotations

import functools
import importlib.util  # find_spec only (available()): whether triton is installed, without importing it
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from fp4repro.config.spec import QuantSpec
from fp4repro.formats import get_format
from fp4repro.reference.block import clip_threshold, float32_fields, scales_from_amax_bits
from fp4repro.reference.geometry import padded_shape
from fp4repro.reference.rht import TE_SIGNS

SIGN_BITS = sum(1 << i for i, s in enumerate(TE_SIGNS) if s < 0)


@functools.cache
def available() -> bool:
    """Triton importable (CUDA tensors use it; CPU tensors only under TRITON_INTERPRET=1)."""
    # find_spec, not an import: it asks whether triton is there without importing it (see below)
    return importlib.util.find_spec("triton") is not None


def _columnwise(shape: tuple[int, int], strides: tuple[int, int]) -> bool:
    """A column-major matrix without overlap (memory runs down the rows), as wgrad passes the
    transposed views Xᵀ and dYᵀ. Broadcast strides (0) are not: such a tensor is made contiguous."""
    return strides[0] == 1 and strides[1] >= max(shape[0], 2) and shape[1] > 1


def _tiles(spec: QuantSpec, columnwise: bool) -> tuple[int, int, int]:
    """(TILE_R, TILE_C, num_warps), tiles long along the axis that is contiguous in memory. Chosen
    by sweeps on an H200 (8192x8192 BF16, throughput as a fraction of a BF16 copy): row-major
    16x128 with 4 warps, the fastest for RNE (taller tiles and 8 warps were slower; SR, then
    rounded by floor/compare, hardly depended on the tile); column-wise 1024x16, but 512x16 with
    SR or RHT, whose registers per thread the larger tile raises until it is the slower one. The
    sweeps are not kept under results/bench (their numbers were in this docstring up to a6e0508);
    the chosen tiles' throughput is ``fp4repro bench kernels``'s (results/bench/kernels_h200.json)."""
    rows_block, cols_block = spec.block
    if columnwise:
        return (512 if spec.stochastic or spec.rht else 1024), max(16, cols_block), 4
    return max(16, rows_block), 128, 4


@functools.cache
def _launch_args(spec: QuantSpec) -> dict:
    """The constexprs a spec fixes, all derived from its formats (``get_format``) and fields. The
    constexprs of the newer options (stochastic_fast, zero_scale "one", MX scales from the amax
    bits) are passed only when set: other specs compile to the same kernels as before them."""
    element, scale = get_format(spec.element), get_format(spec.scale)
    extra = {}
    if spec.rounding == "stochastic_fast":
        extra.update(SR_FAST=True)
    if spec.zero_scale == "one":
        extra.update(ZERO_ONE=True)
    if scales_from_amax_bits(spec):
        field, mantissa = float32_fields(element.max)
        extra.update(S_FROM_BITS=True, E_MAX_FIELD=field, E_MAX_MANT=mantissa, S_EMAX=scale.emax)
    return dict(
        RHT=spec.rht,
        SIGN_BITS=SIGN_BITS,
        SR=spec.stochastic,
        HAS_TARGET=spec.target is not None,
        E_EMIN=element.emin,
        E_MAN=element.man_bits,
        E_MAX=float(element.max),
        E_BIAS=element.bias,
        S_EMIN=scale.emin,
        S_MAN=scale.man_bits,
        S_MAX=float(scale.max),
        S_MIN_POS=float(scale.min_positive),
        S_HAS_ZERO=scale.has_zero,
        S_BIAS=scale.bias,
        S_NAN_CODE=scale.nan_code,
        S_ROUND_UP=spec.scale_rounding == "up",
        S_OVERFLOW=float(scale.overflow_threshold(spec.scale_rounding)),
        E_CLIP=clip_threshold(element, spec.rounding),
        **extra,
    )


@functools.lru_cache(maxsize=4096)
def emax_target(emax: float, target: float | None) -> float:
    """Emax·T as the float32 value the kernel's runtime argument carries (1.0 without a target):
    float32(Emax · T), the product rounded once from double as the reference's
    ``global_encode_scale`` rounds it (torch.full(..., dtype=float32)). The Python float returned
    is that float32 exactly, so passing it to the kernel converts nothing."""
    if target is None:
        return 1.0
    return float(torch.tensor(emax * float(target), dtype=torch.float32))


@functools.cache
def _launcher(kernel):
    """The ``Launcher`` of the Triton kernel ``kernel`` (a ``@triton.jit`` function of this package:
    one Launcher, and one cache of compiled kernels, per kernel)."""
    from fp4repro.kernels.launch import Launcher

    return Launcher(kernel)


# One cached accessor per kernel. The kernel modules import triton when they are imported, so they
# are imported here, at a kernel's first launch, and not with this package: ``fp4repro.quant``
# imports this package on every path, also where Triton is not installed (it is Linux-only), and
# TRITON_INTERPRET must be set before triton is first imported (tests/conftest.py sets it).
@functools.cache
def _quantize_launcher():
    from fp4repro.kernels import quantize

    return _launcher(quantize._quantize_kernel)


@functools.cache
def _amax_launcher():
    from fp4repro.kernels import quantize

    return _launcher(quantize._amax_kernel)


@functools.cache
def _amax_with_rht_launcher():
    from fp4repro.kernels import quantize

    return _launcher(quantize._amax_with_rht_kernel)


@functools.cache
def _scale_cast_launcher():
    from fp4repro.kernels import quantize

    return _launcher(quantize._scale_cast_kernel)


@functools.cache
def _philox_uniform_launcher():
    from fp4repro.kernels import quantize

    return _launcher(quantize._philox_uniform_kernel)


@functools.cache
def _probe_matched_gemm_launcher():
    from fp4repro.kernels import gemm

    return _launcher(gemm._probe_matched_gemm_kernel)


@functools.cache
def _split_bf16_launcher():
    from fp4repro.kernels import split

    return _launcher(split._split_bf16_kernel)


@functools.cache
def _saturating_e4m3_launcher():
    from fp4repro.kernels import fp8_cast

    return _launcher(fp8_cast._saturating_e4m3_kernel)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


LIVE_SLOTS = 64  # running live-amax maxima the tiles of a launch spread their atomics over
LIVE_SLOT_STRIDE = 32  # int32s from one slot to the next: one 128-byte line each


def live_slots(device) -> torch.Tensor:
    """Running live-amax slots for ``quantize_2d(..., live=)``: int32 zeros, LIVE_SLOTS of them
    LIVE_SLOT_STRIDE apart, each holding the float32 bits of a maximum (|x| >= 0 orders like its
    bits). Every quantization given them max-folds its live amax in; ``live_slots_amax`` reads
    the maximum over all of them. Zeros: the maximum of nothing seen is 0."""
    return torch.zeros(LIVE_SLOTS * LIVE_SLOT_STRIDE, dtype=torch.int32, device=device)


def live_slots_amax(slots: torch.Tensor) -> torch.Tensor:
    """The largest live amax folded into ``slots`` since they were made, float32 0-d tensor."""
    return slots[::LIVE_SLOT_STRIDE].max().view(torch.float32)


def fold_live_amax(slots: torch.Tensor, amax: torch.Tensor) -> None:
    """Max-fold a live amax computed elsewhere (the torch reference's) into ``slots``, in place."""
    bits = amax.detach().to(device=slots.device, dtype=torch.float32).reshape(1).view(torch.int32)
    torch.maximum(slots[:1], bits, out=slots[:1])


@functools.cache
def _amax_constexprs(tile_r: int, tile_c: int, warps: int, rht: bool, columnwise: bool, tiles: int) -> tuple:
    return tuple(
        dict(
            TILE_R=tile_r,
            TILE_C=tile_c,
            RHT=rht,
            SIGN_BITS=SIGN_BITS,
            COLUMNWISE=columnwise,
            TILES=tiles,
            **_thread_rows(tile_r, warps, columnwise),
        ).items()
    )


#: The most tiles one program of the amax pass reads, and the programs per streaming
#: multiprocessor it keeps at least (``_amax_tiles``).
AMAX_MAX_TILES = 8
AMAX_PROGRAMS_PER_SM = 8


@functools.cache
def _streaming_multiprocessors(device: torch.device) -> int:
    """The device's SM count; 1 for the interpreter's CPU tensors (one program a tile there)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def _amax_tiles(tiles: int, other: int, device: torch.device) -> int:
    """How many of the ``tiles`` tiles along the grid's long axis one program of the amax pass
    reads (``other``: tiles along the other axis): the largest power of two up to
    ``AMAX_MAX_TILES`` that leaves at least ``AMAX_PROGRAMS_PER_SM`` programs per SM. With one tile
    a program (a 16x128 row-wise tile is 4 KB of BF16) a pass over a large operand was tens of
    thousands of programs, each a reduction across warps and an atomic on the same address; a
    small operand keeps its parallelism. The amax is the same for every choice (``_amax_kernel``)."""
    floor = AMAX_PROGRAMS_PER_SM * _streaming_multiprocessors(device)
    n = 1
    while n < AMAX_MAX_TILES and _cdiv(tiles, 2 * n) * other >= floor:
        n *= 2
    return n


def _thread_rows(tile_r: int, warps: int, columnwise: bool) -> dict:
    """A column-wise tile's ``THREAD_ROWS``: the rows of M (contiguous in memory) each thread
    holds, whole blocks of them (see ``quantize._columnwise_offsets``); row-wise tiles need none."""
    return dict(THREAD_ROWS=tile_r // (32 * warps)) if columnwise else {}


def _live_tiles(spec: QuantSpec, columnwise: bool) -> tuple[int, int]:
    """(row tiles one program quantizes when it also reduces the live amax, how many of them are
    unrolled): ``LIVE_TILES`` and ``LIVE_UNROLL``. A program pays the live amax's reduction across
    its warps and its atomic once, however many tiles it folds in. Row-wise tiles of 1-row blocks
    without the RHT: RNE 2 unrolled, SR 4 in a loop; everything else 1. Chosen by timing live
    against plain quantizations on an H200 (``fp4repro bench live``, three alternating processes
    each; the ratios are in results/bench/README.md, *Triton kernels (one H200)*, "Row tiles per program"):
    for those tiles these came closest to the plain kernel, while 16x16 and column-wise tiles got
    slower with more tiles a program. With the RHT a tile's amax is reduced inside the butterfly
    (``_rht16``), so more tiles a program would not save its reductions."""
    if columnwise or spec.block[0] != 1 or spec.rht:
        return 1, 1
    return (4, 1) if spec.stochastic else (2, 2)


@functools.lru_cache(maxsize=4096)
def _quantize_plan(
    spec: QuantSpec,
    shape: tuple[int, int],
    strides: tuple[int, int],
    write_qs: bool,
    codes: bool,
    stats: bool,
    live: bool = False,
    sr_map: int = 0,
) -> tuple:
    """What a quantization of this spec, shape and memory order launches, worked out once:
    (padded shape, column-wise, grid, constexprs, num_warps). The target T is not among the
    constexprs (it is the runtime argument ``emax_t``): specs differing only in T share them."""
    rows, cols = shape
    rows_p, cols_p = padded_shape(rows, cols, spec)
    columnwise = _columnwise(shape, strides)
    tile_r, tile_c, warps = _tiles(spec, columnwise)
    tiles, unroll = _live_tiles(spec, columnwise) if live else (1, 1)
    constexprs = dict(
        TILE_R=tile_r,
        TILE_C=tile_c,
        COLUMNWISE=columnwise,
        BLOCK_R=spec.block[0],
        BLOCK_C=spec.block[1],
        WRITE_QS=write_qs,
        WRITE_CODES=codes,
        STATS=stats,
        EVEN=rows % (tile_r * tiles) == 0 and cols % tile_c == 0,
        **_thread_rows(tile_r, warps, columnwise),
        **_launch_args(spec),
    )
    if live:  # absent otherwise: the kernel's defaults, the same compiled kernel as before
        constexprs.update(LIVE=True, LIVE_SLOTS=LIVE_SLOTS, LIVE_SLOT_STRIDE=LIVE_SLOT_STRIDE)
    if tiles > 1:
        constexprs.update(LIVE_TILES=tiles, LIVE_UNROLL=unroll)
    if sr_map:
        constexprs.update(SR_MAP=sr_map)
    grid = (_cdiv(rows_p, tile_r * tiles), _cdiv(cols_p, tile_c))
    return (rows_p, cols_p), columnwise, grid, tuple(constexprs.items()), warps


def operand_amax_triton(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Current amax (finite elements, after the RHT if spec.rht) of a 2-D tensor, float32 scalar:
    the kernel pass of ``fp4repro.reference.block.operand_amax_reference``."""
    rows, cols = x.shape
    columnwise = _columnwise(x.shape, x.stride())
    tile_r, tile_c, warps = _tiles(spec, columnwise)
    grid = [_cdiv(rows, tile_r), _cdiv(cols, tile_c)]
    long = 1 if columnwise else 0  # the axis a program's tiles run along (``_amax_kernel``)
    tiles = _amax_tiles(grid[long], grid[1 - long], x.device)
    grid[long] = _cdiv(grid[long], tiles)
    bits = torch.zeros(1, dtype=torch.int32, device=x.device)
    _amax_launcher()(
        tuple(grid),
        (x, bits, rows, cols, x.stride(0), x.stride(1)),
        _amax_constexprs(tile_r, tile_c, warps, spec.rht, columnwise, tiles),
        warps,
    )
    return bits.view(torch.float32)[0]


def row_major(x: torch.Tensor) -> bool:
    """Whether the 2-D x lies row by row in memory, the layout ``operand_amax_with_rht_triton`` reads."""
    return x.stride(1) == 1 and x.stride(0) >= x.shape[1]


def operand_amax_with_rht_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max |x|, max |RHT16 down x's columns|) over finite elements of a row-major 2-D x (float32
    scalars) from one read of x: ``operand_amax_triton`` of x with a spec without the RHT, and of
    xᵀ (the column-wise view wgrad quantizes) with one with it, bit for bit."""
    amax, amax_rht, _ = _amax_with_rht(x, cast=False)
    return amax, amax_rht


def operand_amax_with_rht_and_bf16_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(max |x|, max |RHT16 down c's columns|, c) for a row-major 2-D float32 x and its BF16 cast
    c (dense, row-major), from one read of x: ``operand_amax_triton`` of x with a spec without the
    RHT, of cᵀ with one with it, and torch's ``x.to(torch.bfloat16)`` (round to nearest even; a
    NaN stays a NaN, its payload aside), bit for bit. A float32 activation whose wgrad operand is
    its BF16 cast."""
    if x.dtype != torch.float32:
        raise ValueError(f"operand_amax_with_rht_and_bf16_triton casts float32 to BF16, got {x.dtype}")
    return _amax_with_rht(x, cast=True)


def _amax_with_rht(x: torch.Tensor, cast: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    rows, cols = x.shape
    if not row_major(x):
        raise ValueError(f"the amax pass with the RHT takes a row-major matrix, got strides {x.stride()}")
    tile_r, tile_c, warps = _tiles(QuantSpec(), columnwise=False)  # the row-wise 1x16 tile: one RHT group tall
    grid = [_cdiv(rows, tile_r), _cdiv(cols, tile_c)]
    tiles = _amax_tiles(grid[0], grid[1], x.device)
    bits = torch.zeros(2, dtype=torch.int32, device=x.device)
    c = torch.empty((rows, cols), dtype=torch.bfloat16, device=x.device) if cast else None
    _amax_with_rht_launcher()(
        (_cdiv(grid[0], tiles), grid[1]),
        # the kernel writes BF16 bit patterns (int16): see quantize._bf16_rne
        (x, bits, (c if cast else _dummy(x.device, torch.bfloat16)).view(torch.int16), rows, cols, x.stride(0)),
        _amax_with_rht_constexprs(tile_r, tile_c, tiles, cast),
        warps,
    )
    amaxes = bits.view(torch.float32)
    return amaxes[0], amaxes[1], c


@functools.cache
def _amax_with_rht_constexprs(tile_r: int, tile_c: int, tiles: int, cast: bool) -> tuple:
    constexprs = dict(TILE_R=tile_r, TILE_C=tile_c, SIGN_BITS=SIGN_BITS, TILES=tiles)
    if cast:  # absent otherwise: the kernel's default, the same compiled kernel as before
        constexprs.update(CAST=True)
    return tuple(constexprs.items())


def _amax_arg(amax, x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """The amax the kernel reads: the held value as a float32 device scalar, else the current
    amax (its own pass); a stand-in when the spec has no tensor scale (the kernel ignores it)."""
    if spec.target is None:
        return _dummy(x.device, torch.float32)
    if amax is None:
        return operand_amax_triton(x, spec)
    if isinstance(amax, torch.Tensor) and amax.dtype == torch.float32 and amax.device == x.device:
        return amax if amax.dim() == 0 else amax.reshape(())
    return torch.as_tensor(amax, dtype=torch.float32, device=x.device).reshape(())


class ShardPlace(NamedTuple):
    """Where a shard of a tensor split over tensor-parallel ranks sits in the whole tensor, for the
    random stream of stochastic rounding (``shard_place`` builds it)."""

    axis: int  # the axis of M the split runs along: 0 rows, 1 columns
    map: torch.Tensor  # int64: axis 0, the whole tensor's row of each row; axis 1, its 8-group
    # of columns of each 8-group
    parts: int  # the whole tensor's extent along ``axis`` over the shard's


def shard_place(axis: int, index: Sequence[int], parts: int, device) -> ShardPlace:
    """The ``ShardPlace`` of a shard whose i-th index along M's ``axis`` is the whole tensor's
    ``index[i]`` (the whole tensor being ``parts`` times as long there). Along columns, each run of 8
    columns must be 8 consecutive columns of the whole tensor starting at a multiple of 8 (one
    Philox call serves 8 elements): block-aligned splits are (``fp4repro.config.shards``)."""
    index = torch.as_tensor(list(index), dtype=torch.int64)
    if axis == 1:
        groups = index.reshape(-1, 8) if len(index) % 8 == 0 else None
        if groups is None or (groups[:, 0] % 8 != 0).any() or (groups - groups[:, :1] != torch.arange(8)).any():
            raise ValueError(
                "a shard split along columns must keep runs of 8 consecutive columns starting at a "
                "multiple of 8 (one Philox call serves 8 elements)"
            )
        index = groups[:, 0] // 8
    elif axis != 0:
        raise ValueError(f"axis must be 0 (rows) or 1 (columns), got {axis}")
    return ShardPlace(axis, index.to(device), int(parts))


def _draw_seed() -> int:
    """An SR seed from torch's CPU generator (so a seeded run is reproducible)."""
    return int(torch.randint(0, 2**31 - 1, (1,)).item())


def quantize_2d(
    x: torch.Tensor,
    spec: QuantSpec,
    amax: torch.Tensor | None = None,
    seed: int | None = None,
    rand_offset: int = 0,
    out_dtype: torch.dtype | None = None,
    write_qs: bool = True,
    codes: bool = False,
    stats: bool = False,
    live: torch.Tensor | None = None,
    place: ShardPlace | None = None,
) -> dict:
    """Quantize a 2-D tensor (any strides) along its last dim; the kernel path of the reference.

    Returns a dict with ``qs`` (q·s_b in x's logical shape, dense: column-major for a column-major
    x, else row-major; ``out_dtype`` or x's dtype), ``decode_scale`` d (float32 scalar written by the
    kernel), ``amax`` (A used), and when
    asked ``codes`` / ``scale_codes`` (the layouts of ``BlockQuantized``) and ``counts`` / ``sums``
    telemetry tensors. With a held amax (a float32 tensor on x's device) and no telemetry this is
    a single kernel launch. ``live`` (slots from ``live_slots`` on x's device): the current
    tensor amax (max |x| after the RHT when spec.rht, NaN counted as inf: the reference's
    ``live_amax``) is max-folded into them from the |x| or block amaxes the kernel computes anyway, no
    extra pass and no extra launch; ``live_slots_amax`` reads the running maximum (with a held amax, the
    largest growth since the slots were made is that over the held amax). The target T is a runtime
    argument of the kernel: a new T compiles nothing. ``seed`` (SR only) defaults to a draw from torch's CPU
    generator, so
    runs are reproducible; ``rand_offset`` (a multiple of 8) shifts the random stream; ``place``: x is
    a shard of a tensor split over tensor-parallel ranks, and SR draws the bits of its elements'
    places in the whole tensor (the same seed then rounds the shard as it rounds the whole).
    """
    launch, out = quantize_launch(x, spec, amax, seed, rand_offset, out_dtype, write_qs, codes, stats, live, place)
    _quantize_launcher()(*launch)
    if stats:  # the tiles' counts and sums, the sums in tile order: the same bits at every run
        out["counts"] = out.pop("tile_counts").sum(dim=0)  # int64: the tiles' sum cannot overflow
        out["sums"] = out.pop("tile_sums").sum(dim=0)
    return out


def quantize_launch(
    x: torch.Tensor,
    spec: QuantSpec,
    amax: torch.Tensor | None = None,
    seed: int | None = None,
    rand_offset: int = 0,
    out_dtype: torch.dtype | None = None,
    write_qs: bool = True,
    codes: bool = False,
    stats: bool = False,
    live: torch.Tensor | None = None,
    place: ShardPlace | None = None,
) -> tuple[tuple, dict]:
    """What ``quantize_2d`` launches, without launching: ((grid, args, constexprs, num_warps) of
    ``_quantize_kernel``, the output dict with its buffers allocated on x's device)."""
    if seed is not None and not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2^32) (the 32-bit Philox2x32 key), got {seed}")
    if rand_offset % 8:
        raise ValueError(f"rand_offset must be a multiple of 8 (one Philox call serves 8 elements), got {rand_offset}")
    strides = x.stride()
    if strides[1] != 1 and not _columnwise(x.shape, strides):
        x = x.contiguous()
        strides = x.stride()
    sr_map = 0 if place is None or not spec.stochastic else place.axis + 1
    (rows_p, cols_p), columnwise, grid, constexprs, warps = _quantize_plan(
        spec, x.shape, strides, write_qs, codes, stats, live is not None, sr_map
    )
    rows, cols = x.shape
    if sr_map and len(place.map) != (rows if place.axis == 0 else cols_p // 8):
        raise ValueError(
            f"the shard place maps {len(place.map)} {'rows' if place.axis == 0 else '8-groups'}, "
            f"x has {rows} rows and {cols_p // 8} 8-groups of columns"
        )
    rand_pitch = cols_p * (place.parts if sr_map == 2 else 1)
    device = x.device
    amax = _amax_arg(amax, x, spec)
    if spec.stochastic and seed is None:
        seed = _draw_seed()
    out_dtype = out_dtype or (x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.float32)
    if not write_qs:
        qs = _dummy(device, out_dtype)
    elif columnwise:  # the kernel stores column-wise tiles down the rows: a dense column-major qs
        qs = torch.empty_strided((rows, cols), (1, rows), dtype=out_dtype, device=device)
    else:
        qs = torch.empty((rows, cols), dtype=out_dtype, device=device)
    code_buf = (
        torch.empty((rows_p, cols_p // 2), dtype=torch.uint8, device=device) if codes else _dummy(device, torch.uint8)
    )
    scale_buf = (
        torch.empty((rows_p // spec.block[0], cols_p // spec.block[1]), dtype=torch.uint8, device=device)
        if codes
        else _dummy(device, torch.uint8)
    )
    # each tile's [saturated, underflow, nonzero, zeroed, nonfinite, clipped] (int32) and [sq_error,
    # sq_norm] (float64), summed after the launch (see _quantize_kernel); a program quantizes
    # LIVE_TILES row tiles, and tiles past the matrix keep their zeros
    tiles = grid[0] * dict(constexprs).get("LIVE_TILES", 1) * grid[1]
    tile_counts = torch.zeros((tiles, 6), dtype=torch.int32, device=device) if stats else _dummy(device, torch.int32)
    tile_sums = torch.zeros((tiles, 2), dtype=torch.float64, device=device) if stats else _dummy(device, torch.float64)
    d = torch.empty((), dtype=torch.float32, device=device)
    if live is not None and (
        live.dtype != torch.int32 or live.shape != (LIVE_SLOTS * LIVE_SLOT_STRIDE,) or live.device != device
    ):
        raise ValueError(
            f"live must be the slots of live_slots({device}), got {live.dtype} {tuple(live.shape)} on {live.device}"
        )
    emax_t = emax_target(get_format(spec.element).max, spec.target)
    out_strides = qs.stride() if write_qs else (0, 0)
    live = _dummy(device, torch.int32) if live is None else live
    rand_map = place.map if sr_map else _dummy(device, torch.int64)
    args = (
        x,
        amax,
        qs,
        code_buf,
        scale_buf,
        tile_counts,
        tile_sums,
        d,
        live,
        rand_map,
        rows,
        cols,
        cols_p,
        *strides,
        *out_strides,
        seed or 0,
        rand_offset,
        rand_pitch,
        emax_t,
    )
    out = {"qs": qs if write_qs else None, "decode_scale": d, "amax": amax, "seed": seed}
    if codes:
        out.update(codes=code_buf, scale_codes=scale_buf)
    if stats:
        out.update(
            tile_counts=tile_counts, tile_sums=tile_sums, blocks=(rows_p // spec.block[0]) * (cols_p // spec.block[1])
        )
    return (grid, args, constexprs, warps), out


@functools.cache
def _dummy(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A one-element (0-d) stand-in for an argument the kernel is told not to use."""
    return torch.empty((), dtype=dtype, device=device)


def scale_cast(acc: torch.Tensor, alpha: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """(acc · alpha).to(out_dtype) in one pass (acc float32 contiguous, alpha a float32 scalar)."""
    out = torch.empty_like(acc, dtype=out_dtype)
    n = acc.numel()
    _scale_cast_launcher()((_cdiv(n, 4096),), (acc, alpha.to(torch.float32).reshape(1), out, n), (("BLOCK", 4096),), 4)
    return out


def split_bf16_triton(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(G₁, G₂, G₃) of a contiguous float32 ``g`` in one pass (``fp4repro.kernels.split``), equal
    to ``fp4repro.reference.split.split_bf16_reference``'s bit for bit."""
    if g.dtype != torch.float32 or not g.is_contiguous():
        raise TypeError(
            f"split_bf16_triton splits a contiguous float32 tensor, not {g.dtype} with strides {g.stride()}"
        )
    pieces = tuple(torch.empty_like(g, dtype=torch.bfloat16) for _ in range(3))
    n = g.numel()
    bits = tuple(p.view(torch.int16) for p in pieces)  # the kernel writes each piece's bits
    _split_bf16_launcher()((_cdiv(n, 4096),), (g, *bits, n), (("BLOCK", 4096),), 4)
    return pieces


def saturating_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x (2-D, any strides) clamped to ±448 and cast to ``float8_e4m3fn``, row-major, in one pass
    (``fp4repro.kernels.fp8_cast``)."""
    rows, cols = x.shape
    out = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=x.device)
    _saturating_e4m3_launcher()(
        (_cdiv(rows, 64), _cdiv(cols, 64)), (x, out, rows, cols, x.stride(0), x.stride(1)), (("BR", 64), ("BC", 64)), 4
    )
    return out


def philox_uniforms(n: int, seed: int, rand_offset: int = 0, device="cuda") -> torch.Tensor:
    """The n float32 uniforms the SR kernels draw for offsets rand_offset .. rand_offset + n - 1:
    (255 - byte + 1/2) / 256 with 8 random bits each (see ``fp4repro.kernels.quantize``), to feed the
    reference (``rand=``) so that kernel and reference round identically."""
    skip = rand_offset % 8
    out = torch.empty(n + skip, dtype=torch.float32, device=device)
    _philox_uniform_launcher()(
        (_cdiv(n + skip, 1024),), (out, n + skip, seed, rand_offset - skip), (("BLOCK", 1024),), 4
    )
    return out[skip:]


def _gemm_tiles(m: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the probe-matched GEMM: a function of the shape alone, never
    autotuned, so that a run's tiles (and with them the tensor-core instructions that form each
    partial) are the same in every process."""
    if m >= 128 and n >= 128:
        return 128, 128, 8
    return max(16, min(64, _next_power_of_2(m))), max(16, min(64, _next_power_of_2(n))), 4


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def probe_matched_gemm_triton(
    a: torch.Tensor, da, b: torch.Tensor, db, out_dtype: torch.dtype, model, mma_accumulates: bool = False
) -> torch.Tensor:
    """y (M, N) in ``out_dtype``: the probe-matched model of a · bᵀ (``fp4repro.kernels.gemm``; the
    reference is ``fp4repro.reference.gemm.probe_matched_gemm_reference``, same arguments).

    a: (M, K), b: (N, K), encoded operands (values exact in BF16) in any float dtype and strides;
    d_a, d_b: decode scales (None, a Python float, or a float32 tensor: 0-d, or (M, 1) for d_a);
    model: the recipe's ``GemmModel`` (kind probe_matched). ``mma_accumulates``: not the model but
    the same tiles as an ordinary GEMM (``fp4repro.bench.gemm`` times it as the kernel's ceiling)."""
    m, k = a.shape
    n = b.shape[0]
    # the tensor cores multiply BF16: an operand held in another dtype (a float32 master weight's
    # q·s) converts exactly, its values being encoded ones
    a, b = (t if t.dtype == torch.bfloat16 else t.to(torch.bfloat16) for t in (a, b))
    given = [d for d in (da, db) if d is not None]
    alpha = alpha_value = None
    if given and all(isinstance(d, float) for d in given):
        # known on the host (a held amax, or no tensor scale): rn32 of the float32 product, exact
        # in double; no tensor to make (a copy to the device would break CUDA-graph capture)
        alpha_value = float(np.float32(math.prod(float(np.float32(d)) for d in given)))
    elif given:
        scales = [torch.as_tensor(d, dtype=torch.float32, device=a.device) for d in given]
        alpha = (scales[0] if len(scales) == 1 else scales[0] * scales[1]).reshape(-1)
        if alpha.numel() not in (1, m):
            raise ValueError(f"probe_matched_gemm_triton: decode scales give {alpha.numel()} values for {m} rows")
    from triton import knobs

    # the interpreter casts float32 to BF16 by truncation, the GPU to nearest-even as torch does:
    # interpreted, the kernel stores float32 and torch casts
    interpreted = knobs.runtime.interpret
    out = torch.empty((m, n), dtype=torch.float32 if interpreted else out_dtype, device=a.device)
    block_m, block_n, warps = _gemm_tiles(m, n)
    lattice = model.lattice if model.lattice is not None else 1.0

    constexprs = (
        ("GROUP", model.group),
        ("GROUPS", max(1, _cdiv(k, model.group))),
        ("HAS_LATTICE", model.lattice is not None),
        ("INV_LATTICE", 1.0 / lattice),
        ("LATTICE", lattice),
        ("HAS_ALPHA", 1 if alpha_value is not None else 2 if alpha is not None else 0),
        ("ASM", not interpreted),
        ("BLOCK_M", block_m),
        ("BLOCK_N", block_n),
        ("GROUP_M", 8),
        ("MMA_ACCUMULATES", mma_accumulates),
    )
    alpha_arg = alpha if alpha is not None else _dummy(a.device, torch.float32)
    alpha_stride = 1 if alpha is not None and alpha.numel() == m and m > 1 else 0
    _probe_matched_gemm_launcher()(
        (_cdiv(m, block_m) * _cdiv(n, block_n),),
        (
            a,
            b,
            alpha_arg,
            out,
            m,
            n,
            k,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            out.stride(0),
            out.stride(1),
            alpha_stride,
            alpha_value if alpha_value is not None else 1.0,
        ),
        constexprs,
        warps,
    )
    return out.to(out_dtype)
