"""Whether a recipe's blocks tile every tensor-parallel shard, so that a split quantizes the blocks
the unsplit tensor has.

For a linear Y = X Wᵀ (X: tokens × K, W: N × K) the six operands are blocked as the numerics contract
says, block columns along the GEMM's reduction dimension and block rows across it
(``fp4repro.config.spec.OPERAND_MATRIX``):

    fprop.x  X   (tokens × K)     fprop.w  W  (N × K)
    dgrad.dy dY  (tokens × N)     dgrad.w  Wᵀ (K × N)
    wgrad.dy dYᵀ (N × tokens)     wgrad.x  Xᵀ (K × tokens)

A column-parallel linear splits N over the tensor group, a row-parallel one K. Every operand that
has the split dimension along its block columns or rows then sees only its rank's part, so the
part must be a whole number of blocks, and a fused projection splits each of its segments
(Mamba's in_proj: z, x, B, C, dt; the QKV projection: per KV group its queries, key, value), so
each segment's part must be. Otherwise a block would mix elements that are not neighbours in the
unsplit tensor, and the recipe would mean something else at this tensor size.
"""

from __future__ import annotations

from fp4repro.config.model import ModelConfig
from fp4repro.config.parallel import ParallelConfig, ParallelError
from fp4repro.config.recipe import Recipe
from fp4repro.config.spec import OPERAND_MATRIX

# the operands' block extent along N and K: (operand, which block axis: 0 rows, 1 columns)
ALONG = {
    dim: tuple((op, matrix.index(dim)) for op, matrix in OPERAND_MATRIX.items() if dim in matrix) for dim in ("N", "K")
}


def _segments(model: ModelConfig, linear: str) -> tuple[str, list[tuple[str, int, str]]]:
    """(the dimension tensor parallelism splits, the whole tensor's segments along it in
    megatron-core's layout, each of which every rank holds an equal part of: (name, size, the size
    as it reads)). Mamba's in_proj: z, x, B, C, dt; one segment otherwise (the QKV projection's
    rows are grouped by KV group, whole groups per rank)."""
    d_inner, bc = model.mamba_d_inner, model.mamba_groups * model.mamba_state_size
    heads, d, width = model.attn_heads, model.attn_head_dim, model.mlp_hidden_size
    qkv, kv = model.attn_qkv_size, model.attn_kv_heads
    return {
        "in_proj": (
            "N",
            [
                ("z", d_inner, str(d_inner)),
                ("x", d_inner, str(d_inner)),
                ("B", bc, str(bc)),
                ("C", bc, str(bc)),
                ("dt", model.mamba_heads, str(model.mamba_heads)),
            ],
        ),
        "qkv_proj": ("N", [("query, key and value rows", qkv, str(qkv))]),
        "q_proj": ("N", [("heads", heads * d, f"{heads} x {d}")]),  # separate q/k/v: whole heads per rank
        "k_proj": ("N", [("KV heads", kv * d, f"{kv} x {d}")]),
        "v_proj": ("N", [("KV heads", kv * d, f"{kv} x {d}")]),
        "fc1": ("N", [("width", width, str(width))]),
        "out_proj": ("K", [("d_inner", d_inner, str(d_inner))]),
        "o_proj": ("K", [("heads", heads * d, f"{heads} x {d}")]),
        "fc2": ("K", [("width", width, str(width))]),
    }[linear]


def rank_parts(model: ModelConfig, linear: str, tp: int) -> tuple[str, dict[str, int]]:
    """(the dimension tensor parallelism splits, the contiguous pieces of one rank's part of it:
    what -> size) of a linear. The model's split sizes divide ``tp`` (``parallel_problems``)."""
    dim, segments = _segments(model, linear)
    if linear == "qkv_proj":  # whole KV groups per rank, each [its r query heads | key | value]
        r, d = model.attn_heads // model.attn_kv_heads, model.attn_head_dim
        return dim, {f"queries of a KV group ({r} x {d})": r * d, f"key of a KV group ({d})": d}
    return dim, {f"{name} ({reads} / {tp})": size // tp for name, size, reads in segments}


def split_segments(model: ModelConfig, linear: str) -> tuple[str, list[int]]:
    """(the dimension tensor parallelism splits: N or K, the sizes of the whole tensor's segments
    along it, each of which every rank holds an equal part of: ``_segments``)."""
    dim, segments = _segments(model, linear)
    return dim, [size for _, size, _ in segments]


def segment_index(segments: list[int], tp: int, rank: int) -> list[int]:
    """The indices into the whole tensor of rank ``rank``'s part: of each segment in turn, its
    ``rank``-th of ``tp`` equal parts."""
    index, start = [], 0
    for size in segments:
        part = size // tp
        index.extend(range(start + rank * part, start + (rank + 1) * part))
        start += size
    return index


def split_index(model: ModelConfig, linear: str, tp: int, rank: int) -> list[int]:
    """The indices, along the dimension tensor parallelism splits, that rank ``rank`` of ``tp``
    holds of a linear's whole tensor as megatron-core lays it out."""
    return segment_index(split_segments(model, linear)[1], tp, rank)


def shard_problems(model: ModelConfig, recipe: Recipe, parallel: ParallelConfig) -> list[ParallelError]:
    """One error per (linear, segment, operand) whose rank's part is not a whole number of blocks."""
    tp = parallel.tensor
    if tp == 1:
        return []
    problems, seen = [], set()
    for index, linears in enumerate(model.layer_linears):
        for linear in linears:
            specs = recipe.linear_specs(index, model.layer_linears, linear=linear)
            if specs is None:
                continue
            dim, parts = rank_parts(model, linear, tp)
            for operand, axis in ALONG[dim]:
                spec = specs[operand]
                if spec is None:
                    continue
                block = spec.block[axis]
                for what, part in parts.items():
                    key = (linear, what, operand, block)
                    if part % block and key not in seen:
                        seen.add(key)
                        problems.append(
                            ParallelError(
                                "parallel.tensor",
                                tp,
                                f"recipe '{recipe.name}' quantizes {operand} of {linear} (first in layer {index}) in "
                                f"blocks of {block} along {dim}, and a rank's piece of it, {what} = {part}, "
                                "is not a whole "
                                "number of blocks: the split would change the blocks",
                            )
                        )
    return problems
