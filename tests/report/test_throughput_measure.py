"""A throughput claim against body-throughput files: each measured column shown, projections
against the paper's number, and only a native FP4 column deciding the verdict."""

from __future__ import annotations

import math

from synthetic_runs import BLEND, claims_by_id

from fp4repro.report import measure
from fp4repro.report.claims import ClaimPolicies


def test_the_throughput_row_gives_each_measured_column_and_is_not_reproduced_without_the_native_one(tmp_path):
    from fp4repro.bench import throughput

    results = tmp_path / "results"
    rows = {
        "nvfp4": [1000.0, 1010.0, 1000.0, 1005.0, 1000.0],
        "nvfp4_no_rht_no_bf16_tail": [990.0, 1000.0, 990.0, 995.0, 990.0],
    }
    slower = {"nvfp4": rows["nvfp4"], "nvfp4_no_rht_no_bf16_tail": [1010.0, 1020.0, 1010.0, 1015.0, 1010.0]}
    entry = {
        "model": "nemotron_h_8b",
        "seq_len": 8192,
        "batch": 1,
        "steps": 5,
        "device": "NVIDIA H200",
        "not_measured": dict(throughput.NOT_MEASURED),
        "columns": {
            "emulated": {"recipes": {}, "effects": throughput.effects(rows)},
            "fp8_analogue": {"recipes": {}, "effects": throughput.effects(slower), "cast": "clamped"},
        },
    }
    claim = claims_by_id()["throughput_no_rht_no_bf16_tail"]

    def row_of(result, device="h200"):
        """The 8B row once ``result`` is recorded as this device's body-throughput file."""
        throughput.record(results / "bench" / f"throughput_{device}.json", result, "cpu")
        (measured,) = measure(
            claim, results / "paper8b", {"nvfp4": (0,)}, ClaimPolicies.same(claim), BLEND, model="nemotron_h_8b"
        )
        return measured

    row = row_of(entry)
    assert row.verdict == "not measured natively" and row.comparison is None
    # the shape and GPU the paper timed (the authors' report_summary.json and tab:runtime), then ours
    assert row.note.startswith(
        "not measured natively: paper: 1 x 1,024 tokens on one NVIDIA GB200, linears FP4+BF16 nvfp4 96+16, "
        "nvfp4_no_rht_no_bf16_tail 112+0; here, nemotron_h_8b body, nvfp4_no_rht_no_bf16_tail vs nvfp4, "
        "at 1 x 8,192 tokens: NVIDIA H200 emulated: "
    )
    assert "the paper's 1 x 1,024 tokens not measured here" in row.note
    ratio = math.exp(sum(math.log(a / b) for a, b in zip(rows["nvfp4"], rows["nvfp4_no_rht_no_bf16_tail"])) / 5)
    assert f"NVIDIA H200 emulated: {ratio - 1:+.1%}" in row.note and "(raises tokens/s)" in row.note
    assert "NVIDIA H200 fp8 analogue: -1.0%" in row.note and "(lowers tokens/s" in row.note
    assert "direction check at FP8's smaller GEMM ratio: against the paper" in row.note
    noisy = {"nvfp4": [1000.0, 1100.0, 900.0, 1050.0, 950.0], "nvfp4_no_rht_no_bf16_tail": [1000.0] * 5}
    unresolved = {
        **entry,
        "columns": {
            **entry["columns"],
            "fp8_analogue": {"recipes": {}, "effects": throughput.effects(noisy), "cast": "clamped"},
        },
    }
    open_row = row_of(unresolved)
    assert "(does not resolve tokens/s; direction check at FP8's smaller GEMM ratio: not resolved)" in open_row.note
    # eager steps say how much of them the GPU idled (the claim's two recipes' profiles), graph
    # replays do not
    profiled = {
        "nvfp4": {"median_ms": 200.0, "kernels": {"kernel_ms": 150.0}},
        "nvfp4_no_rht_no_bf16_tail": {"median_ms": 100.0, "kernels": {"kernel_ms": 60.0}},
        "bf16": {"median_ms": 100.0, "kernels": {"kernel_ms": 1.0}},  # not the claim's: not counted
    }
    emulated = {"recipes": profiled, "effects": throughput.effects(rows)}
    eager = {**entry, "columns": {"emulated": {**emulated, "timing": "eager"}}}
    assert "(raises tokens/s; eager steps, the GPU idle 25% to 40% of them)" in row_of(eager).note
    replayed = {**entry, "columns": {"emulated": {**emulated, "timing": "cuda_graph"}}}
    assert "GPU idle" not in row_of(replayed).note and "(raises tokens/s)" in row_of(replayed).note
    throughput.record(results / "bench" / "throughput_h200.json", entry, "cpu")
    assert "compute capability >= 10.0" in row.note
    # a projection: its band against the paper's +21.2%
    projected = {
        **entry,
        "columns": {
            **entry["columns"],
            **{
                f"projection_{k}": {
                    "kind": "projection",
                    "target": f"NVIDIA {k.upper()}",
                    "recipes": {},
                    "effects": {
                        "both": {
                            "versus": "nvfp4_no_rht_no_bf16_tail",
                            "speedup": mid,
                            "ci_low": low,
                            "ci_high": high,
                            "speedup_without_other": 1.105,
                            "without_other_low": 1.05,
                            "without_other_high": 1.146,
                        }
                    },
                }
                for k, (low, mid, high) in {
                    "b200": (1.018, 1.029, 1.044),
                    "b300": (1.15, 1.2, 1.25),
                    "gb200": (1.02, 1.03, 1.05),
                }.items()
            },
        },
    }
    band = row_of(projected)
    assert (
        "NVIDIA B200 projected from NVIDIA H200: +2.9% [+1.8%, +4.4%] (band over the projection's parameters; "
        "with no non-GEMM time +10.5% [+5.0%, +14.6%]); the paper's +21.2% is not consistent (outside the band)"
    ) in band.note
    assert "NVIDIA B300 projected from NVIDIA H200: +20.0% [+15.0%, +25.0%]" in band.note
    assert "the paper's +21.2% is consistent (inside the band)" in band.note
    assert "NVIDIA GB200 (the paper's GPU) projected from NVIDIA H200: +3.0% [+2.0%, +5.0%]" in band.note
    assert band.note.count("(the paper's GPU)") == 1  # only the GB200's projection
    # the paper's shape measured too: shown first, said to be the paper's, with the linears timed
    papers = {
        **projected,
        "seq_len": 1024,
        "work": {
            "nvfp4": {"linears": {"fp4": 96, "bf16": 16}},
            "nvfp4_no_rht_no_bf16_tail": {"linears": {"fp4": 112, "bf16": 0}},
        },
    }
    both = row_of(papers)
    assert (
        "; here, nemotron_h_8b body, nvfp4_no_rht_no_bf16_tail vs nvfp4, at 1 x 1,024 tokens (the paper's shape); "
        "linears FP4+BF16 nvfp4 96+16, nvfp4_no_rht_no_bf16_tail 112+0: NVIDIA H200 emulated: "
    ) in both.note
    assert both.note.index("at 1 x 1,024 tokens") < both.note.index("at 1 x 8,192 tokens")
    assert "not measured here" not in both.note
    (results / "bench" / "throughput_h200.json").unlink()
    assert band.verdict == "not measured natively"  # a projection decides nothing
    throughput.record(results / "bench" / "throughput_h200.json", entry, "cpu")
    # a device with FP4 tensor cores: its native column decides
    native = {
        **entry,
        "device": "NVIDIA B200",
        "not_measured": {"projection": "not built"},
        "columns": {**entry["columns"], "native": {"recipes": {}, "effects": throughput.effects(rows)}},
    }
    decided = row_of(native, "b200")
    assert decided.verdict == "reproduced" and "native FP4 on 1 device(s)" in decided.note
    assert "NVIDIA B200 native: " in decided.note and "NVIDIA H200 fp8 analogue" in decided.note
    native["columns"]["native"]["effects"] = throughput.effects(slower)
    against = row_of(native, "b200")
    assert against.verdict == "opposite direction"
    (results / "bench" / "throughput_b200.json").unlink()
    # an analogue measured before its cast clamped is void, and said so
    del entry["columns"]["fp8_analogue"]["cast"]
    void = row_of(entry)
    assert "NVIDIA H200 fp8 analogue: void: made before the FP8 cast clamped" in void.note
    assert void.verdict == "not measured natively"
    (other,) = measure(claim, results / "small", {"nvfp4": (0,)}, ClaimPolicies.same(claim), BLEND, model="small")
    assert (
        other.verdict == "not measured" and "no body-throughput file" in other.note and "small's shapes" in other.note
    )
    assert "measured for other shapes, nemotron_h_8b at 1 x 8,192 tokens: NVIDIA H200 emulated" in other.note
    assert other.note.startswith("not measured: paper: 1 x 1,024 tokens on one NVIDIA GB200")


def test_the_row_shows_the_body_of_the_model_the_paper_timed_beside_the_study_s_own(tmp_path):
    """The claim's setup names the paper's model (the authors' 8B): a study of another model shows
    what that model's body gave at the paper's shape after its own, and decides nothing by it."""
    from fp4repro.bench import throughput

    rows = {"nvfp4": [1000.0, 1010.0, 1000.0, 1005.0, 1000.0], "nvfp4_no_rht_no_bf16_tail": [1020.0] * 5}
    claim = claims_by_id()["throughput_no_rht_no_bf16_tail"]
    assert claim.reported.setup.model == "nemotron_h_8b_paper"

    def entry(model: str, seq_len: int, effects: dict) -> dict:
        columns = {"emulated": {"recipes": {}, "effects": throughput.effects(effects), "timing": "cuda_graph"}}
        return {"model": model, "seq_len": seq_len, "batch": 1, "steps": 5, "device": "NVIDIA H100 80GB HBM3"} | {
            "not_measured": dict(throughput.NOT_MEASURED),
            "columns": columns,
        }

    bench = tmp_path / "results" / "bench"
    throughput.record(bench / "throughput_h100.json", entry("small", 2048, rows), "cpu")
    swapped = {"nvfp4": rows["nvfp4_no_rht_no_bf16_tail"], "nvfp4_no_rht_no_bf16_tail": rows["nvfp4"]}
    throughput.record(bench / "throughput_h100.json", entry("nemotron_h_8b_paper", 1024, swapped), "cpu")

    def row(model: str):
        study = tmp_path / "results" / model
        (measured,) = measure(claim, study, {"nvfp4": (0,)}, ClaimPolicies.same(claim), BLEND, model=model)
        return measured

    small = row("small")
    assert small.verdict == "not measured natively"
    own, papers = small.note.split("; the paper's model, nemotron_h_8b_paper body, ")
    assert "here, small body" in own and "at 1 x 2,048 tokens: NVIDIA H100 80GB HBM3 emulated: -" in own
    assert papers.startswith("at 1 x 1,024 tokens (the paper's shape): NVIDIA H100 80GB HBM3 emulated: +")
    # the paper's model studied itself: shown once, as the study's own
    paper8b = row("nemotron_h_8b_paper")
    assert "the paper's model" not in paper8b.note and "here, nemotron_h_8b_paper body" in paper8b.note
