"""The geometry of block quantization, shared by the torch reference and the Triton kernels.

A tensor is quantized as a 2-D matrix (rows, cols): every leading dimension flattened into rows,
blocks running along cols (the GEMM's reduction dimension). A block is 1×16, 1×32, or a 16×16 or
32×32 tile (``fp4repro.config.spec.BLOCKS``). A matrix whose shape does not divide into blocks is
zero-padded at the end of each dimension (and along cols to whole 16-groups when the RHT is
applied), then cropped again, as Transformer Engine does.
"""

from __future__ import annotations

import torch

from fp4repro.config.spec import QuantSpec

#: Length of the randomized Hadamard transform's groups along the reduction dimension.
RHT_SIZE = 16


def rows_cols(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) of the 2-D view of a tensor of ``shape`` (a scalar is 1×1)."""
    cols = shape[-1] if len(shape) else 1
    rows = 1
    for n in shape[:-1]:
        rows *= n
    return rows, cols


def padded_shape(rows: int, cols: int, spec: QuantSpec) -> tuple[int, int]:
    """(rows, cols) rounded up to whole blocks (and to whole 16-groups along cols for the RHT)."""
    block_rows, block_cols = spec.block
    col_multiple = max(block_cols, RHT_SIZE) if spec.rht else block_cols
    return rows + -rows % block_rows, cols + -cols % col_multiple


def pad_to_blocks(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """x as a float32 2-D (rows, cols) view, zero-padded to ``padded_shape``."""
    rows, cols = rows_cols(x.shape)
    x2d = x.reshape(rows, cols).to(torch.float32)
    rows_p, cols_p = padded_shape(rows, cols, spec)
    if (rows_p, cols_p) != (rows, cols):
        x2d = torch.nn.functional.pad(x2d, (0, cols_p - cols, 0, rows_p - rows))
    return x2d


def to_blocks(x2d: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """(R, C) -> (R/r, C/c, r·c): one row per block."""
    r, c = block
    rows, cols = x2d.shape
    return x2d.reshape(rows // r, r, cols // c, c).permute(0, 2, 1, 3).reshape(rows // r, cols // c, r * c)


def from_blocks(xb: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Inverse of ``to_blocks``."""
    r, c = block
    nbr, nbc, _ = xb.shape
    return xb.reshape(nbr, nbc, r, c).permute(0, 2, 1, 3).reshape(nbr * r, nbc * c)
