"""How a run is split over GPUs: the experiment's ``parallel:`` section -> ``ParallelConfig``.

    parallel:
      tensor: 2               # tensor-parallel size: linears split over this many GPUs
      pipeline: 1             # pipeline stages: consecutive layers on consecutive GPU groups
      sequence_parallel: true # norms and residuals split along the sequence over the tensor group
      micro_batch: 1          # sequences per forward/backward on each data-parallel rank
      tp_amax: group          # group: amaxes of tensor-split operands MAX-reduced over the group;
                              # local: each rank scales its shard by its own amax

The global batch is ``train.batch_size`` (sequences per optimizer step), for every backend: with
``world`` processes the data-parallel size is world / (tensor · pipeline), and each step
accumulates batch_size / (micro_batch · data-parallel size) micro-batches per rank.

``tp_amax``: under tensor parallelism an operand whose reduction dimension is split (the input
and weight of a row-parallel linear, the output gradient of a column-parallel one) lives as
shards. ``group`` reduces each shard's amax over the tensor group, so every rank scales as the
unsplit tensor would and the numerics do not depend on the tensor size (the reference model's);
``local`` uses each shard's own amax, as Transformer Engine does for weights and row-parallel
inputs (one all-reduce less per quantization, numerics that change with the split).

Checks come in three places, each where its facts are known: ``parse_parallel`` (the experiment
file alone), ``parallel_problems`` (against the model: sizes the tensor group must divide) and
``layout`` (against the number of processes at launch).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelConfig:
    tensor: int = 1
    pipeline: int = 1
    sequence_parallel: bool = False
    micro_batch: int | None = None  # None: the whole per-rank batch in one forward/backward
    tp_amax: str = "group"


@dataclass(frozen=True)
class ParallelLayout:
    """The parallel config applied to ``world`` processes and a global batch."""

    tensor: int
    pipeline: int
    data: int  # data-parallel size
    micro_batch: int  # sequences per micro-batch per data-parallel rank
    accumulation: int  # micro-batches per optimizer step per data-parallel rank


class ParallelError(ValueError):
    """(field, value, what is allowed) of a parallel setting that cannot be used."""

    def __init__(self, field: str, value, allowed: str):
        super().__init__(f"field '{field}': value {value!r}: {allowed}")
        self.field, self.value, self.allowed = field, value, allowed


def parse_parallel(raw: dict, backend: str, batch_size: int) -> ParallelConfig:
    """The ``parallel:`` section (already schema-checked) checked against the rest of its file:
    the reference backend runs in one process; sequence parallelism needs a tensor group; a
    micro-batch divides the global batch ``train.batch_size``."""
    p = ParallelConfig(**raw)
    if backend == "reference":
        for name in ("tensor", "pipeline"):
            if getattr(p, name) != 1:
                raise ParallelError(
                    f"parallel.{name}",
                    getattr(p, name),
                    "the reference backend runs in one process: 1 (or backend: megatron)",
                )
    if p.sequence_parallel and p.tensor == 1:
        raise ParallelError("parallel.sequence_parallel", True, "needs tensor > 1 (it splits along the tensor group)")
    if p.micro_batch is not None and batch_size % p.micro_batch:
        raise ParallelError(
            "parallel.micro_batch", p.micro_batch, f"must divide the global batch train.batch_size ({batch_size})"
        )
    return p


def parallel_problems(p: ParallelConfig, sizes: dict[str, int], n_layers: int) -> list[ParallelError]:
    """What the model forbids: every size split over the tensor group (``sizes``: name -> size,
    e.g. attention heads, KV heads, Mamba heads and groups, MLP width) must be a multiple of
    ``tensor``, and there cannot be more pipeline stages than layers."""
    problems = [
        ParallelError("parallel.tensor", p.tensor, f"must divide the model's {name} ({size})")
        for name, size in sizes.items()
        if size % p.tensor
    ]
    if p.pipeline > n_layers:
        problems.append(ParallelError("parallel.pipeline", p.pipeline, f"at most the model's {n_layers} layers"))
    return problems


def layout(p: ParallelConfig, world: int, batch_size: int) -> ParallelLayout:
    """The split of ``world`` processes and a global batch of ``batch_size`` sequences."""
    group = p.tensor * p.pipeline
    if world % group:
        raise ParallelError(
            "parallel.tensor", p.tensor, f"tensor · pipeline ({group}) must divide the number of processes ({world})"
        )
    data = world // group
    if batch_size % data:
        raise ParallelError(
            "train.batch_size",
            batch_size,
            f"must be a multiple of the data-parallel size {data} ({world} processes / {group})",
        )
    per_rank = batch_size // data
    micro = p.micro_batch or per_rank
    if per_rank % micro:
        raise ParallelError(
            "parallel.micro_batch",
            micro,
            f"must divide the {per_rank} sequences per data-parallel rank ({batch_size} / {data})",
        )
    return ParallelLayout(p.tensor, p.pipeline, data, micro, per_rank // micro)
