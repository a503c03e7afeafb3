"""The FP8 timing analogue on a GPU: the quantized layers' GEMMs run on FP8 tensor cores after the
recipe's quantization kernels, the exempt and BF16 layers' do not (the profiler's kernel census)."""

import pytest
import torch

from fp4repro.bench import throughput
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe

pytestmark = pytest.mark.gpu


def test_the_fp8_analogue_runs_the_quantizers_and_fp8_gemms_and_bf16_runs_neither():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need compute capability >= 8.9")
    recipes = {n: load_recipe(n) for n in ("bf16", "nvfp4", "nvfp4_no_bf16_tail")}
    result = throughput.run(load_model_config("tiny"), recipes, seq_len=256, steps=5, warmup=1,
                            progress=lambda m: None)
    for column in throughput.COLUMNS:
        census = {n: r["kernels"] for n, r in result["columns"][column]["recipes"].items()}
        assert census["bf16"]["quantize_launches"] == 0 and census["bf16"]["fp8_gemm_calls"] == 0
        assert census["nvfp4"]["quantize_launches"] > 0
        # the tail's layer quantizes too when it is not exempt
        assert census["nvfp4_no_bf16_tail"]["quantize_launches"] > census["nvfp4"]["quantize_launches"]
    assert "cast" in result["columns"]["fp8_analogue"]        # its record that the operands were clamped
    fp8 = {n: r["kernels"]["fp8_gemm_calls"] for n, r in result["columns"]["fp8_analogue"]["recipes"].items()}
    emulated = {n: r["kernels"]["fp8_gemm_calls"] for n, r in result["columns"]["emulated"]["recipes"].items()}
    # the analogue computes on finite numbers (q·s beyond E4M3's range is clamped, not NaN)
    from fp4repro.bench.fp8_gemm import fp8_timing_gemm
    from fp4repro.model import attach_recipe
    from fp4repro.quant.linear import gemm_instrument
    from fp4repro.quant.state import QuantState

    body = throughput.build_body(load_model_config("tiny"), recipes["nvfp4"], "cuda")
    attach_recipe(body, recipes["nvfp4_no_bf16_tail"], QuantState())
    x = torch.randn(1, 256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with gemm_instrument(fp8_timing_gemm):
        throughput.body_step(body, x, torch.randn_like(x))
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in body.parameters())
    # tiny: 5 layers, 10 internal linears, 3 GEMMs each; nvfp4 keeps layer 4 (2 linears) in BF16
    assert fp8 == {"bf16": 0, "nvfp4": 24, "nvfp4_no_bf16_tail": 30} and set(emulated.values()) == {0}
