"""fp4repro inventory: what an experiment's results folder holds, read from its tables."""

import datetime
import json

import pandas as pd
import pytest

from fp4repro.cli import main
from fp4repro.config.experiment import GpuBudget
from fp4repro.results import eval_dir, run_dir, write_table


def _metrics(results, recipe, seed, steps, data="d1", device="NVIDIA H200"):
    table = pd.DataFrame(
        {
            "step": range(1, steps + 1),
            "tokens": [s * 1024 for s in range(1, steps + 1)],
            "stage": "stage1",
            "loss": 3.0,
            "lr": 1e-3,
            "grad_norm": 1.0,
            "tokens_per_s": 1024.0,
            "attempt": 0,
        }
    )
    write_table(
        run_dir(results, "tiny", recipe, seed) / "metrics.parquet",
        table,
        {"data": data, "device": device, "git_commit": "abc", "git_dirty": False},
    )


def test_the_inventory_lists_runs_their_state_and_the_missing_ones(tmp_path, capsys):
    results = tmp_path / "results"
    total = 150  # tiny: 153,600 tokens of 8 x 128
    _metrics(results, "bf16", 0, total)
    _metrics(results, "ue5m3", 0, 40, data="d2")  # stopped early (a divergence keeps its steps)
    folder = eval_dir(results, "tiny", "bf16", 0)
    folder.mkdir(parents=True)
    (folder / "final_loss.json").write_text(json.dumps({"loss": 2.5}))
    assert main(["inventory", "--experiment", "tiny", "--results", str(results)]) == 0
    found = json.loads((results / "tiny/runs.json").read_text())
    runs = {r["recipe"]: r for r in found["runs"]}
    assert runs["bf16"] == {
        "recipe": "bf16",
        "seed": 0,
        "steps": total,
        "tokens": total * 1024,
        "finished": True,
        "corpus": "d1",
        "numerics": "v1 (before numerics fingerprints were recorded)",  # a table that records none
        "run_numerics": None,
        "deterministic": None,  # no done.json
        "device": "NVIDIA H200",
        "commit": "abc",
        "dirty": False,
        "train_seconds": float(total),
        "seconds": {"train": None, "evaluate": None},  # neither process recorded its time
        "gpu_minutes": None,
        "evaluation": ["final_loss.json"],
        "final_loss": 2.5,
    }
    assert runs["ue5m3"]["finished"] is False and runs["ue5m3"]["tokens"] == 40 * 1024
    assert {(m["recipe"], m["seed"]) for m in found["missing"]} == {("nvfp4", 0), ("ue5m3_t448", 0), ("mxfp4", 0)}
    assert found["corpora"] == ["d1", "d2"]
    out = capsys.readouterr().out
    assert "nvfp4" in out and "missing" in out and "corpora: d1, d2" in out


def _timed(results, recipe, seed, train_wall, eval_wall, gpu=None, trained_from=None, evaluated_from=None):
    """A run whose training and evaluation processes recorded their seconds (and, given ``gpu``,
    the GPU's UUID and when each process started, ISO times: its provenance is stamped once it
    has set up, as a process stamps it)."""

    def origin(started, setup):
        if not gpu:
            return {}
        stamped = datetime.datetime.fromisoformat(started) + datetime.timedelta(seconds=setup)
        return {"device_uuid": gpu, "created": stamped.isoformat()}

    (run_dir(results, "tiny", recipe, seed) / "done.json").write_text(
        json.dumps(
            {
                "deterministic": True,
                "process_seconds": {"setup": 5.0, "steps": train_wall - 5, "wall": train_wall},
                "provenance": origin(trained_from, 5.0),
            }
        )
    )
    folder = eval_dir(results, "tiny", recipe, seed)
    folder.mkdir(parents=True)
    (folder / "seconds.json").write_text(
        json.dumps(
            {
                "evaluated": 1,
                "setup": 2.0,
                "nll": eval_wall - 2,
                "wall": eval_wall,
                "provenance": origin(evaluated_from, 2.0),
            }
        )
    )


def test_the_inventory_sums_gpu_minutes_of_the_runs_that_recorded_them_beside_the_budget(tmp_path):
    from fp4repro.config.experiment import GpuBudget
    from fp4repro.inventory import gpu_minutes_line, inventory

    results = tmp_path / "results"
    for recipe, train_wall, eval_wall in (("bf16", 240.0, 60.0), ("ue5m3", 300.0, 60.0)):
        _metrics(results, recipe, 0, 150)
        _timed(results, recipe, 0, train_wall, eval_wall)
    _metrics(results, "nvfp4", 0, 150)  # no recorded seconds: no GPU minutes
    _metrics(results, "mxfp4", 0, 150, device="cpu (2 threads)")
    _timed(results, "mxfp4", 0, 100.0, 20.0)  # a CPU run: no GPU minutes
    found = inventory(results, "tiny", {r: (0,) for r in ("bf16", "ue5m3", "nvfp4", "mxfp4")}, 150, 1024)
    runs = {r["recipe"]: r for r in found["runs"]}
    assert runs["bf16"]["gpu_minutes"] == 5.0 and runs["ue5m3"]["gpu_minutes"] == 6.0
    assert runs["nvfp4"]["gpu_minutes"] is None and runs["mxfp4"]["gpu_minutes"] is None
    assert runs["ue5m3"]["seconds"] == {
        "train": {"setup": 5.0, "steps": 295.0, "wall": 300.0},
        "evaluate": {"evaluated": 1, "setup": 2.0, "nll": 58.0, "wall": 60.0},
    }
    assert gpu_minutes_line(found, GpuBudget(5, 85)) == (
        "GPU minutes: 11.0 over 2 run(s) that recorded them, median 5.5 per run (budget: 5 per run, 85 for the study)"
    )
    assert gpu_minutes_line({"runs": [runs["nvfp4"]]}) is None


@pytest.mark.parametrize(
    "made, missing, says",
    [
        # 5 planned: the median is the 3rd; with none of the 2 missing within, it is over 5
        ([4.0, 5.0, 7.0], 2, "comes within it only if at least 1 of the 2 missing runs take at most 5 min each"),
        # 3 of 5 within: the 3rd smallest is within even if the missing take forever
        ([1.0, 2.0, 3.0], 2, "is within it whatever the 2 missing ones take"),
        # 4 planned, 2 within: both middle runs count, so long missing runs can take it over
        ([1.0, 2.0], 2, "depends on how long the 2 missing runs take"),
        # 6 planned: even with the 2 missing at no time the median is (6 + 7) / 2
        ([6.0, 7.0, 8.0, 9.0], 2, "cannot come within it: with the 2 missing runs taking no time it would be 6.5"),
        # 4 planned: (1 + 9.5) / 2 at best
        ([1.0, 9.5, 9.5], 1, "cannot come within it: with the 1 missing runs taking no time it would be 5.2"),
        # a made run without recorded minutes counts as taking no time at best, forever at worst
        ([None, 7.0, 8.0], 2, "only if at least 2 of the 2 missing runs"),
    ],
)
def test_the_minutes_line_says_what_the_planned_median_needs_of_the_missing_runs(made, missing, says):
    from fp4repro.inventory import gpu_minutes_line

    found = {"runs": [{"gpu_minutes": m} for m in made], "missing": [{}] * missing}
    line = gpu_minutes_line(found, GpuBudget(5, 100))
    assert says in line and line.startswith("GPU minutes: ")


def test_an_imported_study_reads_the_runs_that_are_there_and_a_run_study_plans_them_all(tmp_path):
    from dataclasses import replace

    from fp4repro.config.study import load_study
    from fp4repro.results import study_runs

    results = tmp_path / "results"
    study = load_study("tiny")
    for recipe in ("ue5m3", "bf16", "nvfp4"):
        _metrics(results, recipe, 0, 10)
    for recipe in ("ue5m3", "bf16"):  # nvfp4: trained, not evaluated yet
        eval_dir(results, "tiny", recipe, 0).mkdir(parents=True)
        (eval_dir(results, "tiny", recipe, 0) / "final_loss.json").write_text("{}")
    assert study_runs(study, results) == dict.fromkeys(study.recipes, (0,))
    imported = replace(study, experiment=replace(study.experiment, imported=True))
    assert study_runs(imported, results) == {"bf16": (0,), "ue5m3": (0,)}


def test_runs_on_one_gpu_at_once_share_its_minutes(tmp_path):
    from fp4repro.inventory import inventory

    results = tmp_path / "results"
    for recipe in ("bf16", "ue5m3", "nvfp4"):
        _metrics(results, recipe, 0, 150)
    # bf16 and ue5m3 train on GPU "a" at once (10:00-10:06); ue5m3's evaluation then has it alone
    # for 60 s, bf16's after it another 60 s. nvfp4 trains on GPU "b" at the same time, alone.
    _timed(results, "bf16", 0, 360.0, 60.0, "a", "2026-01-01T10:00:00+00:00", "2026-01-01T10:07:00+00:00")
    _timed(results, "ue5m3", 0, 360.0, 60.0, "a", "2026-01-01T10:00:00+00:00", "2026-01-01T10:06:00+00:00")
    _timed(results, "nvfp4", 0, 360.0, 60.0, "b", "2026-01-01T10:00:00+00:00", "2026-01-01T10:06:00+00:00")
    found = inventory(results, "tiny", {r: (0,) for r in ("bf16", "ue5m3", "nvfp4")}, 150, 1024)
    minutes = {r["recipe"]: r["gpu_minutes"] for r in found["runs"]}
    assert minutes == {"bf16": 3 + 1, "ue5m3": 3 + 1, "nvfp4": 6 + 1}


def test_an_overlap_is_shared_only_for_the_seconds_it_lasts(tmp_path):
    from fp4repro.inventory import GpuProcess, shared_seconds

    first, second = GpuProcess("a", 0.0, 100.0), GpuProcess("a", 40.0, 160.0)
    others = [first, second, GpuProcess(None, 0.0, 200.0), GpuProcess("c", 0.0, 200.0)]
    assert shared_seconds(first, others) == 40 + 60 / 2
    assert shared_seconds(second, others) == 60 / 2 + 60
    assert shared_seconds(GpuProcess(None, 10.0, 35.5), others) == 25.5  # no GPU named: its wall time


def test_the_committed_small_runs_occupy_their_gpus_as_they_were_run():
    """The committed ``small_v2`` runs ran one after another on each GPU, except nvfp4 seed 0 and
    ue5m3 seed 1, which ran at once (results/small_v2/README.md): the spans read from their
    provenance and seconds must overlap exactly there."""
    from pathlib import Path

    from fp4repro.inventory import run_entry

    results = Path(__file__).resolve().parents[1] / "results"
    spans = []
    for folder in sorted((results / "small_v2" / "train").glob("*/seed*")):
        recipe, seed = folder.parent.name, int(folder.name.removeprefix("seed"))
        _, processes = run_entry(results, "small_v2", recipe, seed, 1500, 16384)
        spans += [(recipe, seed, p) for p in processes or () if p.gpu]
    assert len(spans) >= 12
    overlapping = {
        frozenset({(a, s), (b, t)})
        for i, (a, s, p) in enumerate(spans)
        for b, t, q in spans[i + 1 :]
        if p.gpu == q.gpu and min(p.end, q.end) - max(p.start, q.start) > 1.0
    }
    assert overlapping == {frozenset({("nvfp4", 0), ("ue5m3", 1)})}
