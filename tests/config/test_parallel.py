"""The split of processes and the global batch at launch (``layout``): what each rank computes,
and a clear error where the numbers do not divide."""

import pytest

from fp4repro.config.parallel import ParallelConfig, ParallelError, layout


@pytest.mark.parametrize(
    "parallel, world, batch, expected",
    [
        # (tensor, pipeline, micro), processes, global batch -> (data, micro, accumulation)
        ((1, 1, None), 1, 8, (1, 8, 1)),  # one process, the whole batch at once
        ((1, 1, 2), 1, 8, (1, 2, 4)),
        ((2, 1, 1), 2, 768, (1, 1, 768)),  # the 8B on two GPUs: TP = 2, micro-batch 1
        ((2, 1, 1), 256, 768, (128, 1, 6)),  # 32 nodes of 8: 128 data-parallel ranks
        ((2, 2, 3), 24, 36, (6, 3, 2)),
    ],
)
def test_layout_splits_processes_and_batch(parallel, world, batch, expected):
    tensor, pipeline, micro = parallel
    got = layout(ParallelConfig(tensor=tensor, pipeline=pipeline, micro_batch=micro), world, batch)
    assert (got.tensor, got.pipeline) == (tensor, pipeline)
    assert (got.data, got.micro_batch, got.accumulation) == expected
    assert got.data * got.micro_batch * got.accumulation == batch


@pytest.mark.parametrize(
    "parallel, world, batch, field, allowed",
    [
        ((2, 1, None), 3, 8, "parallel.tensor", "must divide the number of processes (3)"),
        ((2, 2, None), 8, 7, "train.batch_size", "multiple of the data-parallel size 2"),
        ((1, 1, 3), 2, 8, "parallel.micro_batch", "divide the 4 sequences per data-parallel rank"),
    ],
)
def test_layout_errors_name_the_field(parallel, world, batch, field, allowed):
    tensor, pipeline, micro = parallel
    with pytest.raises(ParallelError) as err:
        layout(ParallelConfig(tensor=tensor, pipeline=pipeline, micro_batch=micro), world, batch)
    assert err.value.field == field and allowed in str(err.value), str(err.value)
