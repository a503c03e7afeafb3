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
    result = throughput.run(load_model_config("tiny"), recipes, seq_len=256, steps=5, warmup=1, progress=lambda m: None)
    reasons = {column: result["columns"][column]["timing_reason"] for column in throughput.COLUMNS}
    assert all(result["columns"][column]["timing"] == "cuda_graph" for column in throughput.COLUMNS), reasons
    for column in throughput.COLUMNS:
        census = {n: r["kernels"] for n, r in result["columns"][column]["recipes"].items()}
        assert census["bf16"]["quantize_launches"] == 0 and census["bf16"]["fp8_gemm_calls"] == 0
        assert census["nvfp4"]["quantize_launches"] > 0
        # the tail's layer quantizes too when it is not exempt
        assert census["nvfp4_no_bf16_tail"]["quantize_launches"] > census["nvfp4"]["quantize_launches"]
        # the split of each step's GPU time: nvfp4's current amaxes take their own pass, casts only in the analogue
        for c in census.values():
            assert c["other_ms"] > 0 and c["kernel_ms"] >= c["gemm_ms"] + c["quantize_ms"] + c["amax_ms"] + c["cast_ms"]
        assert census["bf16"]["amax_ms"] == 0 and census["nvfp4"]["amax_ms"] > 0
        assert (census["nvfp4"]["cast_ms"] > 0) == (column == "fp8_analogue") and census["bf16"]["cast_ms"] == 0
    assert "cast" in result["columns"]["fp8_analogue"]  # its record that the operands were clamped
    fp8 = {n: r["kernels"]["fp8_gemm_calls"] for n, r in result["columns"]["fp8_analogue"]["recipes"].items()}
    emulated = {n: r["kernels"]["fp8_gemm_calls"] for n, r in result["columns"]["emulated"]["recipes"].items()}
    # the analogue computes on finite numbers (q·s beyond E4M3's range is clamped, not NaN)
    from fp4repro.bench.fp8_gemm import fp8_timing_gemm
    from fp4repro.model import attach_recipe
    from fp4repro.quant.gemm import gemm_instrument
    from fp4repro.quant.state import QuantState

    body = throughput.build_body(load_model_config("tiny"), recipes["nvfp4"], "cuda")
    attach_recipe(body, recipes["nvfp4_no_bf16_tail"], QuantState())
    x = torch.randn(1, 256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with gemm_instrument(fp8_timing_gemm):
        grads = throughput.body_step(body, x, torch.randn_like(x))
    # the body is the decoder layers (the final norm outside it gets no gradient)
    computed = [g for g in grads if g is not None]
    assert len(computed) == 1 + len(list(body.layers.parameters()))
    assert all(torch.isfinite(g).all() for g in computed)
    # tiny: 5 layers, 10 internal linears, 3 GEMMs each; nvfp4 keeps layer 4 (2 linears) in BF16
    assert fp8 == {"bf16": 0, "nvfp4": 24, "nvfp4_no_bf16_tail": 30} and set(emulated.values()) == {0}


def test_components_time_every_gemm_and_quantization_of_the_body_steps():
    from fp4repro.bench import components
    from fp4repro.bench.body_work import body_work

    recipes = {n: load_recipe(n) for n in ("bf16", "nvfp4", "ue5m3")}
    config = load_model_config("tiny")
    result = components.run(config, recipes, tokens=256, progress=lambda m: None)
    for recipe in recipes.values():
        gemms, quants = body_work(config, recipe, 256)
        for g in gemms:
            timed = result["gemms"][components.gemm_key(g.m, g.n, g.k)]
            assert timed["bf16_ms"] > 0 and timed["fp8_ms"] > 0 and timed["cast_a_ms"] > 0 and timed["cast_b_ms"] > 0
        for q in quants:
            timed = result["quantizations"][components.quant_key(q.rows, q.cols, q.case)]
            assert timed["quantize_ms"] > 0 and ("amax_ms" in timed) >= q.amax_pass
    assert result["copy"]["gb_per_s"] > 100 and result["device"].startswith("NVIDIA")


def test_a_captured_step_replays_the_eager_step_s_work():
    """The graph replay computes what an eager step does (its gradients), and at the shapes of
    a host-bound body (tiny, 256 tokens) the column times replays."""
    import yaml

    from fp4repro.config.files import find_config
    from fp4repro.config.recipe import recipe_from_config
    from fp4repro.model import attach_recipe
    from fp4repro.quant.state import QuantState

    # ue5m3 without its stochastic rounding: a step's SR seeds count the quantizations made, so
    # the eager step after the capture would draw other bits than the captured one
    raw = yaml.safe_load(find_config("recipes", "ue5m3").read_text())
    raw["name"], raw["operands"] = "ue5m3_rne", {k: v for k, v in raw["operands"].items() if k.endswith(".w")}
    recipe = recipe_from_config(raw, "ue5m3 without SR")
    body = throughput.build_body(load_model_config("tiny"), recipe, "cuda")

    attach_recipe(body, recipe, QuantState())
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1, 256, 128, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
    dy = torch.randn(1, 256, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    throughput.body_step(body, x, dy)  # the held amaxes are sampled here

    def step_into(x, dy, kept):
        """The captured step, its gradients copied out into tensors made outside the pool."""
        grads = [g for g in throughput.body_step(body, x, dy) if g is not None]
        for k, g in zip(kept, grads):
            k.copy_(g)

    kept = [torch.zeros_like(g) for g in throughput.body_step(body, x, dy) if g is not None]
    # two graphs in one pool, the second a step of the same body on other inputs: after both
    # captures the pool holds nothing, and the second's replay before the first's leaves the
    # first computing the eager step's gradients
    pool = torch.cuda.graph_pool_handle()
    replay = throughput.captured(lambda: step_into(x, dy, kept), x.device, pool)
    x2, dy2 = x.detach().flip(1).requires_grad_(), dy.flip(1)
    kept2 = [torch.zeros_like(k) for k in kept]
    other = throughput.captured(lambda: step_into(x2, dy2, kept2), x.device, pool)
    assert throughput.pool_in_use(pool) == 0
    for k in kept:
        k.zero_()
    other()
    replay()
    torch.cuda.synchronize()
    eager = [g for g in throughput.body_step(body, x, dy) if g is not None]
    assert len(kept) == len(eager) > 1 and any(k.abs().sum() > 0 for k in kept)
    assert not all(torch.equal(k, k2) for k, k2 in zip(kept, kept2))  # the other graph's own work
    for k, e in zip(kept, eager):
        torch.testing.assert_close(k, e, rtol=1e-2, atol=1e-3)
    result = throughput.run(
        load_model_config("tiny"),
        {"bf16": load_recipe("bf16"), "ue5m3": recipe},
        seq_len=256,
        steps=5,
        warmup=1,
        columns=("emulated",),
        progress=lambda m: None,
    )
    assert result["columns"]["emulated"]["timing"] == "cuda_graph"


def test_a_capture_that_leaves_a_tensor_alive_in_a_shared_pool_is_refused():
    """A step that keeps a tensor made during its capture (here one that replaces another, so the
    allocated total does not move) would be overwritten by the replays of the pool's other graphs."""
    kept = [torch.zeros(1 << 20, device="cuda")]

    def step():
        kept[0] = kept[0] + 1

    with pytest.raises(throughput.SurvivingCapture, match="4,194,304 bytes"):
        throughput.captured(step, torch.device("cuda"), torch.cuda.graph_pool_handle())
    throughput.captured(lambda: kept[0].add_(1), torch.device("cuda"), torch.cuda.graph_pool_handle())


def test_a_column_gives_its_graphs_memory_back_to_the_device():
    """The next column captures its graphs in a pool of its own: the last one's must be freed
    first (at the 8B's 1 x 1,024 tokens on an H100, two pools of one step's memory do not fit)."""

    def graph_pool_segments():
        """(pool, address) of every segment the allocator holds in a CUDA-graph pool."""
        snapshot = torch.cuda.memory_snapshot()
        return {(tuple(s["segment_pool_id"]), s["address"]) for s in snapshot if tuple(s["segment_pool_id"]) != (0, 0)}

    before = graph_pool_segments()  # what earlier tests' captures left (seen: two fully allocated segments)
    recipes = {n: load_recipe(n) for n in ("bf16", "nvfp4")}
    tiny = load_model_config("tiny")
    quiet = lambda m: None  # noqa: E731
    result = throughput.run(tiny, recipes, seq_len=256, steps=5, warmup=1, columns=("emulated",), progress=quiet)
    assert result["columns"]["emulated"]["timing"] == "cuda_graph"
    assert graph_pool_segments() <= before
