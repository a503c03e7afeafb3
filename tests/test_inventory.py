"""fp4repro inventory: what an experiment's results folder holds, read from its tables."""

import json

import pandas as pd

from fp4repro.cli import main
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
        "evaluation": ["final_loss.json"],
        "final_loss": 2.5,
    }
    assert runs["ue5m3"]["finished"] is False and runs["ue5m3"]["tokens"] == 40 * 1024
    assert {(m["recipe"], m["seed"]) for m in found["missing"]} == {("nvfp4", 0), ("ue5m3_t448", 0), ("mxfp4", 0)}
    assert found["corpora"] == ["d1", "d2"]
    out = capsys.readouterr().out
    assert "nvfp4" in out and "missing" in out and "corpora: d1, d2" in out


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
