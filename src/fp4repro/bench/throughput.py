"""`fp4repro bench throughput`: model-body tokens/s per recipe, measured on this GPU.

The body is the decoder layers only (no embedding, LM head, loss or optimizer), forward and
backward, at ``batch`` sequences of ``seq_len`` tokens. Parameters are BF16, as megatron-core's
``--bf16`` model holds them (FP32 master weights belong to the optimizer, outside the body), under
BF16 autocast as training runs; the input is a random hidden state with a gradient (the first
layer's input gradient is computed, as training does for the embedding), the output gradient
random.

Method. One model, its weights shared by every recipe: ``fp4repro.model.attach_recipe`` swaps the
recipe's specs and a QuantState of its own into the same layers. Per column, every recipe's
``warmup`` steps first (Triton compiles, cuBLAS picks its kernels, periodic scaling holds its first
amax), then ``steps`` rounds of one step of every recipe in turn (interleaved: a drift of clocks or
temperature reaches every recipe alike; the order rotates each round); each step is timed with CUDA
events and synchronized (on CPU, the wall clock: for tests). What is timed is the replay of the step
captured in a CUDA graph where one step's memory fits (``graph_timing``; every recipe's graph in one
shared pool, ``captured``): the device's time without the host's launch cost, which at ``small``
shapes and at the 8B's 1 x 1,024 tokens is much of an eager step (the GPU idled through much of it,
and two processes disagreed widely); at the 8B's 1 x 8,192 tokens one step's activations nearly
fill the GPU, and an eager step is device-bound there (the GPU hardly idles). The measurements:
results/bench/README.md, *Model-body throughput (one H200)* and the H100's sections. The result says
which (``timing``) and why. Per recipe: the median step, its quartiles, body tokens/s =
batch·seq_len / median; per column the peak memory. Per column, the effects the paper's +21.2% mixes
(``EFFECTS``): the speed-up time(nvfp4) / time(variant) of removing the RHT, the BF16 tail, and
both, as the geometric mean of the per-round ratios with a 95% Student-t interval
(``fp4repro.bench.live.paired_log_ratio``).

Columns (``COLUMNS``):
- ``emulated``: this suite's quantization kernels and BF16 tensor-core GEMMs (what training runs).
- ``fp8_analogue``: the same quantization kernels (RHT on or off as the recipe says), the
  quantized layers' GEMMs on E4M3 tensor cores (``fp4repro.bench.fp8_gemm``: an instrument for
  time), exempt layers in BF16. One profiled step per recipe counts what ran (the quantizer's
  launches and its GPU time, the FP8 GEMM calls), so that the column shows it.
- ``native`` (run only where the GPU has FP4 tensor cores and Transformer Engine imports:
  ``fp4repro.bench.native``): Transformer Engine's ``NVFP4BlockScaling`` for the recipes it can
  compute (the NVFP4 family), the exempt layers outside FP4 autocast; elsewhere the result says
  why it did not run.
The Blackwell projection is made afterwards from these measurements and the parts of the step timed
alone (``fp4repro bench components``, then ``fp4repro bench project``: ``fp4repro.bench.projection``);
until then ``not_measured`` says so. Each recipe's GEMM FLOPs by precision and quantized elements
by kernel case (``fp4repro.bench.body_work``) are recorded with the measurements (``work``), and the
census of each recipe's step splits its GPU time into GEMMs, quantization, amax passes, FP8 casts
and the rest (``other_ms``, the projection's measured non-GEMM time).
"""

from __future__ import annotations

import functools
import gc
import time
from pathlib import Path

import numpy as np
import torch

from fp4repro.bench import native
from fp4repro.bench.body_work import body_work
from fp4repro.bench.body_work import summary as summary_of_work
from fp4repro.bench.fp8_gemm import fp8_timing_gemm
from fp4repro.bench.live import paired_log_ratio
from fp4repro.config.model import ModelConfig
from fp4repro.config.recipe import Recipe
from fp4repro.errors import ConfigError, FP4ReproError
from fp4repro.model import NemotronH, attach_recipe
from fp4repro.provenance import provenance
from fp4repro.quant.gemm import gemm_instrument
from fp4repro.quant.state import QuantState
from fp4repro.results import column_timing, read_throughput, record_shapes, shape_text, throughput_key
from fp4repro.train.profiling import GEMM_OPERATORS, DeviceTrace, classify, timeline

# effect -> the recipe whose time divides nvfp4's (speed-up of removing what it names)
EFFECTS = {"rht": "nvfp4_no_rht", "bf16_tail": "nvfp4_no_bf16_tail", "both": "nvfp4_no_rht_no_bf16_tail"}
COLUMNS = ("emulated", "fp8_analogue")
NOT_MEASURED = {
    "projection": "not made yet: fp4repro bench components on this GPU, then fp4repro bench project",
    "native": "not run: needs FP4 tensor cores (compute capability >= 10.0) and Transformer Engine",
}  # the native column replaces its entry by what ``native.native_available`` says here, or runs


def build_body(config: ModelConfig, recipe: Recipe, device: str) -> NemotronH:
    """The model of ``config`` with BF16 parameters on ``device``, its internal linears built for a
    recipe (so that any recipe can be attached), embedding and LM head dropped (outside the body)."""
    with torch.device(device):
        model = NemotronH(config, recipe, QuantState())
    model.embedding = model.lm_head = None
    return model.to(torch.bfloat16)


def body_step(model: NemotronH, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """One forward and backward of the decoder layers: the gradients of x and of every parameter,
    computed anew (nothing accumulates) and returned, none kept in ``.grad``: a step captured in a
    CUDA graph then leaves no tensor alive (``captured``). Autocast's cast cache is off: the
    parameters are BF16 already (nothing to cache), and a CUDA graph may not capture a cache."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, cache_enabled=False):
        h = x
        for layer in model.layers:
            h = layer(h)
    inputs = [x, *(p for p in model.parameters() if p.requires_grad)]
    return torch.autograd.grad(h, inputs, dy, allow_unused=True)


class _Clock:
    """Step timer: CUDA events on a GPU, the wall clock on CPU. ``time(fn)`` -> milliseconds."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def time(self, fn) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        self.start.record()
        fn()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


def graph_timing(recipes: int, step_mib: float, free_mib: float) -> tuple[bool, str]:
    """Whether the recipes' steps can be captured in CUDA graphs sharing one memory pool (the
    largest step's activations, ``step_mib`` = one eager step's peak over the memory at rest:
    no step's memory outlives it, ``captured`` checks) within 80% of the free memory, and why."""
    if step_mib <= 0.8 * free_mib:
        return True, (
            f"CUDA-graph replays: {recipes} graphs sharing one pool of {step_mib:,.0f} MiB, {free_mib:,.0f} MiB free"
        )
    return False, f"eager steps: a graph's pool of {step_mib:,.0f} MiB would not fit in {free_mib:,.0f} MiB free"


class SurvivingCapture(RuntimeError):
    """A captured step left memory allocated: in a pool shared with other graphs, their replays
    would overwrite it."""


@functools.cache
def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream every capture on ``device`` warms up and is captured on: state that
    torch makes lazily per stream (cuBLAS's workspace of a handle on a stream) is then made by the
    first warm-up, outside any capture and its pool."""
    return torch.cuda.Stream(device)


def captured(step, device: torch.device, pool=None):
    """``step`` captured in a CUDA graph, returned as its replay. It runs once first on the stream
    it is captured on, as ``torch.cuda.graph`` asks (lazy state is made outside the capture);
    every value it reads from the host (held amaxes, seeds) is fixed at capture, which changes no
    kernel's work. What ``step`` returns is dropped.

    With ``pool`` (``torch.cuda.graph_pool_handle()``) shared by several graphs, any of them may
    replay after any other only if no tensor allocated during a capture outlives it (``body_step``
    returns its gradients, kept nowhere): after the capture, no block of the pool may be in use
    (``pool_in_use``), else ``SurvivingCapture``."""
    side = _capture_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        step()
    if pool is not None and (left := pool_in_use(pool)) > 0:
        raise SurvivingCapture(f"the captured step left {left:,} bytes allocated in the shared pool")
    return graph.replay


def pool_in_use(pool) -> int:
    """Bytes of a CUDA-graph memory pool held by live tensors (the allocator's snapshot: the
    segments the pool owns, their allocated size), after a collection: a tensor kept only by a
    reference cycle is garbage, not a survivor."""
    gc.collect()
    return sum(
        segment["allocated_size"]
        for segment in torch.cuda.memory_snapshot()
        if tuple(segment["segment_pool_id"]) == tuple(pool)
    )


def _inside_gemm(event) -> bool:
    """Whether a profiler event runs inside another GEMM operator (the CPU's ``_scaled_mm`` calls
    ``mm``: its time is the outer one's)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in GEMM_OPERATORS:
            return True
        parent = parent.cpu_parent
    return False


#: The census' fields of the table's quantization rules (``fp4repro.train.profiling.RULES``, by name).
CENSUS_RULES = {"quantize": "quantize_ms", "amax": "amax_ms", "fp8_cast": "cast_ms"}


def kernel_census(step, device: torch.device) -> dict:
    """Run ``step`` once under the profiler (on CPU, only the CPU's operators): launches and GPU
    milliseconds of the quantization kernel, GPU milliseconds of the current-amax pass and of the
    saturating FP8 cast, GPU milliseconds of all kernels and of the rest (``other_ms``), calls of the FP8
    GEMM (``aten::_scaled_mm``: cuBLAS's
    Hopper GEMM kernels are named for their tiling, not their types), calls of every GEMM operator
    (``GEMM_OPERATORS``) and the GPU milliseconds of GEMM kernels, and all kernel launches. Kernels
    are told apart by the training profile's table (``fp4repro.train.profiling.RULES``): a GEMM is
    what a GEMM operator launches or cuBLAS's, CUTLASS's or this suite's GEMM kernels (the
    probe-matched GEMM, and the scale-and-cast epilogue where cuBLASLt cannot take a device
    alpha); SDPA's and the Mamba scan's own matrix products are not among them."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    census = {
        "quantize_launches": 0,
        "quantize_ms": 0.0,
        "amax_ms": 0.0,
        "cast_ms": 0.0,
        "fp8_gemm_calls": 0,
        "gemm_calls": 0,
        "gemm_ms": 0.0,
        "kernel_launches": 0,
        "kernel_ms": 0.0,
    }
    events = prof.events()
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CPU:
            census["fp8_gemm_calls"] += event.name == "aten::_scaled_mm"
            census["gemm_calls"] += event.name in GEMM_OPERATORS and not _inside_gemm(event)
    for kernel in timeline(events, DeviceTrace.of(prof.profiler.kineto_results)) if cuda else []:
        ms = kernel.us / 1e3
        rule = classify(kernel.name, kernel.within)
        census["kernel_launches"] += 1
        census["kernel_ms"] += ms
        if rule is None:
            continue
        if rule.part == "gemm":
            census["gemm_ms"] += ms
        if rule.name in CENSUS_RULES:
            census[CENSUS_RULES[rule.name]] += ms
        census["quantize_launches"] += rule.name == "quantize"
    # what is neither a GEMM nor a quantization, amax pass or FP8 cast: the scan, the attention
    # core, norms, elementwise work (the projection's measured non-GEMM time)
    census["other_ms"] = (
        census["kernel_ms"] - census["gemm_ms"] - census["quantize_ms"] - census["amax_ms"] - census["cast_ms"]
    )
    return census


def summarize(times_ms, tokens: int) -> dict:
    """Median and quartiles of a recipe's step times, and body tokens/s at the median."""
    t = np.asarray(times_ms, dtype=np.float64)
    q1, median, q3 = np.percentile(t, [25, 50, 75])
    return {
        "ms": [float(v) for v in t],
        "median_ms": float(median),
        "q1_ms": float(q1),
        "q3_ms": float(q3),
        "tokens_per_s": tokens / (median / 1e3),
    }


def effects(times: dict[str, list[float]]) -> dict:
    """Per effect of ``EFFECTS`` whose recipes were timed: the speed-up time(nvfp4) / time(variant)
    from the per-round pairs, with its 95% interval (``paired_log_ratio``)."""
    out = {}
    for effect, variant in EFFECTS.items():
        if "nvfp4" in times and variant in times:
            r = paired_log_ratio(times[variant], times["nvfp4"])
            out[effect] = {
                "versus": variant,
                "speedup": r["ratio"],
                "ci_low": r["ci_low"],
                "ci_high": r["ci_high"],
                "n": r["n"],
            }
    return out


def time_column(
    step_of,
    names: list[str],
    x: torch.Tensor,
    steps: int,
    warmup: int,
    column: str,
    progress=print,
    interleave: bool = True,
) -> dict:
    """Every recipe's step times in one column; ``step_of(name)`` readies the model for recipe
    ``name`` and returns its step. Every recipe's warm-up first; then, interleaved, ``steps``
    rounds of one step of each recipe, the order rotated by one each round (no recipe always
    follows the same one), each a replay of the recipe's step captured in a CUDA graph where
    ``graph_timing`` says they fit (the graphs share one memory pool; eager steps where a capture
    leaves memory in it, ``SurvivingCapture``); or, with ``interleave`` off, each recipe's eager
    steps in one block (for modules that rebuild state whenever the recipe changes)."""
    clock = _Clock(x.device)
    tokens = x.shape[0] * x.shape[1]
    times = {name: [] for name in names}
    if x.is_cuda:
        rest = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    for name in names:
        step = step_of(name)
        for _ in range(warmup):
            step()
        progress(f"{column}: {name} warmed up")
    graphs, timing = False, "eager steps: no CUDA device" if not x.is_cuda else "eager steps: one block per recipe"
    if x.is_cuda and interleave:
        graphs, timing = graph_timing(
            len(names), (torch.cuda.max_memory_allocated() - rest) / 2**20, torch.cuda.mem_get_info()[0] / 2**20
        )
        progress(f"{column}: {timing}")
    if x.is_cuda:
        torch.cuda.reset_peak_memory_stats()
    if interleave:
        if graphs:
            pool, replay = torch.cuda.graph_pool_handle(), {}
            for name in names:
                try:
                    replay[name] = captured(step_of(name), x.device, pool)
                except SurvivingCapture as err:
                    graphs, timing, replay = False, f"eager steps: {name}: {err}", None
                    progress(f"{column}: {timing}")
                    break
        for r in range(steps):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times[name].append(clock.time(replay[name] if graphs else step_of(name)))
            progress(f"{column}: round {r + 1}/{steps}")
        if x.is_cuda:  # the graphs' pool (or a refused capture's) goes back to the device before the next column
            replay = None
            gc.collect()
            torch.cuda.empty_cache()
    else:
        for name in names:
            step = step_of(name)
            for _ in range(warmup):
                step()
            times[name] = [clock.time(step) for _ in range(steps)]
            progress(f"{column}: {name} timed")
    peak = torch.cuda.max_memory_allocated() / 2**20 if x.is_cuda else None
    census = {name: kernel_census(step_of(name), x.device) for name in names}
    rows = {name: {**summarize(times[name], tokens), "kernels": census[name]} for name in names}
    return {
        "recipes": rows,
        "effects": effects(times),
        "peak_mib": peak,
        "interleaved": interleave,
        "timing": "cuda_graph" if graphs else "eager",
        "timing_reason": timing,
    }


def suite_column(
    model: NemotronH, recipes: dict[str, Recipe], x, dy, steps: int, warmup: int, column: str, progress=print
) -> dict:
    """The emulated or the FP8-analogue column: this suite's quantized linears, each recipe
    attached in turn with a QuantState of its own."""
    states = {name: QuantState() for name in recipes}

    def step_of(name):
        attach_recipe(model, recipes[name], states[name])
        return lambda: body_step(model, x, dy)

    if column != "fp8_analogue":
        return time_column(step_of, list(recipes), x, steps, warmup, column, progress)
    with gemm_instrument(fp8_timing_gemm):
        timed = time_column(step_of, list(recipes), x, steps, warmup, column, progress)
    # the record that the operands were clamped, not NaN (``fp4repro.results.void_column``)
    return {**timed, "cast": "saturating E4M3 (clamped to ±448, fp4repro.kernels.saturating_e4m3)"}


def native_column(model: NemotronH, recipes: dict[str, Recipe], x, dy, steps: int, warmup: int, progress=print) -> dict:
    """Transformer Engine's NVFP4 on FP4 tensor cores (``fp4repro.bench.native``) for the recipes
    it can compute; the others are listed with the reason. Replaces the model's linears by
    Transformer Engine's (run it last)."""
    mappings, without = {}, {}
    for name, recipe in recipes.items():
        try:
            mappings[name] = native.te_mapping(recipe, model.config)
        except native.NoTEEquivalent as err:
            without[name] = str(err)
    body = native.te_body(model)
    # Transformer Engine rebuilds a module's quantizers whenever the autocast recipe changes: each
    # recipe's steps in one block, after its own warm-up
    timed = time_column(
        lambda name: native.native_step(body, mappings[name], x, dy),
        list(mappings),
        x,
        steps,
        warmup,
        "native",
        progress,
        interleave=False,
    )
    return {
        **timed,
        "mappings": {n: {"arguments": m.arguments, "bf16_layers": list(m.bf16_layers)} for n, m in mappings.items()},
        "no_equivalent": without,
    }


def run(
    config: ModelConfig,
    recipes: dict[str, Recipe],
    seq_len: int,
    batch: int = 1,
    steps: int = 7,
    warmup: int = 2,
    columns=COLUMNS,
    device: str | None = None,
    seed: int = 0,
    progress=print,
    on_column=None,
) -> dict:
    """Body tokens/s of every recipe in every column of one model's shapes (``record`` files it);
    ``on_column(result)`` is called with the result so far after each column. The native column
    runs where ``fp4repro.bench.native.native_available`` says it can, after the others."""
    if steps < 5:
        raise ConfigError(f"bench throughput --steps: at least 5 timed steps per recipe, got {steps}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise ConfigError(f"bench throughput --columns: {unknown} unknown; measured columns are {list(COLUMNS)}")
    if "fp8_analogue" in columns and (device == "cpu" or torch.cuda.get_device_capability() < (8, 9)):
        raise ConfigError(
            "bench throughput --columns: fp8_analogue needs a GPU with FP8 tensor cores (compute "
            "capability >= 8.9); here, emulated only"
        )
    if (batch * seq_len) % 16:
        raise ConfigError(
            f"bench throughput: batch x sequence = {batch * seq_len} tokens; the GEMMs' dimensions "
            "must be multiples of 16 (FP8 and FP4 tensor cores, 16-element blocks)"
        )
    torch.manual_seed(seed)
    model = build_body(config, next(iter(recipes.values())), device)
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(batch, seq_len, config.hidden_size, device=device, generator=g, dtype=torch.bfloat16)
    x.requires_grad_(True)
    dy = torch.randn(batch, seq_len, config.hidden_size, device=device, generator=g, dtype=torch.bfloat16)
    native_ok, native_reason = native.native_available() if device == "cuda" else (False, "not run: no CUDA device")
    result = {
        "model": config.name,
        "seq_len": seq_len,
        "batch": batch,
        "steps": steps,
        "warmup": warmup,
        "parameters_bf16": True,
        "columns": {},
        "work": {name: summary_of_work(*body_work(config, r, batch * seq_len)) for name, r in recipes.items()},
        "not_measured": {**NOT_MEASURED, **({} if native_ok else {"native": native_reason})},
    }
    if device == "cuda":
        result["device"] = torch.cuda.get_device_name()
        result["compute_capability"] = list(torch.cuda.get_device_capability())
    for column in columns:
        result["columns"][column] = suite_column(model, recipes, x, dy, steps, warmup, column, progress)
        if on_column is not None:
            on_column(result)
    if native_ok:
        result["columns"]["native"] = native_column(model, recipes, x, dy, steps, warmup, progress)
        del result["not_measured"]["native"]
        if on_column is not None:
            on_column(result)
    return result


def agreement(previous: dict, current: dict) -> dict:
    """How a new measurement of a model's body agrees with the one it replaces: per measured
    column both recipes' median steps and their relative difference, and the worst |difference|
    (two runs in separate processes should agree within 3%)."""
    columns = {}
    for column in COLUMNS:
        before, now = previous.get("columns", {}).get(column), current["columns"].get(column)
        if before is None or now is None:
            continue
        columns[column] = {
            name: {
                "previous_ms": before["recipes"][name]["median_ms"],
                "ms": row["median_ms"],
                "difference": row["median_ms"] / before["recipes"][name]["median_ms"] - 1,
            }
            for name, row in now["recipes"].items()
            if name in before["recipes"]
        }
    differences = [abs(r["difference"]) for rows in columns.values() for r in rows.values()]
    timings = {c: [column_timing(previous["columns"][c]), column_timing(current["columns"][c])] for c in columns}
    return {
        "columns": columns,
        "worst": max(differences) if differences else None,
        "previous_device": previous.get("device"),
        "previous_steps": previous.get("steps"),
        "timings": timings,
    }  # [previous, now] per column: eager steps and graph replays differ by the host


def record(out: Path, result: dict, device: str) -> dict:
    """File ``result`` under its model and shape in the JSON at ``out`` (``{"shapes": {key:
    result}}``, ``fp4repro.results.throughput_key``), keeping the other entries; written
    atomically. Returns the whole file's content."""
    return record_shapes(out, result, read_throughput, throughput_key, provenance(device), FP4ReproError)


def table(result: dict) -> str:
    """Body tokens/s per recipe and column, each recipe's FP4 and BF16 linears (where its work was
    recorded with them), then the effects."""
    columns = list(result["columns"])
    linears = {name: w["linears"] for name, w in result.get("work", {}).items() if "linears" in w}
    lines = [
        f"{result['model']}: body of {shape_text(result)}, "
        f"median of {result['steps']} steps"
        + (f" on {result['device']}" if "device" in result else "")
        + "; "
        # how each measured column timed its steps (a projection times nothing)
        + ", ".join(
            f"{c}: {column_timing(result['columns'][c])}"
            for c in columns
            if result["columns"][c].get("kind") != "projection"
        ),
        f"{'recipe':28}"
        + "".join(f" {c + ' tok/s':>20} {'ms':>8}" for c in columns)
        + (f" {'linears FP4+BF16':>17}" if linears else ""),
    ]
    recipes = list(result["columns"][columns[0]]["recipes"])
    for name in recipes:
        cells = "".join(
            f" {result['columns'][c]['recipes'][name]['tokens_per_s']:>20,.0f} "
            f"{result['columns'][c]['recipes'][name]['median_ms']:>8.1f}"
            if name in result["columns"][c]["recipes"]
            else f" {'-':>20} {'-':>8}"
            for c in columns
        )
        if linears:
            n = linears.get(name)
            count = f"{n['fp4']}+{n['bf16']}" if n else "-"
            cells += f" {count:>17}"
        lines.append(f"{name:28}{cells}")
    for c in columns:
        for effect, e in result["columns"][c]["effects"].items():
            lines.append(
                f"{c}: removing {effect:9} x{e['speedup']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}] "
                f"(nvfp4 / {e['versus']})"
            )
    return "\n".join(lines)
