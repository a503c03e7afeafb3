"""The claims file against measured results: paired tests with known answers, verdicts, and what
cannot be measured.

The results are synthetic tables in the results layout, built so that each comparison's answer
is known without the code under test: a recipe's loss, document NLL or item outcomes are the
baseline's plus a fixed offset, and the noise is either shared by both recipes of a seed (the
pairing the tests exploit) or drawn per recipe from stable seeds.
"""

import json
import math
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fp4repro.config.files import PACKAGED, claims_path
from fp4repro.config.study import load_study
from fp4repro.report import ReportError, load_claims, measure, runs_text, write_report
from fp4repro.results import eval_dir, run_dir
from fp4repro.statistics import OPPOSITE, REPRODUCED, SUGGESTIVE, WITHIN_NOISE

CLAIMS = PACKAGED / "claims.yaml"
STEPS = 40                    # training steps; the final window is the last 10
DOCS = 60                     # held-out documents per source
ITEMS = 50                    # items per downstream task
BLEND = {"prose": 0.4, "code": 0.6}


def rng(*key) -> np.random.Generator:
    """A generator seeded by a stable hash of ``key`` (Python's hash() is salted per process)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def write_run(results: Path, recipe: str, seed: int, loss: float = 0.0, nll: float = 0.0, correct: int = 25,
              underflow: float = 0.0, clipped: float = 0.0, own_noise: float = 0.002) -> None:
    """One run (recipe, seed) of experiment `tiny`: loss and NLL offset by ``loss`` and ``nll`` from
    a curve shared by every recipe of the seed, ``correct`` of ITEMS items right per task (the
    first ones), events at the given per-step rates."""
    train, ev = run_dir(results, "tiny", recipe, seed), eval_dir(results, "tiny", recipe, seed)
    train.mkdir(parents=True)
    ev.mkdir(parents=True)
    steps = np.arange(1, STEPS + 1)
    shared = rng("loss", seed).normal(0, 0.05, STEPS)          # the batch's difficulty: same for every recipe
    losses = 3.0 - 0.01 * steps + shared + loss + rng("own", recipe, seed).normal(0, own_noise, STEPS)
    pd.DataFrame({"step": steps, "tokens": steps * 100, "stage": "s1", "loss": losses}).to_parquet(
        train / "metrics.parquet")
    (ev / "final_loss.json").write_text(json.dumps({"final_window": 0.25, "loss": float(losses[-10:].mean()),
                                                    "first_step": STEPS - 9, "last_step": STEPS,
                                                    "tokens_from": 3000, "tokens_to": 4000}))
    meta = {"recipe": recipe, "seed": seed, "tokens": 4000, "policy": "quantized"}
    docs = []
    for source in BLEND:
        predicted = rng("predicted", source).integers(20, 200, DOCS)
        base = 3.0 + rng("doc", source, seed).normal(0, 0.5, DOCS)   # per document, shared by recipes
        for step, later in ((20, 0.5), (40, 0.0)):
            docs += [{**meta, "step": step, "source": source, "document": d, "predicted": int(n),
                      "nll_sum": float(n * (base[d] + later + nll))} for d, n in enumerate(predicted)]
    docs = pd.DataFrame(docs)
    docs.to_parquet(ev / "nll_documents.parquet")
    nll_rows = []
    for step, group in docs.groupby("step"):
        per = group.groupby("source")[["nll_sum", "predicted"]].sum()
        values = (per["nll_sum"] / per["predicted"]).to_dict()
        values["blend"] = sum(w * values[s] for s, w in BLEND.items())
        nll_rows += [{**meta, "step": step, "source": s, "nll": v, "tokens_evaluated": 100} for s, v in values.items()]
    pd.DataFrame(nll_rows).to_parquet(ev / "nll.parquet")
    items, aggregates = [], []
    for task in ("t1", "t2"):
        items += [{**meta, "step": 40, "aggregate": "agg", "task": task, "doc_id": i, "metric": "acc",
                   "value": float(i < correct)} for i in range(ITEMS)]
        aggregates.append({**meta, "step": 40, "aggregate": "agg", "task": task, "level": "task", "metric": "acc",
                           "value": correct / ITEMS, "stderr": 0.07, "n": ITEMS})
    aggregates.append({**meta, "step": 40, "aggregate": "agg", "task": "agg", "level": "aggregate", "metric": "acc",
                       "value": correct / ITEMS, "stderr": 0.05, "n": 2 * ITEMS})
    pd.DataFrame(items).to_parquet(ev / "downstream_items.parquet")
    pd.DataFrame(aggregates).to_parquet(ev / "downstream.parquet")
    telemetry = []
    for step in range(STEPS):
        for operand in ("dgrad.dy", "wgrad.dy", "fprop.x"):
            wiggle = rng("events", recipe, seed, step, operand).uniform(0.8, 1.2)
            small = operand != "fprop.x"
            telemetry.append({"step": step, "layer": "layers.0.mixer.in_proj", "operand": operand,
                              "steps_since_refresh": step % 3, "blocks": 10_000, "saturated_blocks": 0,
                              "underflow_blocks": round(10_000 * underflow * wiggle) if small else 7,
                              "nonzero_elements": 100_000,
                              "clipped_elements": round(100_000 * clipped * wiggle) if small else 3})
    pd.DataFrame(telemetry).to_parquet(train / "telemetry.parquet")


def claims_by_id() -> dict:
    return {c.id: c for c in load_claims(CLAIMS)[1]}


def rows_of(claim_id: str, results: Path, seeds=(0,), recipes=("nvfp4", "ue5m3", "ue5m3_t2048")):
    return measure(claims_by_id()[claim_id], results / "tiny", {r: tuple(seeds) for r in recipes}, BLEND)


def one_seed(tmp_path: Path, claim_id: str, **ue5m3) -> object:
    """The one report line of ``claim_id`` for seed-0 runs of nvfp4 and of ue5m3 (built with the
    ``write_run`` offsets ``ue5m3``)."""
    results = tmp_path / "results"
    write_run(results, "nvfp4", 0)
    write_run(results, "ue5m3", 0, **ue5m3)
    (row,) = rows_of(claim_id, results)
    return row


# ------------------------------------------------------------------------------- the claims file

def test_the_packaged_claims_file_is_valid_and_a_local_one_comes_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert claims_path() == CLAIMS
    paper, claims = load_claims(CLAIMS)
    assert "UE5M3" in paper["title"] and {c.measure for c in claims} == {
        "final_loss", "heldout_nll", "downstream", "telemetry", "throughput"}
    assert {c.event for c in claims if c.measure == "telemetry"} == {"underflow", "saturation", "clipping"}
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "claims.yaml").write_text(CLAIMS.read_text())
    assert claims_path().resolve() == (tmp_path / "configs" / "claims.yaml").resolve()


def test_a_broken_claims_file_names_the_field(tmp_path):
    bad = tmp_path / "claims.yaml"
    bad.write_text(CLAIMS.read_text().replace("expect: lower", "expect: smaller", 1))
    with pytest.raises(ReportError, match=r"claims.yaml: field 'claims.0.expect': value 'smaller'"):
        load_claims(bad)


# ------------------------------------------------------------------------------- final-window loss

def test_one_seed_loss_is_paired_by_step_and_at_most_suggestive(tmp_path):
    row = one_seed(tmp_path, "final_loss", loss=-0.1)
    k = row.comparison
    # the shared batch noise (sd 0.05) cancels in the per-step difference: only the recipes' own
    # noise (sd 0.002 each) is left, so the interval is tight around the offset
    assert k.difference == pytest.approx(-0.1, abs=0.005) and k.high < 0
    assert k.test.startswith("batch means: 10 steps") and k.units == 10
    assert k.high - k.low < 0.02
    assert row.verdict == SUGGESTIVE                      # one seed: an outcome of training is capped


def test_recipes_with_fewer_seeds_are_paired_on_the_seeds_they_share(tmp_path):
    results = tmp_path / "results"
    for seed in (0, 1, 2):
        write_run(results, "nvfp4", seed)
    write_run(results, "ue5m3", 2, loss=-0.1)
    claim = claims_by_id()["final_loss"]
    (row,) = measure(claim, results / "tiny", {"nvfp4": (0, 1, 2), "ue5m3": (2,)}, BLEND)
    assert row.comparison.difference == pytest.approx(-0.1, abs=0.005) and "1 seed(s)" in row.note
    (apart,) = measure(claim, results / "tiny", {"nvfp4": (0, 1), "ue5m3": (2,)}, BLEND)
    assert apart.comparison is None and apart.note == "not measured: ue5m3 (seeds [2]) and nvfp4 (seeds [0, 1]) share no seed"
    assert runs_text({"nvfp4": (0, 1, 2), "ue5m3": (2,)}, {"nvfp4": (0, 1, 2), "ue5m3": (0, 1, 2)}) == (
        "seeds nvfp4 0, 1, 2; ue5m3 2 (4 of 6 planned runs; not there yet: ue5m3 seed 0, ue5m3 seed 1)")


def test_one_seed_loss_in_the_other_direction(tmp_path):
    row = one_seed(tmp_path, "final_loss", loss=+0.05)
    assert row.verdict == OPPOSITE


def test_seeds_give_a_seed_level_test_that_can_reproduce(tmp_path):
    results = tmp_path / "results"
    for seed in (0, 1, 2):
        write_run(results, "nvfp4", seed)
        write_run(results, "ue5m3", seed, loss=-0.1)
    (row,) = rows_of("final_loss", results, seeds=(0, 1, 2))
    k = row.comparison
    assert k.test == "paired t over 3 seeds" and k.units == 3
    assert k.difference == pytest.approx(-0.1, abs=0.005)
    assert row.verdict == REPRODUCED
    finals = {r: [json.loads((eval_dir(results, "tiny", r, s) / "final_loss.json").read_text())["loss"]
                  for s in (0, 1, 2)] for r in ("ue5m3", "nvfp4")}
    assert row.recipe_value == pytest.approx(np.mean(finals["ue5m3"]))
    assert row.baseline_value == pytest.approx(np.mean(finals["nvfp4"]))


def test_two_seeds_give_the_t_interval_of_their_differences(tmp_path):
    """With two seeds, d_s = final loss(ue5m3, s) − final loss(nvfp4, s): the interval is
    mean(d) ± t_{0.975, 1} · |d_0 − d_1| / 2 (12.706: the price of two seeds)."""
    results = tmp_path / "results"
    for seed in (0, 1):
        write_run(results, "nvfp4", seed, own_noise=0.3)
        write_run(results, "ue5m3", seed, loss=-0.01, own_noise=0.3)
    (row,) = rows_of("final_loss", results, seeds=(0, 1))
    final = {(r, s): json.loads((eval_dir(results, "tiny", r, s) / "final_loss.json").read_text())["loss"]
             for r in ("ue5m3", "nvfp4") for s in (0, 1)}
    d = [final["ue5m3", s] - final["nvfp4", s] for s in (0, 1)]
    half = 12.7062047 * abs(d[0] - d[1]) / 2
    k = row.comparison
    assert k.difference == pytest.approx(np.mean(d))
    assert (k.low, k.high) == (pytest.approx(np.mean(d) - half), pytest.approx(np.mean(d) + half))
    assert row.verdict == (REPRODUCED if k.high < 0 else WITHIN_NOISE if k.difference < 0 else OPPOSITE)


# ------------------------------------------------------------------------------------ held-out NLL

def test_one_seed_nll_bootstraps_documents_at_the_last_checkpoint(tmp_path):
    row = one_seed(tmp_path, "heldout_nll", nll=-0.02)
    k = row.comparison
    # each document's NLL is the baseline's minus 0.02 exactly: the blend difference is -0.02 and
    # so is every resample's (the bootstrap draws the same documents for both recipes)
    assert k.difference == pytest.approx(-0.02, abs=1e-9)
    assert k.low == pytest.approx(-0.02, abs=1e-9) and k.high == pytest.approx(-0.02, abs=1e-9)
    assert k.test.startswith(f"paired bootstrap over {2 * DOCS} documents") and k.units == 2 * DOCS
    assert "at step 40" in row.note
    assert row.verdict == SUGGESTIVE


def test_nll_bootstrap_width_follows_the_per_document_noise(tmp_path):
    """Per-document differences of sd 0.1 over 120 documents: the 95% interval of the blend
    difference is about ±1.96 · 0.1 · sqrt(0.4² / 60 + 0.6² / 60) ≈ ±0.018 wide on each side."""
    results = tmp_path / "results"
    write_run(results, "nvfp4", 0)
    write_run(results, "ue5m3", 0)
    path = eval_dir(results, "tiny", "ue5m3", 0) / "nll_documents.parquet"
    docs = pd.read_parquet(path)
    noise = rng("doc noise").normal(0, 0.1, len(docs))
    docs["nll_sum"] += noise * docs["predicted"]
    docs.to_parquet(path)
    (row,) = rows_of("heldout_nll", results)
    half = (row.comparison.high - row.comparison.low) / 2
    assert 0.012 < half < 0.026
    assert row.verdict in (WITHIN_NOISE, OPPOSITE, SUGGESTIVE)


def test_a_missing_document_table_is_not_measured_and_named(tmp_path):
    results = tmp_path / "results"
    write_run(results, "nvfp4", 0)
    write_run(results, "ue5m3", 0, nll=-0.02)
    (eval_dir(results, "tiny", "ue5m3", 0) / "nll_documents.parquet").unlink()
    (row,) = rows_of("heldout_nll", results)
    assert not row.measured and row.note.startswith("not measured") and "nll_documents.parquet" in row.note


# -------------------------------------------------------------------------------------- downstream

def test_one_seed_downstream_is_a_paired_item_test(tmp_path):
    results = tmp_path / "results"
    write_run(results, "nvfp4", 0, correct=20)
    write_run(results, "ue5m3", 0, correct=30)
    (row,) = rows_of("downstream", results)
    k = row.comparison
    assert row.label == "downstream: agg"
    assert k.difference == pytest.approx(10 / ITEMS)
    # d is 1 on items 20..29 and 0 elsewhere, in each task: var(d) = 10·40/(50·49), two tasks of
    # weight 1/2: SE = sqrt(2 · 1/4 · var/50)
    var = 10 * 40 / (ITEMS * (ITEMS - 1))
    assert k.stderr == pytest.approx(np.sqrt(2 * 0.25 * var / ITEMS))
    assert k.units == 2 * ITEMS and row.verdict == SUGGESTIVE


def test_downstream_with_seeds_uses_the_aggregate_per_seed(tmp_path):
    results = tmp_path / "results"
    for seed, (b, a) in enumerate(((20, 30), (22, 30), (21, 29))):
        write_run(results, "nvfp4", seed, correct=b)
        write_run(results, "ue5m3", seed, correct=a)
    (row,) = rows_of("downstream", results, seeds=(0, 1, 2))
    assert row.comparison.test == "paired t over 3 seeds"
    assert row.comparison.difference == pytest.approx((10 + 8 + 8) / 3 / ITEMS)
    assert row.verdict == REPRODUCED


# ---------------------------------------------------------------------------------------- telemetry

def test_telemetry_rates_are_paired_per_step_and_capped_with_one_seed(tmp_path):
    results = tmp_path / "results"
    write_run(results, "ue5m3", 0, underflow=0.004, clipped=0.001)
    write_run(results, "ue5m3_t2048", 0, underflow=0.001, clipped=0.002)
    rows = {c: rows_of(c, results)[0] for c in ("t2048_underflow", "t2048_saturation", "t2048_clipping")}
    under = rows["t2048_underflow"]
    tele = {r: pd.read_parquet(run_dir(results, "tiny", r, 0) / "telemetry.parquet") for r in ("ue5m3", "ue5m3_t2048")}
    dy = {r: t[t["operand"].isin(["dgrad.dy", "wgrad.dy"])] for r, t in tele.items()}
    assert under.recipe_value == pytest.approx(dy["ue5m3_t2048"]["underflow_blocks"].sum() / (80 * 10_000))
    assert under.baseline_value == pytest.approx(dy["ue5m3"]["underflow_blocks"].sum() / (80 * 10_000))
    assert under.comparison.test.startswith("batch means: 40 steps")
    per_step = {r: t.groupby("step")["underflow_blocks"].sum() / 20_000 for r, t in dy.items()}
    assert under.comparison.difference == pytest.approx((per_step["ue5m3_t2048"] - per_step["ue5m3"]).mean())
    # beyond the per-step noise, but the rates are outcomes of training too: one seed is capped
    assert under.comparison.verdict(under.claim.expect) == REPRODUCED and under.verdict == SUGGESTIVE
    clip = rows["t2048_clipping"]
    assert clip.recipe_value == pytest.approx(dy["ue5m3_t2048"]["clipped_elements"].sum() / (80 * 100_000))
    assert clip.verdict == OPPOSITE
    assert rows["t2048_saturation"].note.startswith("not resolved: no saturation events")


def test_unmeasured_claims_say_why(tmp_path):
    results = tmp_path / "results"
    write_run(results, "nvfp4", 0)
    write_run(results, "ue5m3", 0)
    (absent,) = rows_of("t2048_underflow", results, recipes=("nvfp4", "ue5m3"))
    assert absent.note == "not measured: no run of ue5m3_t2048 in this experiment"
    (missing,) = rows_of("final_loss", results, seeds=(0, 1))
    assert missing.note.startswith("not measured") and "seed1" in missing.note
    (throughput,) = rows_of("throughput_no_rht_no_bf16_tail", results,
                            recipes=("nvfp4", "nvfp4_no_rht_no_bf16_tail"))
    assert throughput.note.startswith("not measured: no body-throughput file")


def test_the_throughput_row_gives_each_measured_column_and_is_not_reproduced_without_the_native_one(tmp_path):
    from fp4repro.bench import throughput

    results = tmp_path / "results"
    rows = {"nvfp4": [1000.0, 1010.0, 1000.0, 1005.0, 1000.0], "nvfp4_no_rht_no_bf16_tail": [990.0, 1000.0, 990.0, 995.0, 990.0]}
    slower = {"nvfp4": rows["nvfp4"], "nvfp4_no_rht_no_bf16_tail": [1010.0, 1020.0, 1010.0, 1015.0, 1010.0]}
    entry = {"model": "nemotron_h_8b", "seq_len": 8192, "batch": 1, "steps": 5, "device": "NVIDIA H200",
             "not_measured": dict(throughput.NOT_MEASURED),
             "columns": {"emulated": {"recipes": {}, "effects": throughput.effects(rows)},
                         "fp8_analogue": {"recipes": {}, "effects": throughput.effects(slower), "cast": "clamped"}}}
    throughput.record(results / "bench" / "throughput_h200.json", entry, "cpu")
    claim = claims_by_id()["throughput_no_rht_no_bf16_tail"]
    (row,) = measure(claim, results / "paper8b", {"nvfp4": (0,)}, BLEND, model="nemotron_h_8b")
    assert row.verdict == "not measured natively" and row.comparison is None
    ratio = math.exp(sum(math.log(a / b) for a, b in zip(rows["nvfp4"], rows["nvfp4_no_rht_no_bf16_tail"])) / 5)
    assert f"NVIDIA H200 emulated: {ratio - 1:+.1%}" in row.note and "(raises tokens/s)" in row.note
    assert "NVIDIA H200 fp8 analogue: -1.0%" in row.note and "(lowers tokens/s" in row.note
    assert "direction check at FP8's smaller GEMM ratio: against the paper" in row.note
    noisy = {"nvfp4": [1000.0, 1100.0, 900.0, 1050.0, 950.0], "nvfp4_no_rht_no_bf16_tail": [1000.0] * 5}
    unresolved = {**entry, "columns": {**entry["columns"], "fp8_analogue": {
        "recipes": {}, "effects": throughput.effects(noisy), "cast": "clamped"}}}
    throughput.record(results / "bench" / "throughput_h200.json", unresolved, "cpu")
    (open_row,) = measure(claim, results / "paper8b", {"nvfp4": (0,)}, BLEND, model="nemotron_h_8b")
    assert "(does not resolve tokens/s; direction check at FP8's smaller GEMM ratio: not resolved)" in open_row.note
    throughput.record(results / "bench" / "throughput_h200.json", entry, "cpu")
    assert "compute capability >= 10.0" in row.note
    # a projection: its band against the paper's +21.2%
    projected = {**entry, "columns": {**entry["columns"], **{f"projection_{k}": {
        "kind": "projection", "target": f"NVIDIA {k.upper()}", "recipes": {}, "effects": {"both": {
            "versus": "nvfp4_no_rht_no_bf16_tail", "speedup": mid, "ci_low": low, "ci_high": high,
            "speedup_without_other": 1.105, "without_other_low": 1.05, "without_other_high": 1.146}}}
        for k, (low, mid, high) in
        {"b200": (1.018, 1.029, 1.044), "b300": (1.15, 1.2, 1.25)}.items()}}}
    throughput.record(results / "bench" / "throughput_h200.json", projected, "cpu")
    (band,) = measure(claim, results / "paper8b", {"nvfp4": (0,)}, BLEND, model="nemotron_h_8b")
    assert ("NVIDIA B200 projected from NVIDIA H200: +2.9% [+1.8%, +4.4%] (band over the projection's parameters; "
            "with no non-GEMM time +10.5% [+5.0%, +14.6%]); the paper's +21.2% is not consistent (outside the band)") in band.note
    assert "NVIDIA B300 projected from NVIDIA H200: +20.0% [+15.0%, +25.0%]" in band.note
    assert "the paper's +21.2% is consistent (inside the band)" in band.note
    assert band.verdict == "not measured natively"      # a projection decides nothing
    throughput.record(results / "bench" / "throughput_h200.json", entry, "cpu")
    # a device with FP4 tensor cores: its native column decides
    native = {**entry, "device": "NVIDIA B200", "not_measured": {"projection": "not built"},
              "columns": {**entry["columns"], "native": {"recipes": {}, "effects": throughput.effects(rows)}}}
    throughput.record(results / "bench" / "throughput_b200.json", native, "cpu")
    (decided,) = measure(claim, results / "paper8b", {"nvfp4": (0,)}, BLEND, model="nemotron_h_8b")
    assert decided.verdict == "reproduced" and "native FP4 on 1 device(s)" in decided.note
    assert "NVIDIA B200 native: " in decided.note and "NVIDIA H200 fp8 analogue" in decided.note
    native["columns"]["native"]["effects"] = throughput.effects(slower)
    throughput.record(results / "bench" / "throughput_b200.json", native, "cpu")
    (against,) = measure(claim, results / "paper8b", {"nvfp4": (0,)}, BLEND, model="nemotron_h_8b")
    assert against.verdict == "opposite direction"
    (results / "bench" / "throughput_b200.json").unlink()
    # an analogue measured before its cast clamped is void, and said so
    del entry["columns"]["fp8_analogue"]["cast"]
    throughput.record(results / "bench" / "throughput_h200.json", entry, "cpu")
    (void,) = measure(claim, results / "paper8b", {"nvfp4": (0,)}, BLEND, model="nemotron_h_8b")
    assert "NVIDIA H200 fp8 analogue: void: made before the FP8 cast clamped" in void.note
    assert void.verdict == "not measured natively"
    (other,) = measure(claim, results / "small", {"nvfp4": (0,)}, BLEND, model="small")
    assert other.note.startswith("not measured: no body-throughput file") and "small's shapes" in other.note
    assert "measured for other shapes, nemotron_h_8b: NVIDIA H200 emulated" in other.note


def test_write_report_writes_markdown_with_verdicts_and_figure_links(tmp_path, monkeypatch):
    results = tmp_path / "results"
    for recipe in ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4", "nvfp4_first_last_bf16"):
        write_run(results, recipe, 0, loss=-0.1 if recipe == "ue5m3" else 0.0, underflow=0.002, clipped=0.001)
    monkeypatch.chdir(tmp_path)
    write_report(load_study("tiny"), "claims", "paper/tiny/report.md", figures=["figures/tiny/loss.png"])
    text = (tmp_path / "paper/tiny/report.md").read_text()
    assert "from experiment `tiny`" in text and "1,078,464 parameters" in text and "seeds bf16 0; " in text
    assert "![loss](../../figures/tiny/loss.png)" in text
    assert "| throughput_no_rht_no_bf16_tail | more model-body tokens/s (+21.2% tokens/s) |" in text
    loss_line = next(line for line in text.splitlines() if line.startswith("| final_loss |"))
    assert "batch means" in loss_line and f"**{SUGGESTIVE}**" in loss_line
    assert "Mechanism: an element clipped at ±6" in text
    # beyond the paper (ue5m3 and ue5m3_t2048 are studied): after the claims, before the figures
    assert text.index("## Claims") < text.index("## Beyond the paper: an automatic target T") < text.index("## Figures")
    assert "| ue5m3_t2048 |" in text and "- ue5m3_auto has no results here (not among the recipes, or not run yet): no comparison." in text


def test_the_report_command_counts_the_verdicts(tmp_path, monkeypatch, capsys):
    from fp4repro.cli import main

    results = tmp_path / "results"
    for recipe in ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4"):
        write_run(results, recipe, 0, loss=-0.1 if recipe == "ue5m3" else 0.0, underflow=0.002)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--experiment", "tiny"]) == 0
    out = capsys.readouterr().out
    rows = measure_all(results)
    measured = [r for r in rows if r.measured]
    assert f"wrote paper/tiny/report.md: {len(rows)} lines, {len(measured)} measured" in out
    assert f"{sum(r.verdict == SUGGESTIVE for r in measured)} {SUGGESTIVE}" in out


def measure_all(results: Path) -> list:
    return [row for c in load_claims(CLAIMS)[1]
            for row in measure(c, results / "tiny", dict.fromkeys(("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4"), (0,)), BLEND)]


# ------------------------------------------------------------- beyond the paper: automatic target T

from fp4repro.report import target_section  # noqa: E402

CLASSES = {"activations": ("fprop.x", "wgrad.x"), "weights": ("fprop.w", "dgrad.w"),
           "gradients": ("dgrad.dy", "wgrad.dy")}


def target_telemetry(recipe: str, seed: int, scale: dict | None = None, saturated: int = 0,
                     target: bool = True) -> list[dict]:
    """Telemetry of all six operands with random counts (stable per recipe, seed, step, layer,
    operand); ``scale``: class -> factor on its underflow and clipping counts; ``saturated``: the
    saturated blocks of every gradient row; T: 448 then, for ue5m3_auto, growing per step."""
    rows = []
    for step in range(0, 30, 3):
        for layer in ("layers.0.mixer.in_proj", "layers.1.mlp.fc1"):
            for cls, ops in CLASSES.items():
                for op in ops:
                    g = rng("target", recipe, seed, step, layer, op)
                    f = (scale or {}).get(cls, 1.0)
                    row = {"step": step, "layer": layer, "operand": op, "steps_since_refresh": step % 10,
                           "blocks": 1000, "saturated_blocks": saturated if cls == "gradients" else 0,
                           "underflow_blocks": round(f * g.integers(0, 20)), "nonzero_elements": 16_000,
                           "clipped_elements": round(f * g.integers(0, 200))}
                    if target:
                        row["target"] = 448.0 * (1 + step // 10 * (2 if cls == "gradients" else 1)) \
                            if recipe == "ue5m3_auto" else {"ue5m3_t8192": 8192.0, "ue5m3_t2048": 2048.0}.get(
                                recipe, 448.0) if (recipe != "ue5m3_t2048" or cls == "gradients") else 448.0
                    rows.append(row)
    return rows


def write_target_run(results: Path, recipe: str, seed: int, loss: float = 0.0, **telemetry) -> list[dict]:
    write_run(results, recipe, seed, loss=loss)
    rows = target_telemetry(recipe, seed, **telemetry)
    pd.DataFrame(rows).to_parquet(run_dir(results, "tiny", recipe, seed) / "telemetry.parquet")
    return rows


def section_table(lines: list[str]) -> dict[str, dict[str, str]]:
    """recipe -> column -> cell of the section's table."""
    table = [line for line in lines if line.startswith("| ")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    return {cells[0]: dict(zip(head, cells)) for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in table[1:])}


def test_target_section_rates_losses_and_T_ranges_are_those_of_the_runs(tmp_path):
    results = tmp_path / "results"
    written = {}
    for recipe in ("ue5m3", "ue5m3_t2048", "ue5m3_t8192", "ue5m3_auto"):
        for seed in (0, 1):
            written[recipe, seed] = write_target_run(results, recipe, seed, loss=0.01 * len(recipe),
                                                     target=recipe != "ue5m3")
    (eval_dir(results, "tiny", "ue5m3_t8192", 1) / "final_loss.json").unlink()
    lines = target_section(results / "tiny", dict.fromkeys(["nvfp4", "ue5m3", "ue5m3_t2048", "ue5m3_t8192", "ue5m3_auto"], (0, 1)))
    assert lines[1] == "## Beyond the paper: an automatic target T" and "Not a claim of the paper" in lines[3]
    table = section_table(lines)
    assert list(table) == ["ue5m3", "ue5m3_t2048", "ue5m3_t8192", "ue5m3_auto"]
    short = {"activations": "act.", "weights": "wts.", "gradients": "grads"}
    for recipe, cells in table.items():
        for cls, ops in CLASSES.items():
            for event, count, units in (("underflow", "underflow_blocks", "blocks"),
                                        ("saturation", "saturated_blocks", "blocks"),
                                        ("clipping", "clipped_elements", "nonzero_elements")):
                per_seed = []
                for seed in (0, 1):
                    rows = [r for r in written[recipe, seed] if r["operand"] in ops]
                    per_seed.append(sum(r[count] for r in rows) / sum(r[units] for r in rows))
                expected = (per_seed[0] + per_seed[1]) / 2
                assert cells[f"{event} {short[cls]}"] == ("0" if expected == 0 else f"{expected:.3e}")
        losses = [json.loads((eval_dir(results, "tiny", recipe, s) / "final_loss.json").read_text())["loss"]
                  for s in (0, 1) if (eval_dir(results, "tiny", recipe, s) / "final_loss.json").is_file()]
        assert cells["final-window loss"] == ("–" if recipe == "ue5m3_t8192" else f"{np.mean(losses):.4f}")
    assert [table["ue5m3_auto"][f"T {s}"] for s in ("act.", "wts.", "grads")] == ["896 (448–1344)", "896 (448–1344)", "1344 (448–2240)"]
    assert [table["ue5m3_t2048"][f"T {s}"] for s in ("act.", "wts.", "grads")] == ["448", "448", "2048"]
    assert table["ue5m3_t8192"]["T grads"] == "8192" and table["ue5m3"]["T act."] == "not recorded"


def comparison_lines(lines: list[str]) -> dict[str, str]:
    return {cls: next(line for line in lines if line.startswith(f"- **{cls}**")) for cls in CLASSES}


def test_target_comparison_follows_the_numbers(tmp_path):
    results = tmp_path / "results"
    recipes = ["ue5m3", "ue5m3_t2048", "ue5m3_auto"]
    write_target_run(results, "ue5m3", 0)
    write_target_run(results, "ue5m3_t2048", 0, scale={"gradients": 0.5})
    # automatic: fewer events than both in activations and gradients, more in weights; no saturation
    write_target_run(results, "ue5m3_auto", 0, scale={"activations": 0.2, "weights": 3.0, "gradients": 0.1})
    lines = comparison_lines(target_section(results / "tiny", dict.fromkeys(recipes, (0,))))
    assert all("ue5m3_auto has no block-saturation event (0 of 40,000 blocks)" in line for line in lines.values())
    assert "is no higher than the better of T = 448 and T = 2048 (ue5m3_t2048: " in lines["gradients"]
    assert "is no higher than" in lines["activations"]
    assert "is higher than the better" in lines["weights"]
    # the numbers the other way: automatic has saturation and more events where it had fewer
    for recipe in recipes:
        for folder in (run_dir(results, "tiny", recipe, 0), eval_dir(results, "tiny", recipe, 0)):
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()
    write_target_run(results, "ue5m3", 0)
    write_target_run(results, "ue5m3_t2048", 0, scale={"gradients": 0.5})
    write_target_run(results, "ue5m3_auto", 0, scale={"activations": 3.0, "weights": 0.2, "gradients": 2.0},
                     saturated=3)
    lines = comparison_lines(target_section(results / "tiny", dict.fromkeys(recipes, (0,))))
    assert "has block-saturation events (120 of 40,000 blocks)" in lines["gradients"]
    assert "has no block-saturation event" in lines["weights"]
    assert "is higher than the better" in lines["gradients"] and "is higher than the better" in lines["activations"]
    assert "is no higher than the better of T = 448 and T = 2048 (ue5m3: " in lines["weights"]


def test_target_section_needs_two_of_its_recipes(tmp_path):
    results = tmp_path / "results"
    for recipe in ("nvfp4", "ue5m3", "ue5m3_auto"):
        write_target_run(results, recipe, 0)
    assert target_section(results / "tiny", dict.fromkeys(["nvfp4", "ue5m3"], (0,))) == []
    assert target_section(results / "tiny", dict.fromkeys(["nvfp4", "ue5m3_auto", "mxfp4"], (0,))) == []
    lines = target_section(results / "tiny", dict.fromkeys(["nvfp4", "ue5m3", "ue5m3_auto"], (0,)))
    assert list(section_table(lines)) == ["ue5m3", "ue5m3_auto"]


def test_runs_of_different_corpora_are_not_paired(tmp_path):
    from fp4repro.results import write_table

    results = tmp_path / "results"
    write_run(results, "nvfp4", 0)
    write_run(results, "ue5m3", 0, loss=-0.1)
    for recipe, digest in (("nvfp4", "aaaa"), ("ue5m3", "aaaa")):
        path = run_dir(results, "tiny", recipe, 0) / "metrics.parquet"
        write_table(path, pd.read_parquet(path), {"data": digest})
    (same,) = rows_of("final_loss", results)
    assert same.comparison is not None
    path = run_dir(results, "tiny", "ue5m3", 0) / "metrics.parquet"
    write_table(path, pd.read_parquet(path), {"data": "bbbb"})
    for claim in ("final_loss", "heldout_nll"):
        (row,) = rows_of(claim, results)
        assert row.comparison is None and "different corpora (data digests aaaa, bbbb)" in row.note


def test_a_diverged_run_is_named_and_not_paired(tmp_path, monkeypatch):
    results = tmp_path / "results"
    write_run(results, "nvfp4", 0)
    write_run(results, "ue5m3", 0, loss=-0.1)
    summary = eval_dir(results, "tiny", "ue5m3", 0) / "final_loss.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "diverged": {"step": 37, "reason": "step 37"}}))
    for claim in ("final_loss", "heldout_nll", "downstream"):
        (row,) = rows_of(claim, results)
        assert row.comparison is None
        assert row.note == "not paired: ue5m3 seed 0 diverged at step 37 (its telemetry holds the failing step)"


def _phase_telemetry(results: Path, recipe: str, seed: int, fresh: int, held: int | None) -> None:
    """dgrad.dy of one layer over 6 steps: ``fresh`` underflowed blocks of 1000 at refresh steps
    (0 and 3), ``held`` at the steps between (current scaling, ``held`` None: every step fresh)."""
    rows = [{"step": s, "layer": "layers.0.mixer.in_proj", "operand": "dgrad.dy",
             "steps_since_refresh": 0 if held is None else s % 3, "blocks": 1000, "saturated_blocks": 0,
             "underflow_blocks": fresh if held is None or s % 3 == 0 else held, "nonzero_elements": 100,
             "clipped_elements": 0} for s in range(6)]
    folder = run_dir(results, "tiny", recipe, seed)
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(folder / "telemetry.parquet")


def test_event_rates_by_operand_and_refresh_phase(tmp_path):
    from fp4repro.report import phase_section

    results = tmp_path / "results"
    _phase_telemetry(results, "nvfp4", 0, fresh=2, held=None)
    _phase_telemetry(results, "ue5m3", 0, fresh=1, held=4)
    _phase_telemetry(results, "ue5m3", 1, fresh=1, held=6)
    # ue5m3's seed 1 has no nvfp4 run to stand beside: the recipes are read on seed 0
    lines = phase_section(results / "tiny", {"bf16": (0,), "nvfp4": (0,), "ue5m3": (0, 1)})
    assert "(seed 0, the seeds every recipe here has; not read: ue5m3 seed 1)" in lines[3]
    underflow = lines[lines.index("**underflow**") + 2:]
    assert underflow[0] == "| operand | nvfp4 (current amax) | ue5m3 fresh | ue5m3 held |"
    assert "| dgrad.dy | 2.000e-03 | 1.000e-03 | 4.000e-03 |" in underflow[:8]
    assert "| fprop.x | – | – | – |" in underflow[:8]
    _phase_telemetry(results, "nvfp4", 1, fresh=2, held=None)
    both = phase_section(results / "tiny", {"bf16": (0,), "nvfp4": (0, 1), "ue5m3": (0, 1)})
    assert "(the mean over seeds 0, 1, the seeds every recipe here has)" in both[3]
    assert "| dgrad.dy | 2.000e-03 | 1.000e-03 | 5.000e-03 |" in both       # held: (4 + 6) / 2 per 1000
    apart = phase_section(results / "tiny", {"nvfp4": (1,), "ue5m3": (0,)})
    assert apart[-1] == "Not compared: these recipes share no seed (seeds: nvfp4 1; ue5m3 0)."
    assert phase_section(results / "tiny", {"bf16": (0,)}) == []


def test_target_section_reads_every_recipe_on_the_seeds_they_all_have(tmp_path):
    results = tmp_path / "results"
    write_target_run(results, "ue5m3", 0, loss=0.25)
    write_target_run(results, "ue5m3", 1, loss=0.75, scale={"gradients": 5.0})
    write_target_run(results, "ue5m3_t2048", 0, loss=0.5)
    lines = target_section(results / "tiny", {"ue5m3": (0, 1), "ue5m3_t2048": (0,)})
    assert "; seed 0, the seeds every recipe here has; not read: ue5m3 seed 1." in lines[3]
    cells = section_table(lines)["ue5m3"]
    seed0 = json.loads((eval_dir(results, "tiny", "ue5m3", 0) / "final_loss.json").read_text())["loss"]
    assert cells["final-window loss"] == f"{seed0:.4f}"               # seed 1 (0.5 higher) left out
    only_seed0 = target_section(results / "tiny", {"ue5m3": (0,), "ue5m3_t2048": (0,)})
    assert section_table(only_seed0)["ue5m3"] == cells
    apart = target_section(results / "tiny", {"ue5m3": (1,), "ue5m3_t2048": (0,)})
    assert apart[-1] == "Not compared: these recipes share no seed (seeds: ue5m3 1; ue5m3_t2048 0)."
