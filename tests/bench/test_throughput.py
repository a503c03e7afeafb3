"""The body-throughput benchmark's arithmetic, table and file on recorded numbers, and its loop on
CPU (the tiny model, wall clock); its GPU measurement is ``fp4repro bench throughput`` on a
device (results/bench/throughput_<device>.json)."""

import json
import math

import pytest

from fp4repro.bench import throughput
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe
from fp4repro.errors import ConfigError, FP4ReproError


def test_a_recipes_summary_is_the_median_step_and_its_quartiles():
    s = throughput.summarize([12.0, 10.0, 11.0, 14.0, 13.0], tokens=8192)
    assert (s["median_ms"], s["q1_ms"], s["q3_ms"]) == (12.0, 11.0, 13.0)
    assert s["tokens_per_s"] == pytest.approx(8192 / 0.012)


def test_an_effect_is_nvfp4s_time_over_the_variants_paired_by_round():
    # per-round ratios 1.2, 1.25, 1.2, 1.25, 1.2: geometric mean, and a t-interval around it
    nvfp4 = [12.0, 12.5, 12.0, 12.5, 12.0]
    times = {"nvfp4": nvfp4, "nvfp4_no_rht": [10.0] * 5, "nvfp4_no_rht_no_bf16_tail": [x / 1.5 for x in nvfp4]}
    got = throughput.effects(times)
    assert set(got) == {"rht", "both"}  # the tail's variant was not timed
    geo = math.exp((3 * math.log(1.2) + 2 * math.log(1.25)) / 5)
    assert got["rht"]["speedup"] == pytest.approx(geo) and got["rht"]["versus"] == "nvfp4_no_rht"
    assert got["rht"]["ci_low"] < geo < got["rht"]["ci_high"] and got["rht"]["n"] == 5
    assert got["both"]["speedup"] == pytest.approx(1.5) and got["both"]["ci_high"] == pytest.approx(1.5)


def _recorded(model="tiny"):
    rows = {
        name: {**throughput.summarize(ms, 128), "peak_mib": 10.0, "kernels": None}
        for name, ms in {"bf16": [10.0] * 5, "nvfp4": [20.0] * 5, "nvfp4_no_rht": [16.0] * 5}.items()
    }
    return {
        "model": model,
        "seq_len": 128,
        "batch": 1,
        "steps": 5,
        "warmup": 1,
        "columns": {
            "emulated": {"recipes": rows, "effects": throughput.effects({n: r["ms"] for n, r in rows.items()})}
        },
        "not_measured": dict(throughput.NOT_MEASURED),
    }


def test_the_table_gives_tokens_per_second_per_recipe_and_the_effects():
    lines = throughput.table(_recorded()).splitlines()
    assert lines[0].startswith("tiny: body of 1 x 128 tokens, median of 5 steps")
    assert lines[2].split() == ["bf16", "12,800", "10.0"] and lines[3].split() == ["nvfp4", "6,400", "20.0"]
    assert lines[-1].startswith("emulated: removing rht") and "x1.250 [1.250, 1.250]" in lines[-1]
    projected = _recorded()
    projected["columns"]["projection_gb200"] = {
        "kind": "projection",
        "recipes": projected["columns"]["emulated"]["recipes"],
        "effects": {},
    }
    head = throughput.table(projected).splitlines()[0]
    assert head.endswith("emulated: eager")  # a projection times no step: no timing of its own
    # each recipe's FP4 and BF16 linears where its work records them
    counted = {**_recorded(), "work": {"bf16": {"linears": {"fp4": 0, "bf16": 10}}}}
    lines = throughput.table(counted).splitlines()
    assert lines[1].split()[-2:] == ["linears", "FP4+BF16"] and lines[2].split() == ["bf16", "12,800", "10.0", "0+10"]
    assert lines[3].split()[-1] == "-"


def test_results_are_filed_per_model_and_shape_in_one_file(tmp_path):
    out = tmp_path / "throughput_h200.json"
    throughput.record(out, _recorded("nemotron_h_8b"), "cpu")
    throughput.record(out, _recorded("small"), "cpu")
    throughput.record(out, {**_recorded("small"), "seq_len": 256}, "cpu")
    throughput.record(out, {**_recorded("small"), "seq_len": 256, "steps": 7}, "cpu")  # the same shape: replaced
    content = json.loads(out.read_text())
    assert set(content["shapes"]) == {"nemotron_h_8b 1x128", "small 1x128", "small 1x256"}
    assert content["shapes"]["small 1x256"]["steps"] == 7 and "provenance" in content
    # a file that filed its entries under the model alone: a measurement of the same shape replaces it
    out.write_text(json.dumps({"shapes": {"small": _recorded("small")}}))
    throughput.record(out, {**_recorded("small"), "steps": 9}, "cpu")
    assert {k: e["steps"] for k, e in json.loads(out.read_text())["shapes"].items()} == {"small 1x128": 9}
    out.write_text("[1, 2]")
    with pytest.raises(FP4ReproError, match="body-throughput results file"):
        throughput.record(out, _recorded(), "cpu")
    assert out.read_text() == "[1, 2]"


def test_a_new_measurement_says_how_far_each_median_step_moved_from_the_one_it_replaces():
    first = _recorded()
    second = _recorded()
    second["columns"]["emulated"]["recipes"]["nvfp4"]["median_ms"] = 20.6  # 3% slower
    del second["columns"]["emulated"]["recipes"]["nvfp4_no_rht"]  # not timed again
    second["columns"]["fp8_analogue"] = second["columns"]["emulated"]  # not in the first run
    agree = throughput.agreement(first, second)
    assert set(agree["columns"]) == {"emulated"} and set(agree["columns"]["emulated"]) == {"bf16", "nvfp4"}
    assert agree["columns"]["emulated"]["nvfp4"] == {"previous_ms": 20.0, "ms": 20.6, "difference": pytest.approx(0.03)}
    assert agree["worst"] == pytest.approx(0.03) and agree["columns"]["emulated"]["bf16"]["difference"] == 0


def test_the_loop_times_every_recipe_in_every_round_on_cpu():
    recipes = {n: load_recipe(n) for n in ("bf16", "nvfp4", "nvfp4_no_rht")}
    seen = []
    result = throughput.run(
        load_model_config("tiny"),
        recipes,
        seq_len=32,
        steps=5,
        warmup=1,
        columns=["emulated"],
        device="cpu",
        progress=seen.append,
    )
    column = result["columns"]["emulated"]
    assert list(column["recipes"]) == list(recipes)
    assert all(len(r["ms"]) == 5 and r["tokens_per_s"] > 0 for r in column["recipes"].values())
    assert {r["kernels"]["fp8_gemm_calls"] for r in column["recipes"].values()} == {0}
    assert set(column["effects"]) == {"rht"} and result["not_measured"]["native"].startswith("not run")
    assert result["work"]["bf16"]["quantized_elements"] == {} and result["work"]["nvfp4"]["amax_elements"] > 0
    assert seen[-1] == "emulated: round 5/5"


def test_a_body_step_returns_the_backward_s_gradients_and_keeps_none():
    """What ``backward`` would accumulate, returned instead, every ``.grad`` left None: a step in
    a CUDA graph then keeps no tensor of its pool alive."""
    import torch

    body = throughput.build_body(load_model_config("tiny"), load_recipe("bf16"), "cpu")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 32, 128, dtype=torch.bfloat16, generator=g, requires_grad=True)
    dy = torch.randn(1, 32, 128, dtype=torch.bfloat16, generator=g)
    grads = throughput.body_step(body, x, dy)
    assert x.grad is None and all(p.grad is None for p in body.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        h = x
        for layer in body.layers:
            h = layer(h)
    h.backward(dy)
    expected = [x.grad, *(p.grad for p in body.parameters())]
    # parameters outside the decoder layers (none used by the body) get no gradient either way
    assert len(grads) == len(expected) and [g is None for g in grads] == [e is None for e in expected]
    assert sum(e is not None for e in expected) > 20
    for got, want in zip(grads, expected):
        assert (got is None) or torch.equal(got, want)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps": 4}, "at least 5"),
        ({"columns": ["fp8_analogue"]}, "needs a GPU"),
        ({"columns": ["native"]}, "unknown"),
    ],
)
def test_bad_settings_are_refused_before_any_compute(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        throughput.run(
            load_model_config("tiny"), {"bf16": load_recipe("bf16")}, seq_len=32, device="cpu", **{"steps": 5, **kwargs}
        )


def test_the_census_counts_fp8_gemm_calls():
    import torch

    from fp4repro.bench.fp8_gemm import fp8_timing_gemm

    a, b = torch.randn(32, 64).to(torch.bfloat16), torch.randn(48, 64).to(torch.bfloat16)
    census = throughput.kernel_census(
        lambda: [fp8_timing_gemm(a, None, b, 0.5, torch.bfloat16) for _ in range(3)], torch.device("cpu")
    )
    assert census["fp8_gemm_calls"] == 3 and census["gemm_calls"] == 3 and census["quantize_launches"] == 0
    plain = throughput.kernel_census(
        lambda: (torch.mm(a, b.t()), torch.addmm(a[:, :48], a, b.t())), torch.device("cpu")
    )
    assert plain["fp8_gemm_calls"] == 0 and plain["gemm_calls"] == 2


def test_every_recipe_warms_up_first_then_rounds_rotate_the_order():
    import torch

    calls = []
    x = torch.zeros(1, 16, 1)
    result = throughput.time_column(
        lambda name: lambda: calls.append(name),
        ["a", "b", "c"],
        x,
        steps=5,
        warmup=1,
        column="emulated",
        progress=lambda m: None,
    )
    rounds = ["abc", "bca", "cab", "abc", "bca"]
    assert "".join(calls) == "abc" + "".join(rounds) + "abc"  # warm-ups, rounds, the census
    assert all(len(r["ms"]) == 5 for r in result["recipes"].values()) and result["interleaved"]
    calls.clear()
    blocks = throughput.time_column(
        lambda name: lambda: calls.append(name),
        ["a", "b"],
        x,
        steps=5,
        warmup=1,
        column="native",
        progress=lambda m: None,
        interleave=False,
    )
    assert "".join(calls) == "ab" + "a" * 6 + "b" * 6 + "ab" and not blocks["interleaved"]
    assert result["timing"] == blocks["timing"] == "eager"  # graphs only on a CUDA device


def test_graphs_are_timed_only_where_one_step_s_pool_fits_in_80_percent_of_free_memory():
    # the recipes' graphs share one pool: one step's memory, however many recipes (8B at the
    # paper's 1 x 1,024 tokens on an H100: 25,012 MiB a step, 40,800 MiB free; at 8,192 tokens
    # on an H200 ~100 GiB a step)
    fits, why = throughput.graph_timing(8, 25_012.0, 40_800.0)
    assert fits and "CUDA-graph" in why and "8 graphs sharing one pool of 25,012 MiB" in why
    fits, why = throughput.graph_timing(8, 110_000.0, 130_000.0)
    assert not fits and "110,000 MiB" in why and "eager" in why
    assert throughput.graph_timing(4, 800.0, 1000.0)[0] and not throughput.graph_timing(4, 801.0, 1000.0)[0]


def test_the_cli_times_every_body_shape_of_the_experiment_or_the_one_asked(tmp_path, monkeypatch, capsys):
    from fp4repro.cli import main
    from fp4repro.config.experiment import experiment_path

    # tiny with two body shapes; the measurement itself is the loop above (here: what it is asked)
    text = experiment_path("tiny").read_text()
    experiment = tmp_path / "two_shapes.yaml"
    shapes = "bench: {throughput_shapes: [{batch: 1, seq_len: 32}, {batch: 2, seq_len: 16}]}"
    experiment.write_text(text.replace("model: tiny\n", f"model: tiny\n{shapes}\n"))
    asked = []

    def fake_run(config, recipes, seq_len, batch, on_column, **kwargs):
        asked.append((batch, seq_len, kwargs["columns"]))
        result = {**_recorded(config.name), "batch": batch, "seq_len": seq_len}
        on_column(result)
        return result

    monkeypatch.setattr(throughput, "run", fake_run)
    out = tmp_path / "throughput_cpu.json"
    assert main(["bench", "throughput", "--experiment", str(experiment), "--out", str(out), "--quiet"]) == 0
    assert asked == [(1, 32, ["emulated"]), (2, 16, ["emulated"])]
    assert set(json.loads(out.read_text())["shapes"]) == {"tiny 1x32", "tiny 2x16"}
    assert "wrote" in capsys.readouterr().out
    # one shape asked on the command line instead; measuring a shape again says how far it moved
    asked.clear()
    assert main(["bench", "throughput", "--experiment", str(experiment), "--out", str(out), "--seq-len", "32"]) == 0
    assert asked == [(1, 32, ["emulated"])]
    content = json.loads(out.read_text())["shapes"]
    assert set(content) == {"tiny 1x32", "tiny 2x16"} and content["tiny 1x32"]["repeat"]["worst"] == 0
    assert "agreement with the measurement it replaced" in capsys.readouterr().out
