"""``fp4repro bench gemm``'s table (the timing itself needs a GPU: it is run on one, not here)."""

from __future__ import annotations

from fp4repro.bench.gemm import table


def _shape(**extra) -> dict:
    times = {"cublas_bf16_ms": 2.0, "probe_matched_ms": 3.25, "mma_accumulates_ms": 2.5, "ratio_to_cublas": 0.62}
    return {"name": "fc1 fprop", "m": 8192, "n": 21504, "k": 4096, **times, **extra}


def test_the_table_shows_the_fp32_epilogues_where_the_file_has_them():
    head = {"device": "GPU", "model": "probe_matched", "timing": "graphs"}
    before = table(head | {"shapes": [_shape()]})  # a file written before the epilogues were timed
    assert "fp32 alpha ms" not in before and "3.250" in before
    after = table(head | {"shapes": [_shape(fp32_device_alpha_ms=1.875, fp32_scale_cast_ms=2.125)]})
    header, row = after.splitlines()[1:]
    assert header.split()[-6:] == ["ratio", "fp32", "alpha", "ms", "fp32+cast", "ms"]
    assert row.split()[-2:] == ["1.875", "2.125"]
