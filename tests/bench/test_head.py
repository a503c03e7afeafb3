"""``fp4repro bench head`` on a CPU: the shapes it times, and the error check it records (its
timings need a GPU: tests/model/test_head_gemm.py runs the GEMMs there)."""

import zlib

import torch

from fp4repro.bench.head import error_over_bound, head_gemms, table, training_shapes
from fp4repro.cli import main


def _operands(tokens=64, hidden=96, vocab=160):
    g = torch.Generator().manual_seed(zlib.crc32(b"bench head"))
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    w = torch.randn(vocab, hidden, generator=g).to(torch.bfloat16)
    return x, w, torch.randn(tokens, vocab, generator=g) * torch.exp2(torch.randint(-20, 20, (tokens, vocab)).float())


def test_the_shapes_are_the_small_studys_and_the_8b_widths_training_steps():
    # small: 8 x 2,048 tokens, hidden 768; profile8b: 1 x 8,192, hidden 4,096; both a 32,768 vocabulary
    assert training_shapes() == {
        "small x 16384": (16384, 768, 32768),
        "nemotron_h_8b_9l x 8192": (8192, 4096, 32768),
    }


def test_ieee_and_the_split_stay_within_fp32_summations_bound_and_a_bf16_gradient_does_not():
    x, w, g = _operands()
    for way in ("fp32_ieee", "bf16_split"):
        y, dx, dw = head_gemms(way, x, w, g)
        assert (y.shape, dx.shape, dw.shape) == ((64, 160), (64, 96), (160, 96))
        assert error_over_bound(way, x, w, g) <= 1.0
    # the gradient rounded to BF16 (what a plain BF16 backward would multiply) is far outside it
    rounded = head_gemms("fp32_ieee", x, w, g.to(torch.bfloat16).float())[1].double()
    exact = g.double() @ w.double()
    assert ((rounded - exact).abs() / ((96 + 1) * 2.0**-24 * (g.double().abs() @ w.double().abs()))).max() > 10


def test_the_table_names_each_shape_and_way():
    rows = [
        {
            "shape": "small x 16384",
            "way": w,
            "ms": ms,
            "tflops": 1.0,
            "over_ieee": ms / 48.0,
            "worst_error_over_bound": 0.1,
        }
        for w, ms in (("fp32_ieee", 48.0), ("bf16_split", 16.0))
    ]
    text = table({"device": "NVIDIA H200", "rounds": 5, "rows": rows})
    assert "small x 16384               bf16_split      16.00" in text and "0.333" in text


def test_without_a_gpu_it_says_what_it_needs(capsys):
    assert main(["bench", "head"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
