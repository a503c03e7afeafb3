"""Whether a recipe's blocks tile every tensor-parallel shard, so that a split quantizes the blocks
the unsplit tensor has.

For a linear Y = X Wᵀ (X: tokens × K, W: N × K) the six operands are blocked as the numerics contract
says, block columns along the GEMM's reduction dimension and block rows across it:

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

# the operands' block extent along N and K: (operand, which block axis: 0 rows, 1 columns)
ALONG = {"N": (("fprop.w", 0), ("dgrad.dy", 1), ("dgrad.w", 1), ("wgrad.dy", 0)),
         "K": (("fprop.x", 1), ("fprop.w", 1), ("dgrad.w", 0), ("wgrad.x", 0))}


def rank_parts(model: ModelConfig, linear: str, tp: int) -> tuple[str, dict[str, int]]:
    """(the dimension tensor parallelism splits, the contiguous pieces of one rank's part of it:
    what -> size) of a linear. The model's split sizes divide ``tp`` (``parallel_problems``)."""
    d_inner, bc = model.mamba_d_inner, model.mamba_groups * model.mamba_state_size
    r, d = model.attn_heads // model.attn_kv_heads, model.attn_head_dim
    return {"in_proj": ("N", {f"z ({d_inner} / {tp})": d_inner // tp, f"x ({d_inner} / {tp})": d_inner // tp,
                              f"B ({bc} / {tp})": bc // tp, f"C ({bc} / {tp})": bc // tp,
                              f"dt ({model.mamba_heads} / {tp})": model.mamba_heads // tp}),
            # whole KV groups per rank, each [its r query heads | key | value]
            "qkv_proj": ("N", {f"queries of a KV group ({r} x {d})": r * d, f"key of a KV group ({d})": d}),
            "fc1": ("N", {f"width ({model.mlp_hidden_size} / {tp})": model.mlp_hidden_size // tp}),
            "out_proj": ("K", {f"d_inner ({d_inner} / {tp})": d_inner // tp}),
            "o_proj": ("K", {f"heads ({model.attn_heads} x {d} / {tp})": model.attn_heads * d // tp}),
            "fc2": ("K", {f"width ({model.mlp_hidden_size} / {tp})": model.mlp_hidden_size // tp})}[linear]


def split_segments(model: ModelConfig, linear: str) -> list[int]:
    """The whole tensor's pieces along the dimension tensor parallelism splits (``rank_parts``),
    in megatron-core's layout, each of which every rank holds an equal part of: Mamba's in_proj
    z, x, B, C, dt; one piece otherwise (the QKV projection's rows are grouped by KV group, whole
    groups per rank)."""
    d_inner, bc = model.mamba_d_inner, model.mamba_groups * model.mamba_state_size
    return {"in_proj": [d_inner, d_inner, bc, bc, model.mamba_heads],
            "qkv_proj": [(model.attn_heads + 2 * model.attn_kv_heads) * model.attn_head_dim],
            "fc1": [model.mlp_hidden_size], "out_proj": [d_inner],
            "o_proj": [model.attn_heads * model.attn_head_dim], "fc2": [model.mlp_hidden_size]}[linear]


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
    return segment_index(split_segments(model, linear), tp, rank)


def shard_problems(model: ModelConfig, recipe: Recipe, parallel: ParallelConfig) -> list[ParallelError]:
    """One error per (linear, segment, operand) whose rank's part is not a whole number of blocks."""
    tp = parallel.tensor
    if tp == 1:
        return []
    problems, seen = [], set()
    for index, linears in enumerate(model.layer_linears):
        for linear in linears:
            specs = recipe.linear_specs(index, model.n_layers, linear=linear)
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
                        problems.append(ParallelError(
                            "parallel.tensor", tp,
                            f"recipe '{recipe.name}' quantizes {operand} of {linear} (first in layer {index}) in "
                            f"blocks of {block} along {dim}, and a rank's piece of it, {what} = {part}, is not a whole "
                            "number of blocks: the split would change the blocks"))
    return problems
