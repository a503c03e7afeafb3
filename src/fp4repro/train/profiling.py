"""Where a training step's time goes: ``fp4repro train --profile-steps START:COUNT``.

``StepProfiler`` runs ``torch.profiler`` over COUNT optimizer steps of the loop from step START
(counted as metrics.parquet's ``step``, from 1) and writes one JSON: the steps, their wall
seconds, tokens/s, model FLOPs utilization and the device time per step of each part of the step.
Nothing else the run writes changes (the profiled steps' ``tokens_per_s`` include the profiler's
own cost; the record has the steps before the window too, unprofiled).

**Timeline.** On a GPU, the device's activities: every kernel, memcpy and memset, each with its
duration and the operators that launched it (the innermost one and its parents). On a CPU the
profiler sees operators only: each operator's self time (its time less its children's), with
itself and its parents as the operators around it; ``record_function`` ranges are not operators
and count for nothing. ``busy`` is the union of the timeline's intervals over the window; the
**host gap** is the window's wall time less that: time the device did nothing (launch overhead,
synchronizations, Python, data) on a GPU, interpreter time between operators on a CPU.

**Parts** (``PARTS``). Each activity goes to the part of the first rule of ``RULES`` that matches
it: a rule matches by the activity's name (``kernel``, a regular expression searched in it) or by
an operator around it (``within``, searched in each of their names). A backward operator also
carries the module labels of the forward operator it differentiates (autograd's sequence number
pairs them), so that a norm's backward kernels count as the norm's. Norm modules and the FP32 LM
head get a label (``MODULE_LABEL``) for the profiled steps only (``module_labels``): the
reference's and megatron's RMSNorms are elementwise operators and a reduction, anonymous
otherwise, and the head's GEMMs (``lm_head``: FP32 products, forward and backward, with the
gradient's split and the casts) would be GEMMs among the others. The engines
mark their optimizer phase (``fp4repro.util.OPTIMIZER_PHASE``). What no rule matches is
``other``; the record lists each part's costliest kernels, so that ``other`` can be read, and its
costliest sources (the operators that launched them: ``source``), so that a part's time can be
traced to the code that spends it.

**FLOPs and MFU.** ``flops_per_token`` counts two ways. ``dense``: 6·N, N the parameters without
the input embedding (the LM head included: its GEMM runs every step), forward and backward of
every weight once per token. ``with_attention_and_scan``: that plus the attention core, causal
(QKᵀ and AV over the T²/2 pairs of a sequence of T tokens: 2·T·d forward per token and layer,
d = heads · head dim, backward twice that), and the Mamba-2 SSD scan in chunks of Q (forward per
token and layer: C·Bᵀ within a chunk 2·Q·G·N, its causal product with X Q·H·P, the chunk states
and the states' outputs 2·H·N·P each; backward twice that), with H heads of dimension P, G
groups and state size N. The conv1d, norms and elementwise work are not counted. MFU =
FLOPs/token · tokens/s / (the device's dense BF16 peak from ``configs/devices.yaml`` · GPUs): the
quantized recipes emulate FP4 on BF16 tensor cores, so BF16 is their peak too. Without a peak for
the device (a CPU) MFU is null and the record says why.
"""

from __future__ import annotations

import contextlib
import functools
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fp4repro.config.model import ModelConfig
from fp4repro.config.study import Study
from fp4repro.errors import ConfigError
from fp4repro.train.engine import Engine

# ---------------------------------------------------------------------------------------------
# The classification table


#: The parts of a step, in the order tables show them.
PARTS = (
    "lm_head",
    "gemm",
    "mamba_scan",
    "conv1d",
    "attention",
    "norm",
    "quantization",
    "optimizer",
    "communication",
    "copies",
    "elementwise",
    "other",
)

#: The operators whose kernels are GEMMs (``fp4repro bench throughput``'s census counts their calls
#: too); composite ones (linear, matmul) are left out: their copies are not GEMM work.
GEMM_OPERATORS = ("aten::mm", "aten::addmm", "aten::_scaled_mm", "aten::bmm", "aten::baddbmm")

#: The label of a norm's or the LM head's forward while a step is profiled (``module_labels``).
MODULE_LABEL = "fp4repro::module::"

#: The modules labelled, by their class name: norms (RMSNorm, GatedRMSNorm, mamba-ssm's
#: RMSNormGated, LayerNorm, TENorm), anchored at the end so that a stack named for its norm
#: (TorchNormMambaStack) is not one; the FP32 LM heads (the reference's FP32OutputHead,
#: megatron's FP32OutputColumnParallelLinear), whose FP32 GEMMs are a part of their own; and the
#: compiled conv1d ((Split)CausalConv1dSiLU), whose generated kernels are named for their operators.
LABELLED_MODULES = re.compile(r"Norm(Gated)?$|^FP32Output|^(Split)?CausalConv1dSiLU$")


@dataclass(frozen=True)
class Rule:
    """One row of the table: activities it matches go to ``part``; ``name`` says which rule it
    was (``fp4repro bench throughput``'s census reads the quantization rules by name)."""

    part: str
    name: str
    kernel: str | None = None  # searched in the activity's own name
    within: str | None = None  # searched in the names of the operators around it

    def matches(self, name: str, within: tuple[str, ...]) -> bool:
        if self.kernel is not None and re.search(self.kernel, name):
            return True
        return self.within is not None and any(re.search(self.within, op) for op in within)


_NOT_IN_NAME = r"(?<![A-Za-z0-9])"  # a kernel name's start, or after a namespace or a space
_GEMM_WITHIN = "^(" + "|".join(re.escape(op) for op in GEMM_OPERATORS) + ")$"

#: The table, first match wins: what a name could be mistaken for comes after what it is (cuDNN's
#: convolutions are "implicit_gemm" kernels, so conv1d precedes gemm; a norm's or the optimizer's
#: copies are theirs, so they precede copies; a cast is a copy before it is an elementwise kernel).
RULES = (
    # collectives first: a tensor-parallel head or linear runs them within its own labels
    Rule("communication", "collectives", kernel=r"nccl", within=r"^(nccl:|c10d::|record_param_comms)"),
    # the LM head in FP32 (forward and backward): seven GEMMs of FP32 products (fp4repro.model.
    # head_gemm), the gradient's split and the casts, its time shown apart from the other GEMMs
    Rule("lm_head", "lm_head", within="^" + re.escape(MODULE_LABEL) + "FP32Output"),
    # this suite's Triton kernels (fp4repro.kernels)
    Rule("quantization", "quantize", kernel=_NOT_IN_NAME + r"_quantize_kernel"),
    Rule("quantization", "amax", kernel=_NOT_IN_NAME + r"_amax(_with_rht)?_kernel"),
    Rule("quantization", "fp8_cast", kernel=_NOT_IN_NAME + r"_saturating_e4m3_kernel"),
    Rule("quantization", "sr_uniforms", kernel=_NOT_IN_NAME + r"_philox_uniform_kernel"),
    Rule("gemm", "probe_matched_gemm", kernel=_NOT_IN_NAME + r"_probe_matched_gemm_kernel"),
    Rule("gemm", "gemm_epilogue", kernel=_NOT_IN_NAME + r"_scale_cast_kernel"),
    # the depthwise causal conv1d of the Mamba mixer (cuDNN, torch's depthwise kernels, causal-conv1d,
    # the compiled conv1d and SiLU of train.compiled_conv1d)
    Rule(
        "conv1d",
        "convolution",
        kernel=r"conv1d|conv2d|conv_depthwise|convolve|dgrad2d|wgrad2d|implicit_gemm|causal_conv",
        within=r"^aten::\w*(conv\dd|convolution|conv_depthwise)|^ConvolutionBackward|^"
        + re.escape(MODULE_LABEL)
        + "(Split)?CausalConv1dSiLU$",
    ),
    # cuBLAS (sm90_xmma_gemm_*, nvjet_*, ampere_*gemm*, gemv, split-K reductions), CUTLASS, and
    # every kernel a GEMM operator launches
    Rule("gemm", "gemm", kernel=r"gemm|gemv|nvjet|splitKreduce", within=_GEMM_WITHIN),
    # mamba-ssm's SSD: the chunked scan's Triton kernels, and the torch work of its autograd function
    Rule(
        "mamba_scan",
        "ssd",
        kernel=_NOT_IN_NAME + r"_(chunk_(scan|state|cumsum)|state_passing|bmm_chunk)_\w*kernel",
        within=r"^Mamba(ChunkScanCombined|SplitConv1dScanCombined)Fn",
    ),
    # SDPA: flash, memory-efficient (fmha_cutlass*), cuDNN's, and whatever its operators launch
    Rule(
        "attention",
        "attention",
        kernel=r"flash|fmha|[Aa]ttention|sdpa",
        within=r"scaled_dot_product|_flash_attention|_efficient_attention|_cudnn_attention|ScaledDotProduct",
    ),
    # mamba-ssm's gated RMSNorm (_layer_norm_fwd_1pass_kernel, _layer_norm_bwd_kernel), torch's
    # layer/RMS norm kernels, and everything a labelled norm module launches, forward and backward
    Rule(
        "norm",
        "norm",
        kernel=r"layer_norm|rms_norm|LayerNorm|RMSNorm|RmsNorm|GammaBeta|RowwiseMoments",
        within="^" + re.escape(MODULE_LABEL) + r"\w*Norm|^aten::(native_layer_norm|layer_norm|rms_norm|_fused_rms_norm)"
        r"|LayerNormBackward|RmsNormBackward|^LayerNormFn",
    ),
    # the engines' optimizer phase, torch's optimizer steps, foreach ops (the gradient norm) and
    # their multi-tensor kernels
    Rule(
        "optimizer",
        "optimizer",
        kernel=r"multi_tensor_apply|lpnorm_cleanup|[Aa]dam",
        within=r"^fp4repro::optimizer$|^Optimizer\.(step|zero_grad)|^aten::_foreach_|^aten::_fused_adam",
    ),
    # transfers, fills, dtype casts, contiguous copies and concatenation
    Rule(
        "copies",
        "copies",
        kernel=r"^Memcpy|^Memset|direct_copy|copy_kernel|CatArrayBatchedCopy",
        within=r"^aten::(copy_|_to_copy|clone|contiguous|cat|_copy_from|_copy_from_and_resize)$",
    ),
    # torch's pointwise, reduction, softmax and loss, indexing and embedding kernels; on a CPU the
    # operators that run them
    Rule(
        "elementwise",
        "elementwise",
        kernel=r"elementwise_kernel|reduce_kernel|[Ss]oft[Mm]ax|nll_loss|cross_entropy|[Ii]ndex|scatter|gather"
        r"|embedding|triton_(poi|red|per)_|cumsum|scan_kernel|fill_kernel",
        within=r"^aten::(add|sub|mul|div|neg|exp|expm1|log|log1p|pow|sqrt|rsqrt|square|sigmoid|silu|softplus|relu"
        r"|tanh|gelu|where|clamp|clamp_min|maximum|minimum|abs|sum|mean|amax|max|min|cumsum|softmax|_softmax"
        r"|log_softmax|_log_softmax|nll_loss\w*|cross_entropy_loss|embedding\w*|index\w*|fill_|zero_|masked_fill"
        r"|tril|triu|exp_|mul_|add_|div_|sub_|\w+_backward)_?$",
    ),
)


@functools.lru_cache(maxsize=1 << 16)  # a profile repeats its names and operators step after step
def classify(name: str, within: tuple[str, ...] = (), rules: tuple[Rule, ...] = RULES) -> Rule | None:
    """The first rule that matches an activity named ``name`` launched within the operators
    ``within`` (innermost first); None: ``other``."""
    for rule in rules:
        if rule.matches(name, within):
            return rule
    return None


def part_of(name: str, within: tuple[str, ...] = ()) -> str:
    """The part (``PARTS``) of an activity."""
    rule = classify(name, within)
    return "other" if rule is None else rule.part


# ---------------------------------------------------------------------------------------------
# The timeline of a profile


@dataclass(frozen=True)
class Activity:
    """One piece of the timeline: a kernel (GPU) or an operator's self time (CPU)."""

    name: str
    start_us: float
    end_us: float
    us: float  # its time: the kernel's duration, the operator's self time
    within: tuple[str, ...]  # the operators around it, innermost first, and its forward's labels


def _ancestry(event) -> list:
    chain = []
    while event is not None:
        chain.append(event)
        event = event.cpu_parent
    return chain


def _backward_scope(event) -> bool:
    """An autograd node's backward (``MulBackward0`` within ``autograd::engine::evaluate_function``)."""
    return event.scope == 1 and event.sequence_nr >= 0


def _forward_ops(events) -> dict:
    """(thread, sequence number) and sequence number alone -> the outermost forward operator that
    created that autograd node (by number alone, of any thread). An operator that creates no node
    records the number the next node will take, so several operators share one: the last one to
    begin created the node (the first may be a no-op cast at the end of the module before), and
    the operators around it with the same number are the composite ones it ran within."""
    forward = {}
    for e in events:
        if e.scope != 0 or e.sequence_nr < 0 or e.name.startswith("autograd::") or e.is_user_annotation:
            continue
        for key in ((e.thread, e.sequence_nr), e.sequence_nr):
            if key not in forward or e.time_range.start > forward[key].time_range.start:
                forward[key] = e
    for key, op in forward.items():
        while op.cpu_parent is not None and op.cpu_parent.sequence_nr == op.sequence_nr:
            op = op.cpu_parent
        forward[key] = op
    return forward


@dataclass(frozen=True)
class DeviceActivity:
    """A kernel, memcpy or memset as the GPU ran it, in microseconds from the trace's start (as
    ``FunctionEvent``'s times), and ``launched_by``: the correlation id of the operator that
    launched it (0: none known)."""

    name: str
    start_us: float
    end_us: float
    launched_by: int


@dataclass(frozen=True)
class DeviceTrace:
    """What a GPU profile knows beyond its operators (``prof.events()``): the device's activities
    and which operators launched them, read from the profiler's kineto results
    (``torch.profiler.profile().profiler.kineto_results``), where every torch version keeps the
    link (``FunctionEvent`` carries it only from torch 2.13). ``launchers``: (id, start µs) of the
    framework's operators; a CUDA runtime call (cudaLaunchKernel) is linked to one of them and may
    share its id, so an id alone does not name an operator."""

    activities: tuple[DeviceActivity, ...]
    launchers: frozenset[tuple[int, float]]

    @classmethod
    def of(cls, results) -> DeviceTrace:
        """From a ``_ProfilerResult``. The device's user-annotation spans (``record_function``
        ranges mirrored on the GPU's timeline, ``gpu_user_annotation``) are not activities: a
        module's span over its kernels would count their time twice."""
        cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
        t0, activities, launchers = results.trace_start_ns(), [], set()
        for k in results.events():
            start, end = (k.start_ns() - t0) / 1000, (k.end_ns() - t0) / 1000  # as FunctionEvent's
            if k.device_type() == cuda and not k.is_user_annotation():
                activities.append(DeviceActivity(k.name(), start, end, k.linked_correlation_id()))
            elif k.device_type() == cpu and k.linked_correlation_id() == 0:
                launchers.add((k.correlation_id(), start))
        return cls(tuple(activities), frozenset(launchers))


def timeline(events, device: DeviceTrace | None) -> list[Activity]:
    """The profile's activities: with a ``device`` trace, its kernels, memcpys and memsets; on a
    CPU (None) each operator's self time. ``events``: the profile's operators (``prof.events()``).
    Each activity carries the names of the operators around it and, where one of them is a
    backward node, the module labels of the forward operator it differentiates."""
    cpu_type = torch.autograd.DeviceType.CPU
    events = [e for e in events if e.device_type == cpu_type and not e.is_async]
    forward = _forward_ops(events)

    def within(op) -> tuple[str, ...]:
        chain = _ancestry(op)
        names = [e.name for e in chain]
        for e in chain:
            if _backward_scope(e):
                # autograd's thread ids pair a node with its forward; the number alone where they do not
                f = forward.get((e.fwd_thread, e.sequence_nr)) or forward.get(e.sequence_nr)
                names += [a.name for a in _ancestry(f) if a.name.startswith(MODULE_LABEL)] if f is not None else []
        return tuple(names)

    if device is not None:
        ops = {e.id: e for e in events if (e.id, e.time_range.start) in device.launchers}
        return [
            Activity(
                a.name,
                a.start_us,
                a.end_us,
                a.end_us - a.start_us,
                within(ops[a.launched_by]) if a.launched_by in ops else (),
            )
            for a in device.activities
        ]
    return [
        Activity(e.name, e.time_range.start, e.time_range.end, e.self_cpu_time_total, within(e))
        for e in events
        if not e.is_user_annotation and e.self_cpu_time_total > 0
    ]


def busy_us(activities: list[Activity]) -> float:
    """The length of the union of the activities' intervals (nested or overlapping ones once)."""
    total, end = 0.0, -float("inf")
    for a in sorted(activities, key=lambda a: a.start_us):
        if a.end_us > end:
            total += a.end_us - max(a.start_us, end)
            end = a.end_us
    return total


def source(within: tuple[str, ...], depth: int = 3) -> str:
    """Where an activity comes from, as a profile's reader needs it to find the code: the
    ``depth`` innermost operators around it, innermost first, and the outermost one (a backward
    node, a module label, the optimizer's phase) where the chain is longer; "-" for none."""
    if not within:
        return "-"
    shown = within if len(within) <= depth + 1 else (*within[:depth], "…", within[-1])
    return " < ".join(shown)


def split(activities: list[Activity], top: int = 5) -> dict:
    """Microseconds per part (every part of ``PARTS``, zero where nothing ran), per rule, and each
    part's ``top`` costliest activity names and ``top`` costliest sources (``source``) with their
    microseconds and counts."""
    parts = dict.fromkeys(PARTS, 0.0)
    rules: dict[str, float] = {}
    names: dict[str, dict[str, list]] = {p: {} for p in PARTS}
    sources: dict[str, dict[str, list]] = {p: {} for p in PARTS}
    for a in activities:
        rule = classify(a.name, a.within)
        part = "other" if rule is None else rule.part
        parts[part] += a.us
        if rule is not None:
            rules[f"{rule.part}/{rule.name}"] = rules.get(f"{rule.part}/{rule.name}", 0.0) + a.us
        for table, key in ((names, a.name), (sources, source(a.within))):
            entry = table[part].setdefault(key, [0.0, 0])
            entry[0] += a.us
            entry[1] += 1
    return {
        "parts": parts,
        "rules": rules,
        "costliest": _costliest(names, top),
        "costliest_sources": _costliest(sources, top),
    }


def _costliest(table: dict[str, dict[str, list]], top: int) -> dict[str, list[dict]]:
    return {
        p: [{"name": n[:200], "us": us, "count": c} for n, (us, c) in sorted(v.items(), key=lambda kv: -kv[1][0])[:top]]
        for p, v in table.items()
        if v
    }


# ---------------------------------------------------------------------------------------------
# FLOPs


def non_embedding_parameters(config: ModelConfig) -> int:
    """The model's parameters without the input embedding (counted on the meta device: no memory)."""
    from fp4repro.model import NemotronH

    with torch.device("meta"):
        model = NemotronH(config, None)
    return sum(p.numel() for p in model.parameters()) - model.embedding.weight.numel()


def flops_per_token(config: ModelConfig, seq_len: int) -> dict[str, int]:
    """Training FLOPs per token, ``dense`` (6·N) and ``with_attention_and_scan`` (the module
    docstring says what each counts)."""
    n = non_embedding_parameters(config)
    types = config.layer_types
    attention = 3 * 2 * seq_len * config.attn_heads * config.attn_head_dim * types.count("attention")
    q, h, p = config.mamba_chunk_size, config.mamba_heads, config.mamba_head_dim
    g, s = config.mamba_groups, config.mamba_state_size
    scan = 3 * (2 * q * g * s + q * h * p + 4 * h * s * p) * types.count("mamba")
    return {"dense": 6 * n, "with_attention_and_scan": 6 * n + attention + scan}


def mfu(flops: int, tokens_per_s: float, peak_tflops: float | None, gpus: int = 1) -> float | None:
    """Model FLOPs utilization: flops · tokens/s over ``gpus`` devices of ``peak_tflops``; None
    without a peak."""
    if peak_tflops is None:
        return None
    return flops * tokens_per_s / (peak_tflops * 1e12 * gpus)


# ---------------------------------------------------------------------------------------------
# The window and the profiler


@dataclass(frozen=True)
class ProfileWindow:
    """COUNT optimizer steps from step START (metrics.parquet's ``step``, from 1)."""

    start: int
    count: int

    @classmethod
    def parse(cls, text: str, option: str = "--profile-steps") -> ProfileWindow:
        """``START:COUNT``; a ConfigError naming ``option`` (the flag that gave it) otherwise."""
        match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
        if match is None or int(match.group(1)) < 1 or int(match.group(2)) < 1:
            raise ConfigError(
                f"{option}: value {text!r}: START:COUNT, two whole numbers of at least 1 (profile "
                "COUNT optimizer steps from step START, counted from 1 as metrics.parquet's step)"
            )
        return cls(int(match.group(1)), int(match.group(2)))

    @property
    def last(self) -> int:
        return self.start + self.count - 1

    def __str__(self) -> str:
        return f"{self.start}:{self.count}"

    def check(self, first: int, end: int, option: str = "--profile-steps") -> None:
        """A ConfigError (naming ``option``) unless this process trains every step of the window:
        it trains steps ``first`` .. ``end`` (from 1)."""
        if self.start < first:
            raise ConfigError(
                f"{option}: value {self}: the run resumes after step {first - 1}, so step {self.start} "
                f"is not trained again; profile from step {first} or later, or train into a fresh --out"
            )
        if self.last > end:
            raise ConfigError(
                f"{option}: value {self}: steps {self.start} to {self.last}, but this process ends after "
                f"step {end} (--stop-after or the experiment's total steps)"
            )


@contextlib.contextmanager
def module_labels(model: torch.nn.Module, pattern: re.Pattern = LABELLED_MODULES):
    """Within this context, the forward of every module of ``model`` whose class name matches
    ``pattern`` runs in a profiler range ``MODULE_LABEL + class name`` (hooks removed after)."""
    from torch.autograd.profiler import record_function

    handles = []
    for module in model.modules():
        kind = type(module).__name__
        if not pattern.search(kind):
            continue
        open_ranges: list = []

        def enter(_module, _args, label=MODULE_LABEL + kind, open_ranges=open_ranges):
            open_ranges.append(record_function(label).__enter__())

        def leave(_module, _args, _output, open_ranges=open_ranges):
            if open_ranges:
                open_ranges.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]
    try:
        yield len(handles) // 2
    finally:
        for handle in handles:
            handle.remove()


class StepProfiler:
    """Profiles the window's steps of one training process (the loop calls ``before`` and
    ``after`` around every step) and writes the record to ``out`` when the window ends (only
    ``writer`` writes and prints). ``meta``: what the record says about the run."""

    def __init__(
        self,
        window: ProfileWindow,
        out: Path,
        model: torch.nn.Module,
        config: ModelConfig,
        tokens_per_step: int,
        seq_len: int,
        device: str,
        writer: bool,
        meta: dict,
    ):
        self.window, self.out, self.model, self.config, self.meta = window, Path(out), model, config, meta
        self.tokens_per_step, self.seq_len, self.device, self.writer = tokens_per_step, seq_len, device, writer
        self.cuda = torch.device(device).type == "cuda"
        self.steps_seen = 0
        self.before_window: list[float] = []  # this process's steps before the window, its first left out
        self.step_seconds: list[float] = []
        self.telemetry_steps: list[int] = []
        self._profile = self._labels = self._events = self._device = None
        self._started = 0.0
        self.record: dict | None = None  # what was written

    @classmethod
    def of_run(
        cls,
        window: ProfileWindow,
        out: Path,
        engine: Engine,
        study: Study,
        recipe: str,
        seed: int,
        fingerprint: str,
        device: str,
    ) -> StepProfiler:
        """The profiler of one run of ``study`` that ``engine`` (``fp4repro.train.engine.Engine``)
        trains on ``device``; the record names the run."""
        t = study.experiment.train
        meta = {
            "experiment": study.name,
            "recipe": study.recipe(recipe).name,
            "seed": seed,
            "backend": study.experiment.backend,
            "model": study.model.name,
            "fingerprint": fingerprint,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "fused_kernels": t.fused_kernels,
            "compiled_conv1d": t.compiled_conv1d,
        }
        return cls(window, out, engine.model, study.model, t.tokens_per_step, t.seq_len, device, engine.writer, meta)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def before(self, step: int) -> None:
        """Before loop step ``step`` (from 0): the profile starts before the window's first step,
        once the device has finished the steps before it."""
        if step + 1 != self.window.start:
            return
        from torch.profiler import ProfilerActivity, profile

        self._labels = module_labels(self.model)
        self._labels.__enter__()
        self._profile = profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if self.cuda else [])])
        self._sync()
        self._profile.__enter__()
        self._started = time.perf_counter()

    def after(self, step: int, seconds: float, telemetry: bool = False) -> None:
        """After loop step ``step`` took ``seconds``; ``telemetry``: it recorded telemetry. The
        window's last step stops the profile and writes the record."""
        number = step + 1
        self.steps_seen += 1
        if number < self.window.start:
            if self.steps_seen > 1:  # the process's first step compiles and autotunes
                self.before_window.append(seconds)
            return
        if number > self.window.last or self._profile is None:
            return
        self.step_seconds.append(seconds)
        if telemetry:
            self.telemetry_steps.append(number)
        if number == self.window.last:
            self._sync()
            wall = time.perf_counter() - self._started
            self.close()
            if self.writer:
                self._write(wall)

    def close(self) -> None:
        """Stop the profile (if running) and remove the module labels; idempotent."""
        if self._profile is not None:
            profile, self._profile = self._profile, None
            profile.__exit__(None, None, None)
            if self.writer:  # only the writer reads the profile
                self._events = profile.events()
                self._device = DeviceTrace.of(profile.profiler.kineto_results) if self.cuda else None
        if self._labels is not None:
            labels, self._labels = self._labels, None
            labels.__exit__(None, None, None)

    def _write(self, wall: float) -> None:
        from fp4repro.config.devices import load_devices
        from fp4repro.provenance import describe_device, provenance
        from fp4repro.results import write_json

        self.record = summarize(
            timeline(self._events, self._device),
            window=self.window,
            wall=wall,
            step_seconds=self.step_seconds,
            before_window=self.before_window,
            telemetry_steps=self.telemetry_steps,
            tokens_per_step=self.tokens_per_step,
            flops=flops_per_token(self.config, self.seq_len),
            device=self.device,
            device_name=describe_device(self.device),
            peak=_bf16_peak(load_devices(), torch.cuda.get_device_name(self.device) if self.cuda else None),
            gpus=_gpus(self.cuda),
            meta=self.meta,
        )
        self._events = self._device = None
        write_json(self.out, self.record, provenance(self.device))
        print(table(self.record) + f"\nwrote {self.out}", flush=True)


def _bf16_peak(devices, name: str | None) -> dict:
    """The dense BF16 peak of the device the driver calls ``name`` (None: a CPU), with its source."""
    device = devices.of_name(name)
    if device is None or "bf16" not in device.peak_tflops:
        return {
            "tflops": None,
            "why": f"{devices.shown_path} has no dense BF16 peak for {name or 'a CPU'}: MFU is not computed",
        }
    return {"tflops": device.peak_tflops["bf16"].mid, "device": device.key, "file": devices.shown_path}


def _gpus(cuda: bool) -> int:
    """The GPUs that share the step: every process of a distributed run (one GPU each), else one."""
    if cuda and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def summarize(
    activities: list[Activity],
    window: ProfileWindow,
    wall: float,
    step_seconds: list[float],
    before_window: list[float],
    telemetry_steps: list[int],
    tokens_per_step: int,
    flops: dict[str, int],
    device: str,
    device_name: str,
    peak: dict,
    gpus: int,
    meta: dict,
) -> dict:
    """The record of a profiled window (``StepProfiler`` writes it): per step, milliseconds."""
    steps = window.count
    pieces = split(activities)
    busy = busy_us(activities) / 1e3 / steps
    per_step = wall / steps
    tokens_per_s = tokens_per_step / per_step
    return {
        **meta,
        "device": device,
        "device_name": device_name,
        "timeline": "cuda kernels, memcpys and memsets" if torch.device(device).type == "cuda" else "cpu operators",
        "steps": list(range(window.start, window.last + 1)),
        "telemetry_steps": telemetry_steps,
        "tokens_per_step": tokens_per_step,
        "gpus": gpus,
        "wall_s": wall,
        "step_s": step_seconds,
        "s_per_step": per_step,
        "s_per_step_unprofiled": statistics.median(before_window) if before_window else None,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": flops,
        "peak_bf16": peak,
        "mfu": {kind: mfu(f, tokens_per_s, peak["tflops"], gpus) for kind, f in flops.items()},
        "ms_per_step": {part: us / 1e3 / steps for part, us in pieces["parts"].items()},
        "busy_ms_per_step": busy,
        "host_gap_ms_per_step": per_step * 1e3 - busy,
        "activities_per_step": len(activities) / steps,
        "rules_ms_per_step": {rule: us / 1e3 / steps for rule, us in sorted(pieces["rules"].items())},
        **{
            key: {
                part: [{"name": k["name"], "ms_per_step": k["us"] / 1e3 / steps, "count": k["count"]} for k in kernels]
                for part, kernels in pieces[key].items()
            }
            for key in ("costliest", "costliest_sources")
        },
    }


def table(record: dict) -> str:
    """The record as a short table: the step, tokens/s and MFU, then milliseconds per step by part."""
    per_step = record["s_per_step"] * 1e3
    mfu_text = ", ".join(
        f"MFU {kind} {value:.1%}" if value is not None else f"MFU {kind} -" for kind, value in record["mfu"].items()
    )
    lines = [
        f"{record.get('experiment', '')}/{record.get('recipe', '')} ({record.get('backend', '')}"
        f"{', fused kernels' if record.get('fused_kernels') else ''}"
        f"{', compiled conv1d' if record.get('compiled_conv1d') else ''}) on "
        f"{record['device_name']}: steps {record['steps'][0]}-{record['steps'][-1]} profiled, "
        f"{per_step:,.1f} ms/step, {record['tokens_per_s']:,.0f} tokens/s, {mfu_text}",
        f"{'part':14} {'ms/step':>10} {'share':>7}",
    ]
    rows = [(p, ms) for p, ms in record["ms_per_step"].items() if ms > 0]
    rows += [("busy", record["busy_ms_per_step"]), ("host gaps", record["host_gap_ms_per_step"])]
    for part, ms in rows:
        lines.append(f"{part:14} {ms:>10,.2f} {ms / per_step:>7.1%}")
    if record["telemetry_steps"]:
        lines.append(f"(steps {record['telemetry_steps']} recorded telemetry)")
    return "\n".join(lines)
