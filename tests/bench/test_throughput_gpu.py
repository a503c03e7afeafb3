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
    fp8 = {n: r["kernels"]["fp8_gemm_calls"] for n, r in result["columns"]["fp8_analogue"]["recipes"].items()}
    emulated = {n: r["kernels"]["fp8_gemm_calls"] for n, r in result["columns"]["emulated"]["recipes"].items()}
    # tiny: 5 layers, 10 internal linears, 3 GEMMs each; nvfp4 keeps layer 4 (2 linears) in BF16
    assert fp8 == {"bf16": 0, "nvfp4": 24, "nvfp4_no_bf16_tail": 30} and set(emulated.values()) == {0}
