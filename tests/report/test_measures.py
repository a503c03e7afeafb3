"""The measures of training and evaluation against synthetic runs with known answers: paired
tests per measure and number of seeds, verdicts, and what cannot be measured or paired."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic_runs import BLEND, DOCS, ITEMS, OVERRIDDEN_LAYER, claims_by_id, one_seed, rng, rows_of, write_run

from fp4repro.report import measure, runs_text
from fp4repro.report.claims import ClaimPolicies
from fp4repro.results import eval_dir, run_dir
from fp4repro.statistics import OPPOSITE, REPRODUCED, SUGGESTIVE, WITHIN_NOISE

# ------------------------------------------------------------------------------- final-window loss


def test_one_seed_loss_is_paired_by_step_and_at_most_suggestive(tmp_path):
    row = one_seed(tmp_path, "final_loss", loss=-0.1)
    k = row.comparison
    # the shared batch noise (sd 0.05) cancels in the per-step difference: only the recipes' own
    # noise (sd 0.002 each) is left, so the interval is tight around the offset
    assert k.difference == pytest.approx(-0.1, abs=0.005) and k.high < 0
    assert k.test.startswith("batch means: 10 steps") and k.units == 10
    assert k.high - k.low < 0.02
    assert row.verdict == SUGGESTIVE  # one seed: an outcome of training is capped


def test_recipes_with_fewer_seeds_are_paired_on_the_seeds_they_share(tmp_path):
    results = tmp_path / "results"
    for seed in (0, 1, 2):
        write_run(results, "nvfp4", seed)
    write_run(results, "ue5m3", 2, loss=-0.1)
    claim = claims_by_id()["final_loss"]
    runs = {"nvfp4": (0, 1, 2), "ue5m3": (2,)}
    (row,) = measure(claim, results / "tiny", runs, ClaimPolicies.same(claim), BLEND)
    assert row.comparison.difference == pytest.approx(-0.1, abs=0.005) and row.note.endswith("steps), 1 seed")
    # while the plan's pairs are not all there, a line says how many of them it rests on
    plan = {"nvfp4": tuple(range(8)), "ue5m3": tuple(range(8)), "bf16": (0,)}
    (row,) = measure(claim, results / "tiny", runs, ClaimPolicies.same(claim), BLEND, planned=plan)
    assert row.note.endswith(", 1 of 8 planned seeds")
    (apart,) = measure(claim, results / "tiny", {"nvfp4": (0, 1), "ue5m3": (2,)}, ClaimPolicies.same(claim), BLEND)
    assert (
        apart.comparison is None
        and apart.note == "not measured: ue5m3 (seeds [2]) and nvfp4 (seeds [0, 1]) share no seed"
    )
    assert runs_text({"nvfp4": (0, 1, 2), "ue5m3": (2,)}, {"nvfp4": (0, 1, 2), "ue5m3": (0, 1, 2)}) == (
        "seeds nvfp4 0, 1, 2; ue5m3 2 (4 of 6 planned runs; not there yet: ue5m3 seed 0, ue5m3 seed 1)"
    )


def test_while_the_plans_seeds_are_not_all_made_the_mde_is_projected_to_them(tmp_path):
    from fp4repro.report.numbers import mde_text

    results = tmp_path / "results"
    for seed in (0, 1, 2):
        write_run(results, "nvfp4", seed)
        write_run(results, "ue5m3", seed, loss=-0.1)
    claim = claims_by_id()["final_loss"]
    runs = {"nvfp4": (0, 1, 2), "ue5m3": (0, 1, 2)}
    plan = {"nvfp4": tuple(range(8)), "ue5m3": tuple(range(8))}
    (row,) = measure(claim, results / "tiny", runs, ClaimPolicies.same(claim), BLEND, planned=plan)
    k = row.comparison
    assert row.planned_seeds == 8 and k.mde_at(8) < k.mde
    assert k.mde_at(8) < k.mde_at(8, upper=True)
    assert mde_text(row) == f"{k.mde:.4f}; 8 seeds: ~{k.mde_at(8):.4f}, ≤ {k.mde_at(8, upper=True):.4f}"
    (done,) = measure(claim, results / "tiny", runs, ClaimPolicies.same(claim), BLEND, planned=runs)
    assert done.planned_seeds == 0 and mde_text(done) == f"{k.mde:.4f}"


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
    finals = {
        r: [json.loads((eval_dir(results, "tiny", r, s) / "final_loss.json").read_text())["loss"] for s in (0, 1, 2)]
        for r in ("ue5m3", "nvfp4")
    }
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
    final = {
        (r, s): json.loads((eval_dir(results, "tiny", r, s) / "final_loss.json").read_text())["loss"]
        for r in ("ue5m3", "nvfp4")
        for s in (0, 1)
    }
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


def test_nll_with_seeds_adds_the_documents_noise_to_the_seed_spread(tmp_path):
    """Two seeds whose blend differences agree (-0.02 on every document): the seed spread is 0
    and so is the documents' noise; noise on ue5m3's documents of seed 1 widens the interval
    through the bootstrap of the seed-averaged documents, not through the seeds."""
    results = tmp_path / "results"
    for seed in (0, 1):
        write_run(results, "nvfp4", seed)
        write_run(results, "ue5m3", seed, nll=-0.02)
    (row,) = rows_of("heldout_nll", results, seeds=(0, 1))
    assert row.comparison.stderr == pytest.approx(0.0, abs=1e-9)
    path = eval_dir(results, "tiny", "ue5m3", 1) / "nll_documents.parquet"
    docs = pd.read_parquet(path)
    noise = rng("doc noise").normal(0, 0.1, len(docs))
    docs["nll_sum"] += (noise - noise.mean()) * docs["predicted"]
    docs.to_parquet(path)
    (row,) = rows_of("heldout_nll", results, seeds=(0, 1))
    k = row.comparison
    assert k.test.startswith("paired t over 2 seeds, with the noise of the paired bootstrap over")
    # half the noise (averaged with a noiseless seed) over 120 documents, as in the one-seed case
    assert 0.003 < k.stderr < 0.0065


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


def test_downstream_with_seeds_adds_the_items_noise_to_the_seed_spread(tmp_path):
    results = tmp_path / "results"
    for seed, (b, a) in enumerate(((20, 30), (22, 30), (21, 29))):
        write_run(results, "nvfp4", seed, correct=b)
        write_run(results, "ue5m3", seed, correct=a)
    (row,) = rows_of("downstream", results, seeds=(0, 1, 2))
    k = row.comparison
    assert k.test == "paired t over 3 seeds, with the noise of the paired item-level t over 100 items in 2 task(s)"
    seeds = np.array([10, 8, 8]) / ITEMS
    assert k.difference == pytest.approx(seeds.mean())
    # the seed-averaged item differences, the same in both tasks: items 20 (1/3 of the seeds), 21
    # (2/3), 22..28 (all three) and 29 (2/3) differ
    d = np.zeros(ITEMS)
    d[20], d[21], d[22:29], d[29] = 1 / 3, 2 / 3, 1.0, 2 / 3
    items_se2 = 2 * 0.25 * d.var(ddof=1) / ITEMS
    assert k.stderr == pytest.approx(np.sqrt(seeds.var(ddof=1) / 3 + items_se2))
    assert k.units == 3 and row.verdict == REPRODUCED


def test_seeds_that_agree_exactly_keep_the_items_noise(tmp_path):
    # both seeds differ by the same 10 items: the seed spread is 0, the items' noise is not
    results = tmp_path / "results"
    for seed in (0, 1):
        write_run(results, "nvfp4", seed, correct=20)
        write_run(results, "ue5m3", seed, correct=30)
    (row,) = rows_of("downstream", results, seeds=(0, 1))
    var = 10 * 40 / (ITEMS * (ITEMS - 1))
    assert row.comparison.stderr == pytest.approx(np.sqrt(2 * 0.25 * var / ITEMS))
    assert row.comparison.low < row.comparison.difference - 0.05


# ---------------------------------------------------------------------------------------- telemetry


def test_telemetry_rates_are_paired_per_step_and_capped_with_one_seed(tmp_path):
    # the T claims compare ue5m3 (T = 2048 on its final fc2's wgrad dY) with ue5m3_t448, on wgrad dY
    results = tmp_path / "results"
    write_run(results, "ue5m3_t448", 0, underflow=0.004, clipped=0.001)
    write_run(results, "ue5m3", 0, underflow=0.001, clipped=0.002)
    rows = {c: rows_of(c, results)[0] for c in ("t2048_underflow", "t2048_saturation", "t2048_clipping")}
    under = rows["t2048_underflow"]
    tele = {r: pd.read_parquet(run_dir(results, "tiny", r, 0) / "telemetry.parquet") for r in ("ue5m3_t448", "ue5m3")}
    # only the layer ue5m3 quantizes at T = 2048, in both runs (the other layer's rates would dilute it)
    dy = {r: t[(t["operand"] == "wgrad.dy") & (t["layer"] == OVERRIDDEN_LAYER)] for r, t in tele.items()}
    assert under.recipe_value == pytest.approx(dy["ue5m3"]["underflow_blocks"].sum() / dy["ue5m3"]["blocks"].sum())
    assert under.baseline_value == pytest.approx(
        dy["ue5m3_t448"]["underflow_blocks"].sum() / dy["ue5m3_t448"]["blocks"].sum()
    )
    assert under.comparison.test.startswith("batch means: 40 steps")
    per_step = {
        r: t.groupby("step")["underflow_blocks"].sum() / t.groupby("step")["blocks"].sum() for r, t in dy.items()
    }
    assert under.comparison.difference == pytest.approx((per_step["ue5m3"] - per_step["ue5m3_t448"]).mean())
    # beyond the per-step noise, but the rates are outcomes of training too: one seed is capped
    assert under.comparison.verdict(under.claim.expect) == REPRODUCED and under.verdict == SUGGESTIVE
    clip = rows["t2048_clipping"]
    assert clip.recipe_value == pytest.approx(
        dy["ue5m3"]["clipped_elements"].sum() / dy["ue5m3"]["nonzero_elements"].sum()
    )
    assert clip.verdict == OPPOSITE
    # none seen is said of the steps the telemetry sampled (40 in each run), not of the whole run
    assert rows["t2048_saturation"].note.startswith(
        "not resolved: no saturation events at the telemetry steps sampled (40 and 40 step(s) of ue5m3 and ue5m3_t448;"
    )
    assert f"in the layer(s) ue5m3 quantizes at T = 2048 ({OVERRIDDEN_LAYER})" in under.note


def test_a_claim_at_a_target_no_layer_was_quantized_at_is_not_measured(tmp_path):
    results = tmp_path / "results"
    write_run(results, "ue5m3_t448", 0, underflow=0.004)
    write_run(results, "ue5m3", 0, underflow=0.001)
    path = run_dir(results, "tiny", "ue5m3", 0) / "telemetry.parquet"
    pd.read_parquet(path).assign(target=448.0).to_parquet(path)  # no override recorded
    (row,) = rows_of("t2048_underflow", results)
    assert row.note == "not measured: ue5m3's telemetry records no wgrad.dy quantized at T = 2048"


# ---------------------------------------------------------------- what is not measured or paired


def test_unmeasured_claims_say_why(tmp_path):
    results = tmp_path / "results"
    write_run(results, "nvfp4", 0)
    write_run(results, "ue5m3", 0)
    (absent,) = rows_of("t2048_underflow", results, recipes=("nvfp4", "ue5m3"))
    assert absent.note == "not measured: no run of ue5m3_t448 in this experiment"
    (missing,) = rows_of("final_loss", results, seeds=(0, 1))
    assert missing.note.startswith("not measured") and "seed1" in missing.note
    (throughput,) = rows_of("throughput_no_rht_no_bf16_tail", results, recipes=("nvfp4", "nvfp4_no_rht_no_bf16_tail"))
    assert throughput.verdict == "not measured" and "no body-throughput file" in throughput.note


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


# ------------------------------------------------------------------------- each side's own policy


def test_each_recipe_is_read_under_its_own_policy(tmp_path):
    """ue5m3 evaluated only under the cold replay, nvfp4 only under the current amax: the claim
    compares those two rows, as the authors do, and its line names both policies."""
    results = tmp_path / "results"
    write_run(results, "nvfp4", 0)
    write_run(results, "ue5m3", 0, nll=-0.05, policy="replay")
    claim = claims_by_id()["heldout_nll"]
    own = ClaimPolicies({"ue5m3": "replay", "nvfp4": "quantized"}, {})
    (row,) = measure(claim, results / "tiny", {"nvfp4": (0,), "ue5m3": (0,)}, own, BLEND)
    assert row.comparison.difference == pytest.approx(-0.05, abs=1e-9)
    assert "ue5m3 under replay, nvfp4 under quantized" in row.note
    (same,) = measure(claim, results / "tiny", {"nvfp4": (0,), "ue5m3": (0,)}, ClaimPolicies.same(claim), BLEND)
    assert same.comparison is None  # no ue5m3 rows under the claim's one policy


def _also_under(results: Path, recipe: str, seed: int, policy: str, shift: float) -> None:
    """Add rows under ``policy`` to every evaluation table of a synthetic run: a copy of its rows
    with the NLL raised by ``shift`` (per-document sums by 100 x ``shift``) and every item wrong."""
    for path in eval_dir(results, "tiny", recipe, seed).glob("*.parquet"):
        table = pd.read_parquet(path)
        extra = table.assign(policy=policy)
        for column, raised in (("nll", shift), ("nll_sum", shift * 100)):
            if column in extra:
                extra[column] += raised
        for column in ("acc", "correct"):
            if column in extra:
                extra[column] = 0
        pd.concat([table, extra], ignore_index=True).to_parquet(path)


@pytest.mark.parametrize("claim_id", ["heldout_nll", "downstream"])
def test_a_seed_evaluated_before_the_plan_named_the_own_policy_reads_every_seed_under_the_current_amax(
    tmp_path, claim_id
):
    """ue5m3 seed 0 has rows under its own replay, seed 1 (evaluated before the plan named it) only
    under the current amax: the claim reads both seeds of ue5m3 under the current amax, as it
    does nvfp4, and its line says which seed lacked the own policy; never a mix of policies."""
    results = tmp_path / "results"
    for seed in (0, 1):
        write_run(results, "nvfp4", seed)
        write_run(results, "ue5m3", seed, nll=-0.05, correct=30)
    _also_under(results, "ue5m3", 0, "replay", shift=0.3)
    claim = claims_by_id()[claim_id]
    own = ClaimPolicies({"ue5m3": "replay", "nvfp4": "quantized"}, {})
    rows = measure(claim, results / "tiny", {"nvfp4": (0, 1), "ue5m3": (0, 1)}, own, BLEND)
    table = "the held-out NLL table" if claim_id == "heldout_nll" else "the downstream results table"
    for row in rows:
        assert f"quantized policy (not evaluated under ue5m3's own, replay: not in {table} of seed(s) 1)" in row.note
        if claim_id == "heldout_nll":
            assert row.comparison.difference == pytest.approx(-0.05, abs=1e-9)
        else:
            assert row.comparison.difference > 0  # 30 of the items right against 25: no replay row read
