"""The Snakemake DAG: plans for every experiment, clear errors for broken configs, and the reduced
study (configs/experiment/smoke.yaml) run end to end through Snakemake in a temporary folder."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
FIGURES = ["loss", "nll", "downstream", "telemetry"]


@pytest.mark.parametrize("experiment, recipes", [("tiny", 5), ("paper8b", 5), ("smoke", 4)])
def test_dry_run_plans_the_whole_study(tmp_path, experiment, recipes, snakemake):
    jobs = snakemake.planned_jobs(snakemake(tmp_path, "-n", "--config", f"experiment={experiment}"))
    assert jobs == {"prepare_data": 1, "train": recipes, "evaluate": recipes, "figure_loss": 1, "figure_nll": 1,
                    "figure_downstream": 1, "figure_telemetry": 1, "report": 1, "all": 1}


def test_paper8b_resources_reach_the_jobs(tmp_path, snakemake):
    out = snakemake(tmp_path, "-n", "--config", "experiment=paper8b").stdout
    train = out[out.index("rule train:"):]
    resources = train[train.index("resources:"):].splitlines()[0]
    for expected in ("nodes=32", "tasks=256", "gres=gpu:8", "runtime=20160", "mem_mb=1800000"):
        assert expected in resources


def test_paper8b_training_says_the_backend_is_missing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fp4repro.cli", "train", "--experiment", "paper8b",
                           "--recipe", "ue5m3"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 3 and "backend 'megatron'" in proc.stdout + proc.stderr and "not available" in proc.stdout + proc.stderr


def test_broken_experiment_fails_the_dry_run_naming_file_and_field(tmp_path, snakemake):
    text = (REPO / "configs/experiment/tiny.yaml").read_text().replace("batch_size: 16", "batch_size: -3")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    proc = snakemake(tmp_path, "-n", "--config", f"experiment={bad}", check=False)
    assert proc.returncode != 0
    assert f"{bad}: field 'train.batch_size': value -3" in proc.stdout + proc.stderr


def test_broken_recipe_fails_the_dry_run_naming_file_and_field(tmp_path, snakemake):
    recipe = tmp_path / "broken.yaml"
    recipe.write_text((REPO / "configs/recipes/ue5m3.yaml").read_text() + "\ndefaults: {scale: e9m9}\n")
    text = (REPO / "configs/experiment/tiny.yaml").read_text().replace("recipes: [bf16,", f"recipes: [{recipe},")
    exp = tmp_path / "exp.yaml"
    exp.write_text(text)
    proc = snakemake(tmp_path, "-n", "--config", f"experiment={exp}", check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "field 'recipes.0'" in out and str(recipe) in out and "scale" in out


def test_unknown_workflow_option_fails_the_dry_run(tmp_path, snakemake):
    proc = snakemake(tmp_path, "-n", "--config", "experimnt=tiny", check=False)
    assert proc.returncode != 0 and "'experimnt' was unexpected" in proc.stdout + proc.stderr


# ------------------------------------------------------------------------ the reduced study, run

@pytest.mark.slow
def test_smoke_dag_produces_every_figure_and_the_report(smoke_run, snakemake):
    for name in FIGURES:
        png, pdf = smoke_run / f"figures/smoke/{name}.png", smoke_run / f"figures/smoke/{name}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-"
    report = (smoke_run / "paper/report.md").read_text()
    assert "from experiment `smoke`" in report and "| final_loss | UE5M3 < NVFP4 | ue5m3 | nvfp4 |" in report
    for name in FIGURES:
        assert f"![{name}](../figures/smoke/{name}.png)" in report
    for recipe in ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048"):
        done = json.loads((smoke_run / f"results/smoke/train/{recipe}/done.json").read_text())
        assert done["steps"] == 24 and len(done["checkpoints"]) == 3
        nll = pd.read_parquet(smoke_run / f"results/smoke/eval/{recipe}/nll.parquet")
        assert sorted(set(nll["step"])) == [8, 16, 24] and set(nll["policy"]) == {"bf16", "quantized"}
    assert snakemake.planned_jobs(snakemake(smoke_run, "-n", "--config", "experiment=smoke")) == {}


@pytest.mark.slow
def test_one_figure_reruns_only_its_rule(smoke_run, snakemake):
    target = "figures/smoke/nll.png"
    forced = snakemake(smoke_run, target, "-n", "-f", "--config", "experiment=smoke")
    assert snakemake.planned_jobs(forced) == {"figure_nll": 1}          # redraw an existing figure
    before = {p: p.stat().st_mtime_ns for p in (smoke_run / "figures/smoke").iterdir()}
    (smoke_run / target).unlink()
    assert snakemake.planned_jobs(snakemake(smoke_run, target, "-n", "--config", "experiment=smoke")) == {"figure_nll": 1}
    snakemake(smoke_run, target, "--cores", "1", "--config", "experiment=smoke")
    after = {p: p.stat().st_mtime_ns for p in (smoke_run / "figures/smoke").iterdir()}
    changed = sorted(p.name for p in after if after[p] != before.get(p))
    assert changed == ["nll.pdf", "nll.png"]


@pytest.mark.slow
def test_editing_one_recipe_reruns_only_what_depends_on_it(smoke_run, snakemake):
    # Snakemake 9 reruns a job when an input is newer *and* its content differs from what the last
    # run recorded: a bare `touch` reruns nothing, an edit reruns that recipe's chain only.
    recipe = REPO / "configs/recipes/ue5m3_t2048.yaml"
    text = recipe.read_text()
    try:
        recipe.write_text(text + "\n# an edit\n")
        plan = snakemake(smoke_run, "-n", "--config", "experiment=smoke")
    finally:
        recipe.write_text(text)
    assert snakemake.planned_jobs(plan) == {"train": 1, "evaluate": 1, "figure_loss": 1, "figure_nll": 1,
                                  "figure_downstream": 1, "figure_telemetry": 1, "report": 1, "all": 1}
    assert set(re.findall(r"wildcards: recipe=(\w+)", plan.stdout)) == {"ue5m3_t2048"}
    assert snakemake.planned_jobs(snakemake(smoke_run, "-n", "--config", "experiment=smoke")) == {}
