"""The body's work per recipe, counted from tiny's shapes: the numbers below are worked out by hand
from the linears' sizes (in x out: in_proj 128x672 and out_proj 256x128 in layers 0 and 2, fc1
128x512 and fc2 512x128 in layers 1 and 4, qkv 128x256 and o_proj 128x128 in layer 3)."""

from fp4repro.bench.body_work import body_work, kernel_case, summary
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe
from fp4repro.config.spec import QuantSpec

T = 64
PARAMS = 2 * 128 * 672 + 2 * 256 * 128 + 2 * 128 * 512 + 2 * 512 * 128 + 128 * 256 + 128 * 128  # 548,864
TAIL = 128 * 512 + 512 * 128  # layer 4


def test_nvfp4_runs_its_tail_in_bf16_and_quantizes_five_operands_per_linear_with_current_amaxes():
    gemms, quants = body_work(load_model_config("tiny"), load_recipe("nvfp4"), tokens=T)
    s = summary(gemms, quants)
    assert PARAMS == 548_864 and len(gemms) == 30
    assert s["gemm_flops"] == {"fp4": 6 * T * (PARAMS - TAIL), "bf16": 6 * T * TAIL}
    sum_in, sum_out = 1664, 2624  # over the 8 quantized linears
    assert s["quantized_elements"] == {
        "1x16 RNE": T * sum_in,  # fprop.x
        "16x16 RNE": PARAMS - TAIL,  # fprop.w; dgrad.w is its transpose (no pass)
        "1x16 SR": T * sum_out,  # dgrad.dy
        "1x16 RHT+SR, column-wise": T * sum_out,  # wgrad.dy
        "1x16 RHT, column-wise": T * sum_in,
    }  # wgrad.x
    assert s["amax_elements"] == 2 * T * sum_in + (PARAMS - TAIL) + 2 * T * sum_out
    assert s["linears"] == {"fp4": 8, "bf16": 2}


def test_the_papers_8b_runs_96_fp4_and_16_bf16_linears_under_nvfp4_and_112_fp4_without_the_tail():
    # the paper's native ablation (docs/technical_report/main.tex, table tab:runtime): Transformer
    # Engine's recipe with 96 FP4 and 16 BF16 linears against no RHT and all 112 linears FP4
    config = load_model_config("nemotron_h_8b_paper")
    linears = {
        name: summary(*body_work(config, load_recipe(name), tokens=1024))["linears"]
        for name in ("nvfp4", "nvfp4_no_rht_no_bf16_tail", "bf16")
    }
    assert linears == {
        "nvfp4": {"fp4": 96, "bf16": 16},
        "nvfp4_no_rht_no_bf16_tail": {"fp4": 112, "bf16": 0},
        "bf16": {"fp4": 0, "bf16": 112},
    }


def test_ue5m3_quantizes_every_linear_with_held_amaxes_and_bf16_quantizes_nothing():
    config = load_model_config("tiny")
    s = summary(*body_work(config, load_recipe("ue5m3"), tokens=T))
    assert s["gemm_flops"] == {"fp4": 6 * T * PARAMS} and s["amax_elements"] == 0
    assert sum(s["quantized_elements"].values()) > 0
    gemms, quants = body_work(config, load_recipe("bf16"), tokens=T)
    assert summary(gemms, quants) == {
        "gemm_flops": {"bf16": 6 * T * PARAMS},
        "linears": {"fp4": 0, "bf16": 10},
        "quantized_elements": {},
        "amax_elements": 0,
    }
    wgrad = next(g for g in gemms if g.linear == "layers.0.mixer.in_proj" and g.gemm == "wgrad")
    assert (wgrad.m, wgrad.n, wgrad.k) == (672, 128, T)


def test_kernel_cases_are_named_as_the_kernel_benchmark_names_them():
    assert kernel_case(QuantSpec(), False) == "1x16 RNE"
    assert kernel_case(QuantSpec(rht=True, rounding="sr"), True) == "1x16 RHT+SR, column-wise"
    assert kernel_case(QuantSpec(rht=True), False) == "1x16 RHT"
    assert (
        kernel_case(QuantSpec(scale="ue8m0", block=(1, 32), target=None, scale_rounding="up"), False)
        == "1x32 RNE UE8M0"
    )


def test_a_weight_quantized_again_for_dgrad_is_read_column_wise():
    # mxfp4's 1x32 weights are not transposable (not square): dgrad quantizes Wᵀ, a transposed view
    _, quants = body_work(load_model_config("tiny"), load_recipe("mxfp4"), tokens=T)
    dgrad_w = [q for q in quants if q.operand == "dgrad.w"]
    assert len(dgrad_w) == 10 and {q.case for q in dgrad_w} == {"1x32 RNE UE8M0, column-wise"}
    assert sum(q.elements for q in dgrad_w) == PARAMS
    assert {q.case for q in quants if q.operand == "fprop.w"} == {"1x32 RNE UE8M0"}
