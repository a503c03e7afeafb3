"""The throughput projection on hand-made components of tiny's body (64 tokens): the sums below are
worked out by hand from tiny's work under nvfp4 (tests/bench/test_body_work.py: 10 linears, 3 GEMMs
each, the last layer's 2 linears in BF16; 8 quantized linears with 5 quantizations each, all with a
current amax: fprop.x 1x16, fprop.w 16x16, dgrad.dy 1x16 SR, wgrad.dy 1x16 RHT+SR and wgrad.x
1x16 RHT column-wise)."""

import json

import pytest

from fp4repro.bench import components, projection
from fp4repro.bench.body_work import body_work
from fp4repro.cli import main
from fp4repro.config.devices import Value, load_devices
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe
from fp4repro.errors import ConfigError

T = 64
RECIPES = ("bf16", "nvfp4", "nvfp4_no_rht", "nvfp4_no_bf16_tail", "nvfp4_no_rht_no_bf16_tail", "ue5m3")


def fake_components(rht_ms=0.3, rht_amax_ms=0.05) -> dict:
    """Every GEMM: BF16 1 ms, FP8 0.5 ms, casts 0.1 ms each; every quantization 0.2 ms (``rht_ms``
    with the RHT), every amax pass 0.05 ms (``rht_amax_ms`` with the RHT)."""
    config = load_model_config("tiny")
    gemms, quants = components.work_items(config, {n: load_recipe(n) for n in RECIPES}, T)
    return {
        "model": "tiny",
        "tokens": T,
        "device": "NVIDIA H200",
        "copy": {"gb_per_s": 4000.0},
        "gemms": {
            k: {"m": m, "n": n, "k": kk, "bf16_ms": 1.0, "fp8_ms": 0.5, "cast_a_ms": 0.1, "cast_b_ms": 0.1}
            for k, (m, n, kk) in gemms.items()
        },
        "quantizations": {
            k: {
                "quantize_ms": rht_ms if w.spec.rht else 0.2,
                **({"amax_ms": rht_amax_ms if w.spec.rht else 0.05} if w.amax_pass else {}),
            }
            for k, w in quants.items()
        },
    }


def nvfp4_work():
    return body_work(load_model_config("tiny"), load_recipe("nvfp4"), T)


def test_the_calibration_step_sums_the_parts_timed_alone():
    comp = fake_components(rht_ms=0.2)
    emulated = projection.calibration_step(nvfp4_work(), comp, other_ms=7.0, column="emulated")
    # 30 BF16 GEMMs + 40 quantizations + 40 amax passes + other
    assert emulated["ms"] == pytest.approx(30 * 1.0 + 40 * 0.2 + 40 * 0.05 + 7.0)
    analogue = projection.calibration_step(nvfp4_work(), comp, other_ms=7.0, column="fp8_analogue")
    # 24 FP4 GEMMs on E4M3 with two casts each, the tail's 6 in BF16
    assert analogue["gemm_ms"] == pytest.approx(24 * 0.5 + 6 * 1.0) and analogue["cast_ms"] == pytest.approx(24 * 0.2)
    assert analogue["ms"] == pytest.approx(18.0 + 4.8 + 8.0 + 2.0 + 7.0)


def test_the_native_step_follows_the_formulas():
    h200 = {"bf16": 1000.0, "fp8": 2000.0, "hbm": 5.0}
    target = {"bf16": 2000.0, "fp4": 8000.0, "hbm": 10.0}
    p = {"efficiency_transfer": 1.0, "fp4_efficiency_vs_fp8": 0.5, "other_bandwidth_bound": 1.0, "rht_hidden": 0.0}
    step = projection.native_step(nvfp4_work(), fake_components(rht_ms=0.3), 10.0, h200, target, p)
    # FP4: 0.5 ms · 2000 / (8000 · 0.5) = 0.25 ms; BF16: 1 ms · 1000 / 2000 = 0.5 ms
    assert step["gemm_ms"] == pytest.approx(24 * 0.25 + 6 * 0.5)
    # bytes: 1x16 blocks (2 + 1/2 + 1/16) / 4, 16x16 blocks (2 + 1/2 + 1/256) / 4; bandwidth halves the time
    one, square = 2.5625 / 4 * 0.5, (2.5 + 1 / 256) / 4 * 0.5
    plain, rht = 0.2, 0.3  # per linear: fprop.x, dgrad.dy plain; fprop.w 16x16; wgrad.dy, wgrad.x with the RHT
    assert step["quantize_ms"] == pytest.approx(8 * ((2 * plain + 2 * rht) * one + plain * square))
    assert step["amax_ms"] == pytest.approx(40 * 0.05 * 0.5) and step["other_ms"] == pytest.approx(5.0)
    # the RHT fully hidden: its cases cost what they cost without it, the amax pass after it too
    hidden = projection.native_step(
        nvfp4_work(),
        fake_components(rht_ms=0.3, rht_amax_ms=0.08),
        10.0,
        h200,
        target,
        {**p, "rht_hidden": 1.0, "other_bandwidth_bound": 0.0},
    )
    assert hidden["quantize_ms"] == pytest.approx(8 * (4 * plain * one + plain * square))
    assert hidden["amax_ms"] == pytest.approx(40 * 0.05 * 0.5) and hidden["other_ms"] == pytest.approx(10.0)
    charged = projection.native_step(nvfp4_work(), fake_components(rht_ms=0.3, rht_amax_ms=0.08), 10.0, h200, target, p)
    assert charged["amax_ms"] == pytest.approx((24 * 0.05 + 16 * 0.08) * 0.5)  # 2 of 5 operands per linear RHT'd


def fake_entry(comp: dict, scale: dict[str, float], other_ms: float = 5.0) -> dict:
    """A measured entry whose median steps are ``scale[column]`` times the parts' sum."""
    config = load_model_config("tiny")
    columns = {}
    for column, factor in scale.items():
        recipes = {}
        for name in RECIPES:
            parts = projection.calibration_step(body_work(config, load_recipe(name), T), comp, other_ms, column)
            census = {
                "other_ms": other_ms,
                "kernel_ms": parts["ms"],
                **{f"{k}_ms": parts[f"{k}_ms"] for k in ("gemm", "quantize", "amax", "cast")},
            }
            recipes[name] = {
                "median_ms": parts["ms"] * factor,
                "tokens_per_s": T / parts["ms"] * 1e3 / factor,
                "q1_ms": parts["ms"],
                "q3_ms": parts["ms"],
                "kernels": census,
            }
        columns[column] = {"recipes": recipes, "effects": {}, "cast": "saturating"}
    return {
        "model": "tiny",
        "batch": 1,
        "seq_len": T,
        "steps": 5,
        "device": "NVIDIA H200",
        "columns": columns,
        "not_measured": {"projection": "not made yet", "native": "not run"},
    }


def test_the_projection_is_made_only_when_the_h200_check_holds():
    comp, devices = fake_components(), load_devices()
    entry = projection.attach(fake_entry(comp, {"emulated": 1.05, "fp8_analogue": 0.95}), comp, devices)
    chk = entry["projection_check"]
    assert chk["within"] and chk["worst_error"] == pytest.approx(0.05 / 0.95)
    assert chk["columns"]["emulated"]["nvfp4"]["error"] == pytest.approx(1 / 1.05 - 1)
    assert chk["columns"]["emulated"]["nvfp4"]["parts_vs_step"] == {"gemm": 0, "quantize": 0, "amax": 0}
    assert chk["columns"]["fp8_analogue"]["bf16"]["gpu_idle"] == pytest.approx(1 - 1 / 0.95)
    assert {"projection_b200", "projection_b300", "projection_gb200"} <= set(entry["columns"])
    assert entry["columns"]["projection_gb200"]["target"].startswith("NVIDIA GB200")
    assert set(entry["projection_parameters"]["sources"]) == {"h200", "b200", "b300", "gb200"}
    assert entry["projection_parameters"]["devices_file"] == "fp4repro/configs/devices.yaml (packaged)"
    assert "projection" not in entry["not_measured"] and entry["not_measured"]["native"] == "not run"
    missed = projection.attach(fake_entry(comp, {"emulated": 1.0, "fp8_analogue": 1.2}), comp, devices)
    assert not missed["projection_check"]["within"]
    assert not any(c.startswith("projection") for c in missed["columns"])
    assert missed["not_measured"]["projection"].startswith("withheld")
    # what a failed check withholds, it does not keep from an earlier projection either
    stale = projection.attach(
        {
            **entry,
            "columns": {
                **entry["columns"],
                **{
                    c: {**m, "recipes": {n: {**r, "median_ms": r["median_ms"] * 2} for n, r in m["recipes"].items()}}
                    for c, m in entry["columns"].items()
                    if not c.startswith("projection")
                },
            },
        },
        comp,
        devices,
    )
    assert not stale["projection_check"]["within"] and "projection_parameters" not in stale
    # a GEMM that takes longer alone than in the step is recorded, part by part
    slow = fake_entry(comp, {"emulated": 1.0})
    slow["columns"]["emulated"]["recipes"]["bf16"]["kernels"]["gemm_ms"] /= 1.25
    assert projection.check(slow, comp)["columns"]["emulated"]["bf16"]["parts_vs_step"]["gemm"] == pytest.approx(0.25)
    # projecting again replaces the old projection columns
    again = projection.attach(
        missed
        | {
            "columns": {
                **missed["columns"],
                **{k: v for k, v in entry["columns"].items() if k.startswith("projection")},
            }
        },
        comp,
        devices,
    )
    assert not any(c.startswith("projection") for c in again["columns"])


def test_an_emulated_step_with_gemms_not_timed_alone_is_compared_but_not_bounded():
    """nvfp4 and ue5m3 emulate their FP4 GEMMs with the probe-matched GEMM model's kernel, which the
    components do not time: their emulated rows may miss by any amount; bf16's may not."""
    comp = fake_components()
    entry = fake_entry(comp, {"emulated": 1.0, "fp8_analogue": 1.0})
    for name in ("nvfp4", "ue5m3"):
        entry["columns"]["emulated"]["recipes"][name]["median_ms"] *= 1.3
    chk = projection.check(entry, comp)
    assert chk["within"] and chk["worst_error"] == pytest.approx(0, abs=1e-12)
    row = chk["columns"]["emulated"]["nvfp4"]
    assert row["error"] == pytest.approx(1 / 1.3 - 1) and "probe_matched GEMM model" in row["not_bounded"]
    assert "not_bounded" not in chk["columns"]["fp8_analogue"]["nvfp4"]
    assert "not_bounded" not in chk["columns"]["emulated"]["bf16"]
    assert "not bounded: its FP4 GEMMs run the probe_matched" in projection.table({**entry, "projection_check": chk})
    entry["columns"]["emulated"]["recipes"]["bf16"]["median_ms"] *= 1.3
    assert not projection.check(entry, comp)["within"]


@pytest.mark.parametrize(
    "name, why",
    [
        ("bf16", None),
        ("mxfp4", None),  # FP32 GEMMs, no tensor scale: decode scales known on the host
        ("ue5m3_torch_gemm", None),  # FP32 GEMMs, held amaxes: decode scales known on the host
        ("ue5m3", "probe_matched GEMM model"),
        ("nvfp4_gemm_fp32", "decode scales made on the device"),  # a current amax on the device
    ],
)
def test_which_emulated_steps_run_gemms_not_timed_alone(name, why):
    recipe = load_recipe(name)
    unmodeled = projection.emulated_gemms_unmodeled(recipe, body_work(load_model_config("tiny"), recipe, T))
    assert unmodeled is None if why is None else why in unmodeled


def test_the_band_spans_every_corner_and_the_central_value_lies_inside():
    comp, devices = fake_components(), load_devices()
    entry = fake_entry(comp, {"emulated": 1.0})
    column = projection.project(entry, comp, devices, "b200")
    uncertain = [
        v
        for v in [
            *devices.devices["b200"].peak_tflops.values(),
            devices.devices["b200"].hbm_tb_per_s,
            *devices.parameters.values(),
        ]
        if v.uncertain
    ]
    assert column["corners"] == 2 ** len(uncertain)
    for r in column["recipes"].values():
        assert r["low_ms"] < r["median_ms"] < r["high_ms"]
    for e in column["effects"].values():
        assert e["ci_low"] <= e["speedup"] <= e["ci_high"]
        # non-GEMM time, the same in both recipes, dilutes an effect: without it the effect is larger
        assert e["speedup_without_other"] > e["speedup"] > 1
        assert e["without_other_low"] < e["speedup_without_other"] < e["without_other_high"]  # over the band too
    assert "hypothetical" in column["recipes"]["ue5m3"]["note"] and "note" not in column["recipes"]["nvfp4"]
    # the fastest corner: every range at its favourable end, worked out by hand for bf16 (no quantization)
    b200, h200 = devices.devices["b200"], devices.devices["h200"]
    gemm = (
        30
        * 1.0
        * h200.peak_tflops["bf16"].low
        / (b200.peak_tflops["bf16"].low * devices.parameters["efficiency_transfer"].high)
    )
    f = devices.parameters["other_bandwidth_bound"].high
    other = 5.0 * (f * h200.hbm_tb_per_s.low / b200.hbm_tb_per_s.high + 1 - f)
    assert column["recipes"]["bf16"]["low_ms"] == pytest.approx(gemm + other)


def test_the_papers_gb200_is_projected_with_its_own_dense_peaks():
    gb200, h200 = load_devices().devices["gb200"], load_devices().devices["h200"]
    # NVIDIA's GB200 NVL72 table: FP4 20, FP8 10, BF16 5 PFLOPS per GPU with sparsity (dense is
    # half), 8 TB/s; the paper: FP4 four times BF16 on its GB200
    assert {k: (v.low, v.high) for k, v in gb200.peak_tflops.items()} == {
        "bf16": (2500, 2500),
        "fp8": (5000, 5000),
        "fp4": (10000, 10000),
    }
    assert (gb200.hbm_tb_per_s.low, gb200.hbm_tb_per_s.high) == (8.0, 8.0)
    comp, devices = fake_components(), load_devices()
    column = projection.project(fake_entry(comp, {"emulated": 1.0}), comp, devices, "gb200")
    assert column["corners"] == 2 ** sum(v.uncertain for v in devices.parameters.values())  # peaks known
    # bf16 at the ranges' midpoints, by hand: 30 BF16 GEMMs of 1 ms at the H200's 989 TFLOPS, the
    # non-GEMM 5 ms partly scaled by 4.8 / 8 TB/s
    transfer, f = devices.parameters["efficiency_transfer"].mid, devices.parameters["other_bandwidth_bound"].mid
    gemm = 30 * 1.0 * 989 / (2500 * transfer)
    assert h200.peak_tflops["bf16"].low == 989
    assert column["recipes"]["bf16"]["median_ms"] == pytest.approx(gemm + 5.0 * (f * 4.8 / 8.0 + 1 - f))


def test_components_or_steps_of_another_gpu_are_refused():
    comp = fake_components()
    # the steps of one GPU with the components of another
    mixed = "body was measured on NVIDIA H100 80GB HBM3, its components timed on NVIDIA H200"
    with pytest.raises(projection.ProjectionError, match=mixed):
        projection.attach(
            {**fake_entry(comp, {"emulated": 1.0}), "device": "NVIDIA H100 80GB HBM3"}, comp, load_devices()
        )
    # a GPU devices.yaml does not list, or a projection target, calibrates nothing
    for gpu, key in (("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"), ("NVIDIA B200", "b200")):
        with pytest.raises(projection.ProjectionError, match=f"measured on {gpu} \\(key '{key}'\\)"):
            projection.attach(
                {**fake_entry(comp, {"emulated": 1.0}), "device": gpu}, {**comp, "device": gpu}, load_devices()
            )


def test_an_h100_calibrates_with_its_own_peaks_and_bandwidth(tmp_path):
    """The same parts timed on an H100: its GEMMs scale from its own BF16 peak, its non-GEMM time
    from its 3.35 TB/s (not the H200's 4.8). The packaged H100 and H200 share their peaks, so a
    devices file gives the H100 another BF16 peak (and no FP8 one: then it cannot calibrate)."""
    gpu = "NVIDIA H100 80GB HBM3"
    comp = {**fake_components(), "device": gpu}
    raw = open(load_devices().path).read()
    assert raw.count("peak_tflops: {bf16: 989, fp8: 1979}") == 2  # the H200's, then the H100's
    changed = tmp_path / "devices.yaml"
    changed.write_text(raw[::-1].replace("}9791 :8pf ,989 :61fb{", "}9791 :8pf ,005 :61fb{", 1)[::-1])
    devices = load_devices(str(changed))
    assert devices.devices["h100_80gb_hbm3"].peak_tflops["bf16"].low == 500
    assert devices.devices["h200"].peak_tflops["bf16"].low == 989
    entry = projection.attach({**fake_entry(comp, {"emulated": 1.0}), "device": gpu}, comp, devices)
    assert set(entry["projection_parameters"]["sources"]) == {"h100_80gb_hbm3", "b200", "b300", "gb200"}
    assert entry["columns"]["projection_gb200"]["calibrated_on"] == gpu
    transfer, f = devices.parameters["efficiency_transfer"].mid, devices.parameters["other_bandwidth_bound"].mid
    gemm = 30 * 1.0 * 500 / (2500 * transfer)
    bf16 = entry["columns"]["projection_gb200"]["recipes"]["bf16"]["median_ms"]
    assert bf16 == pytest.approx(gemm + 5.0 * (f * 3.35 / 8.0 + 1 - f))
    assert "NVIDIA H100 80GB HBM3 check" in projection.table(entry)
    no_fp8 = tmp_path / "no_fp8.yaml"
    no_fp8.write_text(raw[::-1].replace("}9791 :8pf ,989 :61fb{", "}989 :61fb{", 1)[::-1])
    with pytest.raises(projection.ProjectionError, match="with BF16 and FP8 peaks .*\\(h200\\)"):
        projection.attach({**fake_entry(comp, {"emulated": 1.0}), "device": gpu}, comp, load_devices(str(no_fp8)))


def test_corners_fix_known_values_and_take_both_ends_of_ranges():
    got = list(projection.corners({"a": Value(1, 1), "b": Value(2, 3), "c": Value(0, 1)}))
    assert sorted((c["a"], c["b"], c["c"]) for c in got) == [(1, 2, 0), (1, 2, 1), (1, 3, 0), (1, 3, 1)]


def test_a_components_file_without_a_shape_names_what_to_time():
    comp = fake_components()
    comp["gemms"].pop(next(iter(comp["gemms"])))
    with pytest.raises(projection.ProjectionError, match="bench components"):
        projection.check(fake_entry(fake_components(), {"emulated": 1.0}), comp)


def test_a_census_without_its_split_asks_for_a_new_measurement():
    comp = fake_components()
    entry = fake_entry(comp, {"emulated": 1.0})
    del entry["columns"]["emulated"]["recipes"]["nvfp4"]["kernels"]["other_ms"]
    with pytest.raises(projection.ProjectionError, match="measure again"):
        projection.check(entry, comp)


def test_components_keep_an_amax_pass_where_any_recipe_takes_one():
    # ue5m3 (held amax) and nvfp4 (current) both quantize in_proj's input 1x16 RNE: one kernel
    # time, and the amax pass nvfp4 needs, whichever recipe comes first
    config = load_model_config("tiny")
    for order in (("ue5m3", "nvfp4"), ("nvfp4", "ue5m3")):
        _, quants = components.work_items(config, {n: load_recipe(n) for n in order}, T)
        assert quants[components.quant_key(T, 128, "1x16 RNE")].amax_pass
    _, held = components.work_items(config, {"ue5m3": load_recipe("ue5m3")}, T)
    assert not held[components.quant_key(T, 128, "1x16 RNE")].amax_pass


def test_cli_project_writes_the_check_and_the_columns_into_the_throughput_file(tmp_path, capsys):
    comp = fake_components()
    (tmp_path / "components_h200.json").write_text(json.dumps({"shapes": {"tiny": comp}, "provenance": {}}))
    # filed under the model alone, as files were before shapes had keys; and another shape of tiny,
    # whose tokens the components were not timed at
    other_shape = {**fake_entry(comp, {"emulated": 1.02}), "seq_len": 2 * T}
    (tmp_path / "throughput_h200.json").write_text(
        json.dumps(
            {
                "shapes": {"tiny": fake_entry(comp, {"emulated": 1.02}), "tiny long": other_shape},
                "provenance": {"device": "NVIDIA H200"},
            }
        )
    )
    assert (
        main(
            [
                "bench",
                "project",
                "--out",
                str(tmp_path / "throughput_h200.json"),
                "--components",
                str(tmp_path / "components_h200.json"),
            ]
        )
        == 0
    )
    written = json.loads((tmp_path / "throughput_h200.json").read_text())
    assert written["provenance"] == {"device": "NVIDIA H200"}
    projected = written["shapes"]["tiny 1x64"]
    assert projected["projection_check"]["within"]
    assert {"projection_b300", "projection_gb200"} <= set(projected["columns"])
    assert written["shapes"]["tiny 1x128"] == other_shape  # kept, not projected
    assert "H200 check" in capsys.readouterr().out
    (tmp_path / "other.json").write_text(json.dumps({"shapes": {"small": comp | {"model": "small"}}}))
    assert (
        main(
            [
                "bench",
                "project",
                "--out",
                str(tmp_path / "throughput_h200.json"),
                "--components",
                str(tmp_path / "other.json"),
            ]
        )
        == 2
    )
    assert "no model and token count is in both" in capsys.readouterr().err
    # an entry that can no longer be projected (a recipe since renamed) keeps what it had; the
    # others are projected and written, and the command says which and why, exit code 1
    gone = {**fake_entry(comp, {"emulated": 1.02}), "batch": 2, "seq_len": T // 2}  # the same tokens
    gone["columns"]["emulated"]["recipes"]["renamed_recipe"] = gone["columns"]["emulated"]["recipes"]["bf16"]
    (tmp_path / "throughput_h200.json").write_text(
        json.dumps({"shapes": {"tiny": fake_entry(comp, {"emulated": 1.02}), "old": gone}})
    )
    # the components file by default: the throughput file's name with components_ for throughput_
    assert main(["bench", "project", "--out", str(tmp_path / "throughput_h200.json")]) == 1
    written = json.loads((tmp_path / "throughput_h200.json").read_text())["shapes"]
    assert "projection_gb200" in written["tiny 1x64"]["columns"] and written["tiny 2x32"] == gone
    err = capsys.readouterr().err
    assert "tiny 2x32 not projected, kept as it was: " in err and "renamed_recipe" in err


def test_a_devices_file_with_a_reversed_range_or_no_sources_is_refused_naming_the_field(tmp_path):
    raw = open(load_devices().path).read()
    bad = tmp_path / "devices.yaml"
    bad.write_text(raw.replace("fp4: 9000}", "fp4: [9000, 8000]}"))
    with pytest.raises(ConfigError, match=r"devices.yaml: field 'b200.fp4'"):
        load_devices(bad)
    bad.write_text(raw.replace("hbm_tb_per_s: 4.8\n    sources:", "hbm_tb_per_s: 4.8\n    sources: []\n    old:"))
    with pytest.raises(ConfigError, match=r"field 'devices.h200"):
        load_devices(bad)
