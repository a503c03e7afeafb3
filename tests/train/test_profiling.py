"""Profiling training steps (``fp4repro train --profile-steps``): the table that sorts kernels into
parts, the FLOPs and MFU, the timeline's attribution of backward work to its forward module, and
the command end to end on a CPU."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from fp4repro.cli import main
from fp4repro.config.devices import load_devices
from fp4repro.config.model import load_model_config
from fp4repro.errors import ConfigError
from fp4repro.train.profiling import (
    LABELLED_MODULES,
    MODULE_LABEL,
    PARTS,
    Activity,
    DeviceTrace,
    ProfileWindow,
    busy_us,
    classify,
    flops_per_token,
    mfu,
    module_labels,
    part_of,
    split,
    timeline,
)
from fp4repro.util import OPTIMIZER_PHASE

#: (name, part) of kernels as a GPU profile names them (kernel_names.tsv says where they come from)
KERNELS = [
    tuple(reversed(line.split("\t", 1)))
    for line in (Path(__file__).with_name("kernel_names.tsv")).read_text().splitlines()
    if line and not line.startswith("#")
]


@pytest.mark.parametrize("name, part", KERNELS, ids=[re.sub(r"\W+", "_", n)[:48] for n, _ in KERNELS])
def test_each_kernel_goes_to_its_part_by_name(name, part):
    assert part_of(name) == part


@pytest.mark.parametrize(
    "name, within, part",
    [
        # what a GEMM operator launches is GEMM work, whatever its kernel is called
        ("a_kernel_no_rule_knows", ("aten::mm", "MmBackward0"), "gemm"),
        # even inside SDPA's math path (as the throughput census counts them); SDPA's own kernels
        # are the attention core's
        ("a_kernel_no_rule_knows", ("aten::bmm", "aten::_scaled_dot_product_attention_math"), "gemm"),
        ("a_kernel_no_rule_knows", ("aten::_efficient_attention_forward",), "attention"),
        # a norm's elementwise kernels are the norm's (the module's label, forward or backward)
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>>",
            ("aten::mul", MODULE_LABEL + "RMSNorm"),
            "norm",
        ),  # noqa: E501
        # the optimizer's phase takes its foreach kernels, its copies and its elementwise work
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            ("aten::fill_", OPTIMIZER_PHASE),
            "optimizer",
        ),  # noqa: E501
        ("Memcpy DtoD (Device -> Device)", ("aten::copy_", "Optimizer.step#AdamW.step"), "optimizer"),
        ("a_kernel_no_rule_knows", ("aten::_foreach_norm",), "optimizer"),
        # the compiled conv1d's generated kernels are the conv's (the module's label, forward or backward)
        (
            "triton_poi_fused_add_constant_pad_nd_mul_silu_0",
            ("CompiledFunction", MODULE_LABEL + "CausalConv1dSiLU"),
            "conv1d",
        ),
        # and the reference mixer's, with its splits, whose backward joins the gradients
        (
            "triton_poi_fused_add_cat_mul_silu_backward_1",
            ("CompiledFunctionBackward", MODULE_LABEL + "SplitCausalConv1dSiLU"),
            "conv1d",
        ),
        # the scan's autograd function takes the torch work around its kernels
        ("void at::native::reduce_kernel<512, 1>", ("aten::sum", "MambaChunkScanCombinedFnBackward"), "mamba_scan"),
        # a CPU profile's operators are classified by their own names
        ("aten::mm", ("aten::mm", "aten::linear"), "gemm"),
        ("aten::mkldnn_convolution", ("aten::mkldnn_convolution", "aten::convolution", "aten::conv1d"), "conv1d"),
        ("aten::_foreach_mul_", ("aten::_foreach_mul_",), "optimizer"),
        ("aten::copy_", ("aten::copy_", "aten::to"), "copies"),
        ("aten::mul", ("aten::mul",), "elementwise"),
        ("aten::view", ("aten::view", "aten::reshape"), "other"),
    ],
)
def test_the_operators_around_a_kernel_decide_where_its_name_does_not(name, within, part):
    assert part_of(name, within) == part


def test_the_rules_name_every_part_and_the_quantization_kernels_the_census_reads():
    from fp4repro.bench.throughput import CENSUS_RULES

    assert {classify(n).name for n in ("_quantize_kernel", "_amax_kernel", "_saturating_e4m3_kernel")} == set(
        CENSUS_RULES
    )
    assert part_of("x") == "other" and PARTS[-1] == "other"


def test_norm_modules_the_fp32_heads_and_the_compiled_conv_are_labelled_and_a_stack_named_for_its_norm_is_not():
    for name in ("RMSNorm", "GatedRMSNorm", "RMSNormGated", "LayerNorm", "TENorm"):
        assert LABELLED_MODULES.search(name), name
    for name in ("FP32OutputHead", "FP32OutputColumnParallelLinear", "CausalConv1dSiLU", "SplitCausalConv1dSiLU"):
        assert LABELLED_MODULES.search(name), name
    for name in (
        "TorchNormMambaStack",
        "Mamba2Mixer",
        "MambaMixer",
        "Conv1d",
        "NormalizationHelper",
        "ColumnParallelLinear",
        "Linear",
    ):
        assert not LABELLED_MODULES.search(name), name
    # a head's GEMM is the head's, a norm's kernel the norm's, however generic the kernel's name
    assert part_of("sm90_xmma_gemm_f32f32_f32", (MODULE_LABEL + "FP32OutputHead", "aten::mm")) == "lm_head"
    assert part_of("elementwise_kernel", (MODULE_LABEL + "RMSNorm", "aten::mul")) == "norm"
    assert part_of("sm90_xmma_gemm_bf16bf16_bf16", ("aten::mm",)) == "gemm"


def test_flops_per_token_of_the_tiny_model_counted_by_hand():
    tiny = load_model_config("tiny")  # "M-M*-", hidden 128, vocab 2,048
    # parameters without the input embedding (2,048 x 128):
    #   Mamba layer: in_proj 128 x (2·256 + 2·2·32 + 32) = 86,016; conv1d 384·4 + 384 = 1,920;
    #                dt_bias, A_log, D 3·32 = 96; gated norm 256; out_proj 256·128 = 32,768; norm 128
    #                = 121,184 (x2)
    #   MLP layer:   2 · 128 · 512 + norm 128 = 131,200 (x2)
    #   attention:   qkv 128 · (4 + 2·2)·32 = 32,768; o_proj 16,384; norm 128 = 49,280
    #   final norm 128, LM head 128 · 2,048 = 262,144
    n = 2 * 121_184 + 2 * 131_200 + 49_280 + 128 + 262_144
    assert n == 816_320
    # attention, causal, T = 16: 3 · 2 · T · (4 · 32) per token, one layer
    attention = 3 * 2 * 16 * 128
    # SSD per Mamba layer, Q = 16, G = 2, N = 32, H = 32, P = 8:
    #   3 · (2·Q·G·N + Q·H·P + 4·H·N·P) = 3 · (2,048 + 4,096 + 32,768) = 116,736
    scan = 2 * 116_736
    assert flops_per_token(tiny, seq_len=16) == {"dense": 6 * n, "with_attention_and_scan": 6 * n + attention + scan}


def test_mfu_of_a_hand_computed_step():
    # 6·N = 6e9 FLOPs per token at 41,200 tokens/s on one H200 (dense BF16 989 TFLOPS): 24.995%
    peak = load_devices().of_name("NVIDIA H200").peak_tflops["bf16"].mid
    assert peak == 989
    assert mfu(6e9, 41_200, peak) == pytest.approx(6e9 * 41_200 / 989e12)
    assert mfu(6e9, 41_200, peak) == pytest.approx(0.24995, abs=1e-5)
    assert mfu(6e9, 82_400, peak, gpus=2) == pytest.approx(mfu(6e9, 41_200, peak))
    assert mfu(6e9, 41_200, None) is None
    assert load_devices().of_name(None) is None  # a CPU has no peak


def _event(id, name, start, end, device=DeviceType.CPU, parent=None, scope=0, seq=-1, thread=1, fwd=0):
    e = FunctionEvent(
        id=id,
        name=name,
        thread=thread,
        start_us=start,
        end_us=end,
        fwd_thread=fwd,
        scope=scope,
        sequence_nr=seq,
        device_type=device,
        is_user_annotation=name.startswith("fp4repro::"),
    )
    if parent is not None:
        e.set_cpu_parent(parent)
    return e


def _kineto(correlation, name, start_us, end_us, device=DeviceType.CPU, linked=0, annotation=False):
    """What ``DeviceTrace.of`` reads of a ``torch._C._autograd._KinetoEvent`` (CUDA's profiler does
    not run on a CPU machine): times in ns from a trace that starts at 1,000 ns."""
    values = {
        "correlation_id": correlation,
        "name": name,
        "start_ns": 1000 + start_us * 1000,
        "end_ns": 1000 + end_us * 1000,
        "device_type": device,
        "linked_correlation_id": linked,
        "is_user_annotation": annotation,
    }
    return SimpleNamespace(**{method: (lambda v=v: v) for method, v in values.items()})


def _kineto_results(events):
    return SimpleNamespace(events=lambda: events, trace_start_ns=lambda: 1000)


def test_a_gpu_timeline_follows_each_kernel_to_its_operators_and_a_backward_kernel_to_its_forward_module():
    # forward: RMSNorm's aten::mul (autograd node 7) launches kernel 101; backward (another
    # thread): MulBackward0 for node 7 launches kernel 102; aten::mm launches a cuBLAS kernel
    # through a cudaLaunchKernel whose own correlation id is aten::mul's (2), as CUPTI's and the
    # framework's counters may collide
    label = _event(1, MODULE_LABEL + "RMSNorm", 0, 10)
    mul = _event(2, "aten::mul", 1, 2, parent=label, seq=7)
    mm = _event(3, "aten::mm", 11, 12, seq=8)
    launch = _event(2, "cudaLaunchKernel", 11.5, 11.8, parent=mm)
    node = _event(4, "autograd::engine::evaluate_function: MulBackward0", 20, 30, seq=7, thread=2, fwd=1)
    backward = _event(5, "MulBackward0", 20, 29, parent=node, scope=1, seq=7, thread=2, fwd=1)
    bmul = _event(6, "aten::mul", 21, 22, parent=backward, thread=2)
    operators = [label, mul, mm, launch, node, backward, bmul]
    elementwise = "void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>>"
    kineto = [
        *(_kineto(e.id, e.name, e.time_range.start, e.time_range.end) for e in operators if e is not launch),
        _kineto(2, "cudaLaunchKernel", 11.5, 11.8, linked=3),
        # the norm's range mirrored on the GPU's timeline: a span, not a kernel
        _kineto(1, MODULE_LABEL + "RMSNorm", 2, 4, DeviceType.CUDA, linked=1, annotation=True),
        _kineto(101, elementwise, 2, 4, DeviceType.CUDA, linked=2),
        _kineto(102, elementwise, 22, 25, DeviceType.CUDA, linked=6),
        _kineto(103, "nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", 12, 18, DeviceType.CUDA, linked=3),
        _kineto(104, "a_kernel_no_rule_knows", 30, 31, DeviceType.CUDA),
    ]
    device = DeviceTrace.of(_kineto_results(kineto))
    activities = timeline(operators, device)
    assert [a.name for a in activities] == [elementwise, elementwise, kineto[-2].name(), kineto[-1].name()]
    assert [part_of(a.name, a.within) for a in activities] == ["norm", "norm", "gemm", "other"]
    assert activities[0].within == ("aten::mul", MODULE_LABEL + "RMSNorm")
    assert activities[1].within[-1] == MODULE_LABEL + "RMSNorm"  # taken from the forward's ancestry
    assert activities[2].within == ("aten::mm",)  # the operator, not the runtime call sharing its id
    assert split(activities)["parts"] == {**dict.fromkeys(PARTS, 0.0), "norm": 5.0, "gemm": 6.0, "other": 1.0}
    assert busy_us(activities) == 12.0  # 2-4, 12-18, 22-25, 30-31


def test_a_parts_costliest_sources_name_the_operators_that_launched_its_kernels():
    cast = "vectorized_elementwise_kernel<8, bfloat16_copy_kernel_cuda>"
    weight_cast = ("aten::copy_", "aten::_to_copy", "aten::to", "aten::linear", MODULE_LABEL + "MLP")
    activities = [
        Activity(cast, 0, 3, 3.0, weight_cast),
        Activity(cast, 5, 7, 2.0, weight_cast),
        Activity(cast, 8, 12, 4.0, ("aten::copy_", "aten::_to_copy")),
        Activity("direct_copy_kernel_cuda", 12, 13, 1.0, ()),
    ]
    sources = split(activities)["costliest_sources"]
    assert sources == {
        "copies": [
            {"name": f"aten::copy_ < aten::_to_copy < aten::to < … < {MODULE_LABEL}MLP", "us": 5.0, "count": 2},
            {"name": "aten::copy_ < aten::_to_copy", "us": 4.0, "count": 1},
            {"name": "-", "us": 1.0, "count": 1},
        ]
    }
    assert split(activities)["costliest"]["copies"][0] == {"name": cast, "us": 9.0, "count": 3}


def test_a_cpu_timeline_puts_a_norms_backward_and_the_optimizer_phase_in_their_parts():
    class RMSNorm(torch.nn.Module):  # as the reference's: elementwise operators and a reduction
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(16))

        def forward(self, x):
            return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * self.weight

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), RMSNorm(), torch.nn.Linear(16, 16))
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 16)
    with (
        module_labels(model) as labelled,
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p,
    ):
        model(x).square().mean().backward()
        with torch.profiler.record_function(OPTIMIZER_PHASE):
            optimizer.step()
    assert labelled == 1
    assert not model[1]._forward_hooks and not model[1]._forward_pre_hooks  # removed after
    activities = timeline(p.events(), None)
    assert not [a for a in activities if a.name.startswith("fp4repro::")]  # ranges are not operators
    parts = {}
    for a in activities:
        parts.setdefault(part_of(a.name, a.within), set()).add(a.name)
    assert {"aten::rsqrt", "aten::pow"} <= parts["norm"]
    # the only products of the forward are RMSNorm's: their backward is the norm's, the loss's is not
    backward = [a for a in activities if "MulBackward0" in a.within]
    assert backward and {part_of(a.name, a.within) for a in backward} == {"norm"}
    loss = [a for a in activities if "PowBackward0" in a.within and MODULE_LABEL + "RMSNorm" not in a.within]
    assert loss and "norm" not in {part_of(a.name, a.within) for a in loss}
    assert {"aten::addmm", "aten::mm"} <= parts["gemm"]
    # AdamW's moment update, and nothing of the phase elsewhere
    assert "aten::addcmul_" in parts["optimizer"]
    assert {part_of(a.name, a.within) for a in activities if OPTIMIZER_PHASE in a.within} == {"optimizer"}
    assert busy_us(activities) == pytest.approx(sum(a.us for a in activities), rel=1e-6)


def test_the_fp32_heads_backward_gemms_are_the_heads_and_a_norms_cast_stays_out_of_it():
    from fp4repro.model.layers import FP32OutputHead, RMSNorm

    torch.manual_seed(0)
    # the first linear has a bias (addmm, AddmmBackward0), the head none (mm, MmBackward0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), RMSNorm(16), FP32OutputHead(16, 32, bias=False))
    x = torch.randn(8, 16)
    with (
        module_labels(model) as labelled,
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p,
    ):
        model(x).square().mean().backward()
    assert labelled == 2  # the norm and the head
    activities = timeline(p.events(), None)
    head_backward = [a for a in activities if "MmBackward0" in a.within]
    assert head_backward and {part_of(a.name, a.within) for a in head_backward} == {"lm_head"}
    first = [a for a in activities if "AddmmBackward0" in a.within]
    assert {part_of(a.name, a.within) for a in first if a.name == "aten::mm"} == {"gemm"}
    assert "lm_head" not in {part_of(a.name, a.within) for a in first}
    # the head's forward GEMM too; the norm's operators, forward and backward, stay the norm's
    head = {a.name for a in activities if part_of(a.name, a.within) == "lm_head"}
    assert "aten::mm" in head and not head & {"aten::rsqrt", "aten::pow"}


def test_a_node_is_traced_to_the_operator_that_created_it_not_to_an_earlier_one_sharing_its_number():
    # an operator that creates no autograd node records the number the next node takes: a norm's
    # closing no-op cast (in the norm) and the head's cast (in the head) share number 7; the cast
    # that began last made the node, and its composite parent (same number) is the operator
    from types import SimpleNamespace

    from fp4repro.train.profiling import _forward_ops

    def op(name, start, parent=None, seq=7):
        span = SimpleNamespace(start=start)
        return SimpleNamespace(
            name=name, scope=0, sequence_nr=seq, thread=1, time_range=span, cpu_parent=parent, is_user_annotation=False
        )

    norm_cast = op("aten::to", 1.0)
    head_to = op("aten::to", 2.0)
    head_copy = op("aten::_to_copy", 2.1, parent=head_to)
    other = op("aten::mm", 3.0, seq=8)
    forward = _forward_ops([norm_cast, head_to, head_copy, other])
    assert forward[7] is head_to and forward[(1, 7)] is head_to and forward[8] is other


@pytest.mark.parametrize("text", ["3", "0:2", "2:0", "a:b", "3:2:1", "-1:2"])
def test_a_window_is_two_whole_numbers_of_at_least_one(text):
    with pytest.raises(ConfigError, match=re.escape(f"--profile-steps: value {text!r}: START:COUNT")):
        ProfileWindow.parse(text)


def test_a_window_must_lie_in_the_steps_the_process_trains():
    window = ProfileWindow.parse(" 5 : 3 ")
    assert (window.start, window.count, window.last, str(window)) == (5, 3, 7, "5:3")
    window.check(1, 7)
    window.check(5, 7)
    with pytest.raises(
        ConfigError, match=r"--profile-steps: value 5:3: steps 5 to 7, but this process ends after step 6"
    ):
        window.check(1, 6)
    with pytest.raises(ConfigError, match=r"--profile-steps: value 5:3: the run resumes after step 5, so step 5"):
        window.check(6, 10)


def _files(out):
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def test_train_profiles_its_window_on_a_cpu_and_writes_nothing_else(guarded, tmp_path, capsys):
    path, data = guarded
    args = ["train", "--experiment", str(path), "--recipe", "bf16", "--data", str(data), "--quiet", "--stop-after", "4"]
    args += ["--device", "cpu"]  # the CPU timeline, also on a machine with a GPU
    plain, profiled = tmp_path / "plain", tmp_path / "profiled"
    assert main([*args, "--out", str(plain)]) == 0
    capsys.readouterr()
    assert main([*args, "--out", str(profiled), "--profile-steps", "3:2"]) == 0
    out = capsys.readouterr().out
    assert _files(profiled) == sorted([*_files(plain), "profile.json"])
    record = json.loads((profiled / "profile.json").read_text())
    assert record["steps"] == [3, 4] and record["telemetry_steps"] == [3, 4]  # guarded records every step
    assert record["device"] == "cpu" and record["timeline"] == "cpu operators"
    assert record["device_name"].startswith("cpu") and record["provenance"]["device"] == record["device_name"]
    assert (record["experiment"], record["recipe"], record["backend"], record["model"]) == (
        "guarded",
        "bf16",
        "reference",
        "tiny",
    )
    assert record["fused_kernels"] is False and record["deterministic"] is False
    assert record["tokens_per_step"] == 32 and len(record["step_s"]) == 2
    assert record["tokens_per_s"] == pytest.approx(32 / record["s_per_step"])
    assert record["s_per_step_unprofiled"] is not None  # step 2 (step 1 compiles)
    assert record["mfu"] == {"dense": None, "with_attention_and_scan": None}
    assert "no dense BF16 peak" in record["peak_bf16"]["why"]
    assert set(record["ms_per_step"]) == set(PARTS)
    assert record["ms_per_step"]["gemm"] > 0 and record["ms_per_step"]["optimizer"] > 0
    assert record["ms_per_step"]["norm"] > 0 and record["ms_per_step"]["attention"] > 0
    assert record["ms_per_step"]["lm_head"] > 0  # the tiny model's FP32 head, apart from the other GEMMs
    assert sum(record["ms_per_step"].values()) == pytest.approx(record["busy_ms_per_step"], rel=1e-6)
    assert record["host_gap_ms_per_step"] == pytest.approx(record["s_per_step"] * 1e3 - record["busy_ms_per_step"])
    assert record["costliest"]["gemm"][0]["name"] in ("aten::mm", "aten::addmm", "aten::bmm")
    assert "host gaps" in out and f"wrote {profiled / 'profile.json'}" in out


def test_a_window_the_process_does_not_reach_is_refused_before_any_folder_is_made(guarded, tmp_path, capsys):
    path, data = guarded
    out = tmp_path / "run"
    base = ["train", "--experiment", str(path), "--recipe", "bf16", "--data", str(data), "--out", str(out)]
    assert main([*base, "--stop-after", "3", "--profile-steps", "3:2"]) == 2
    assert capsys.readouterr().err == (
        "fp4repro train: error: --profile-steps: value 3:2: steps 3 to 4, but this process ends after step 3 "
        "(--stop-after or the experiment's total steps)\n"
    )
    assert main([*base, "--profile-steps", "3"]) == 2
    assert "--profile-steps: value '3': START:COUNT" in capsys.readouterr().err
    assert main([*base, "--profile-out", str(tmp_path / "p.json")]) == 2
    assert "--profile-out: value" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("name, backend", [("profile8b", "reference"), ("profile8b_megatron", "megatron")])
def test_the_profile_experiments_train_the_8bs_widths_and_record_nothing_in_steps_4_to_49(name, backend):
    from fp4repro.config.study import load_study, refresh_intervals
    from fp4repro.train.cadence import is_telemetry_step, refresh_steps_of

    study, big = load_study(name), load_model_config("nemotron_h_8b")
    exp, model = study.experiment, study.model
    assert exp.backend == backend and set(exp.recipes) == {"bf16", "ue5m3_torch_gemm", "nvfp4_gemm_fp32", "ue5m3"}
    assert (model.n_layers, model.vocab_size, exp.train.batch_size, exp.train.seq_len) == (9, 32_768, 1, 8_192)
    assert model.pattern == big.pattern[:9]
    widths = ("hidden_size", "mlp_hidden_size", "attn_heads", "attn_kv_heads", "attn_head_dim", "mamba_heads")
    widths += ("mamba_head_dim", "mamba_state_size", "mamba_groups", "mamba_conv_kernel", "mamba_chunk_size")
    assert {w: getattr(model, w) for w in widths} == {w: getattr(big, w) for w in widths}
    for recipe in exp.recipes:  # loop steps 3 .. 48 are steps 4 .. 49: no telemetry, no amax sample
        every, refresh = exp.train.telemetry_every, refresh_steps_of(study, recipe)
        assert not [s for s in range(3, 49) if is_telemetry_step(s, every, refresh)]
        assert all(k >= 49 for k in refresh_intervals(study.recipe(recipe), model))
