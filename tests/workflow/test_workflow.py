"""The Snakemake DAG: plans for every experiment, clear errors for broken configs, and the reduced
study (the packaged configs/experiment/smoke.yaml) run end to end through Snakemake in a temporary folder."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fp4repro.config.files import PACKAGED
from fp4repro.config.study import load_study
from fp4repro.errors import ConfigError
from fp4repro.train import train as run_training

REPO = Path(__file__).resolve().parents[2]
FIGURES = ["loss", "nll", "downstream", "telemetry", "target", "throughput"]
CHAIN = {
    "train": 1,
    "evaluate": 1,
    "figure_loss": 1,
    "figure_nll": 1,
    "figure_downstream": 1,
    "figure_telemetry": 1,
    "figure_target": 1,
    "report": 1,
    "all": 1,
}


@pytest.mark.parametrize("experiment, runs", [("tiny", 5), ("paper8b", 5 * 3), ("smoke", 4)])
def test_dry_run_plans_the_whole_study(tmp_path, experiment, runs, snakemake):
    """One training and one evaluation job per recipe and seed (paper8b: 5 recipes × 3 seeds)."""
    jobs = snakemake.planned_jobs(snakemake(tmp_path, "-n", "--config", f"experiment={experiment}"))
    assert jobs == {
        "prepare_data": 1,
        "train": runs,
        "evaluate": runs,
        "figure_loss": 1,
        "figure_nll": 1,
        "figure_downstream": 1,
        "figure_telemetry": 1,
        "figure_target": 1,
        "figure_throughput": 1,
        "report": 1,
        "all": 1,
    }


def test_paper8b_resources_reach_the_jobs(tmp_path, snakemake):
    proc = snakemake(tmp_path, "-n", "-p", "--config", "experiment=paper8b")
    # the authors' schedule, as the dry run plans and says it: one stage, 30,000 steps, no warmup
    assert (
        "paper8b: 1 stage (stage1), 30,000 steps of 768 x 8192 tokens; lr 0.0008 (WSD over 30,000 steps): no "
        "warmup, the peak to step 25,500, then a linear decay over the last 4,500 steps (15%) to 1% of the peak"
    ) in proc.stderr.splitlines()
    out = proc.stdout
    train = out[out.index("rule train:") :]
    resources = train[train.index("resources:") :].splitlines()[0]
    for expected in (
        "nodes=32",
        "tasks=256",
        "gres=gpu:8",
        "gpu_slots=8",
        "runtime=20160",
        "mem_mb=1800000",
        "mpi=srun",
    ):
        assert expected in resources
    # a local run's `--resources gpu_slots=G` counts each job's GPUs: the evaluation's one
    evaluate = out[out.index("rule evaluate:") :]
    assert "gpu_slots=1" in evaluate[evaluate.index("resources:") :].splitlines()[0]
    # the megatron backend: srun starts the allocation's tasks, torchrun one process per GPU elsewhere
    command = train[train.index("Shell command:") :].splitlines()[0]
    assert '[ -n "${SLURM_JOB_ID:-}" ] && echo "srun --kill-on-bad-exit=1"' in command
    assert 'echo "torchrun --standalone --nproc-per-node=8 --no-python" ) fp4repro train' in command


def test_a_cpu_experiments_jobs_count_no_gpu_slots(tmp_path, snakemake):
    out = snakemake(tmp_path, "-n", "-p").stdout
    train = out[out.index("rule train:") :]
    assert "gpu_slots" not in train[train.index("resources:") :].splitlines()[0]


def test_paper8b_training_stops_before_any_compute_without_gpus_or_with_pipeline_stages(tmp_path):
    # no data has been prepared: the refusals come before the data is looked for
    def train(experiment):
        return subprocess.run(
            [sys.executable, "-m", "fp4repro.cli", "train", "--experiment", str(experiment), "--recipe", "ue5m3"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    proc = train("paper8b")  # the authors' 8B (separate q/k/v): tensor parallelism trains, on GPUs
    assert proc.returncode == 1 and "backend megatron trains on CUDA GPUs" in proc.stderr, proc.stderr
    fused = tmp_path / "fused.yaml"  # NVIDIA's 8B
    fused.write_text((PACKAGED / "experiment/paper8b.yaml").read_text().replace("nemotron_h_8b_paper", "nemotron_h_8b"))
    staged = tmp_path / "paper8b.yaml"
    staged.write_text(fused.read_text().replace("pipeline: 1", "pipeline: 2"))
    with pytest.raises(
        ConfigError,
        match="field 'parallel.pipeline': value 2: training through megatron-core runs without pipeline parallelism",
    ):
        run_training(load_study(staged), "ue5m3", tmp_path / "data", tmp_path / "out", progress=False)


def test_broken_experiment_fails_the_dry_run_naming_file_and_field(tmp_path, snakemake):
    text, replaced = re.subn(r"batch_size: \d+", "batch_size: -3", (PACKAGED / "experiment/tiny.yaml").read_text())
    assert replaced == 1  # the file still has the field this test breaks
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    proc = snakemake(tmp_path, "-n", "--config", f"experiment={bad}", check=False)
    assert proc.returncode != 0
    assert f"{bad}: field 'train.batch_size': value -3" in proc.stdout + proc.stderr


def test_broken_recipe_fails_the_dry_run_naming_file_and_field(tmp_path, snakemake):
    recipe = tmp_path / "broken.yaml"
    recipe.write_text((PACKAGED / "recipes/ue5m3.yaml").read_text() + "\ndefaults: {scale: e9m9}\n")
    text = (PACKAGED / "experiment/tiny.yaml").read_text().replace("recipes: [bf16,", f"recipes: [{recipe},")
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


def _copy(workdir: Path, to: Path) -> Path:
    """A copy of a finished workflow folder (results, Snakemake's records), to change freely."""
    shutil.copytree(workdir, to, symlinks=True)
    return to


@pytest.mark.slow
def test_smoke_dag_produces_every_figure_and_the_report(smoke_run, snakemake):
    for name in FIGURES:
        png, pdf = smoke_run / f"figures/smoke/{name}.png", smoke_run / f"figures/smoke/{name}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-"
    report = (smoke_run / "paper/smoke/report.md").read_text()
    assert "from experiment `smoke`" in report
    assert "| final_loss | UE5M3 < NVFP4 | ue5m3 − nvfp4: -0.0384 (8B) | ue5m3 / nvfp4 |" in report
    for name in FIGURES:
        assert f"![{name}](../../figures/smoke/{name}.png)" in report
    for recipe in ("bf16", "nvfp4", "ue5m3", "ue5m3_t448"):
        done = json.loads((smoke_run / f"results/smoke/train/{recipe}/seed0/done.json").read_text())
        assert done["steps"] == 24 and len(done["checkpoints"]) == 3
        nll = pd.read_parquet(smoke_run / f"results/smoke/eval/{recipe}/seed0/nll.parquet")
        assert sorted(set(nll["step"])) == [8, 16, 24] and set(nll["policy"]) == {"bf16", "quantized"}
    assert snakemake.planned_jobs(snakemake(smoke_run, "-n", "--config", "experiment=smoke")) == {}
    # no two texts of a figure overprint: the figures are drawn again from the run's results
    # (the workflow drew them in subprocesses, out of the check's reach; a few seconds)
    overlap = _plots_helper("overlap")
    bench = [smoke_run / "results" / "bench"]  # none measured there: the folder, as the rule gives it
    figures = overlap.study_figures(smoke_run / "results" / "smoke", bench, load_study("smoke").model.name)
    assert sorted(figures) == sorted(FIGURES)
    failures = overlap.figures_overlapping(figures)
    assert not failures, "\n".join(failures)


def _plots_helper(name: str):
    """A helper module of tests/plots (not a package: imported from its file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "plots" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_one_figure_reruns_only_its_rule(smoke_run, snakemake, tmp_path):
    smoke_run = _copy(smoke_run, tmp_path / "work")  # the session's run stays whole for the other workers
    target = "figures/smoke/nll.png"
    forced = snakemake(smoke_run, target, "-n", "-f", "--config", "experiment=smoke")
    assert snakemake.planned_jobs(forced) == {"figure_nll": 1}  # redraw an existing figure
    before = {p: p.stat().st_mtime_ns for p in (smoke_run / "figures/smoke").iterdir()}
    (smoke_run / target).unlink()
    assert snakemake.planned_jobs(snakemake(smoke_run, target, "-n", "--config", "experiment=smoke")) == {
        "figure_nll": 1
    }
    snakemake(smoke_run, target, "--cores", "1", "--config", "experiment=smoke")
    after = {p: p.stat().st_mtime_ns for p in (smoke_run / "figures/smoke").iterdir()}
    changed = sorted(p.name for p in after if after[p] != before.get(p))
    assert changed == ["nll.pdf", "nll.png"]


@pytest.mark.slow
def test_editing_a_recipe_reruns_exactly_its_chain_and_a_touch_nothing(smoke_run, snakemake, tmp_path):
    # A recipe in the working directory's configs/ takes the place of the packaged one; it is
    # ue5m3's file and the base of ue5m3_t448, so both chains rerun, nothing else. Snakemake 9
    # reruns a job when an input's content differs from what its last run recorded: a bare
    # `touch` reruns nothing.
    work = _copy(smoke_run, tmp_path / "work")
    local = work / "configs" / "recipes" / "ue5m3.yaml"
    local.parent.mkdir(parents=True)
    local.write_text((PACKAGED / "recipes/ue5m3.yaml").read_text() + "\n# an edit\n")
    plan = snakemake(work, "-n", "--config", "experiment=smoke")
    assert snakemake.planned_jobs(plan) == {**CHAIN, "train": 2, "evaluate": 2}
    assert set(re.findall(r"wildcards: recipe=(\w+)", plan.stdout)) == {"ue5m3", "ue5m3_t448"}
    # the two trainings (their evaluations, figures and report would only repeat the mechanism)
    trained = [f"results/smoke/train/{recipe}/seed0/done.json" for recipe in ("ue5m3", "ue5m3_t448")]
    snakemake(work, "--cores", "2", *trained, "--config", "experiment=smoke")
    done = json.loads((work / trained[1]).read_text())
    # named without this machine's paths: packaged as in any install, the user's from the working directory
    assert done["recipe_files"] == ["fp4repro/configs/recipes/ue5m3_t448.yaml", "configs/recipes/ue5m3.yaml"]
    local.touch()
    assert snakemake.planned_jobs(snakemake(work, "-n", *trained, "--config", "experiment=smoke")) == {}
    local.write_text(local.read_text().replace("interval: 50", "interval: 5"))  # the numbers change
    assert snakemake.planned_jobs(snakemake(work, "-n", *trained, "--config", "experiment=smoke")) == {"train": 2}


@pytest.mark.slow
def test_an_added_recipe_joins_the_study_from_the_command_line(smoke_run, snakemake, tmp_path):
    work = _copy(smoke_run, tmp_path / "work")
    (work / "configs" / "recipes").mkdir(parents=True)
    (work / "configs" / "recipes" / "ue5m3_k5.yaml").write_text(
        "name: ue5m3_k5\nbase: ue5m3\ndescription: ue5m3 with its amaxes refreshed every 5 steps.\n"
        "defaults: {tensor_scaling: {kind: periodic, interval: 5}}\n"
        "sources: [{choice: tensor amax, kind: reading, source: 'a refresh every 5 steps: a choice of this test'}]\n"
    )
    plan = snakemake(work, "-n", "--config", "experiment=smoke", "add_recipes=[ue5m3_k5]")
    assert snakemake.planned_jobs(plan) == CHAIN
    assert set(re.findall(r"wildcards: recipe=(\w+)", plan.stdout)) == {"ue5m3_k5"}
    assert "--add-recipe ue5m3_k5" in plan.stdout
    proc = snakemake(work, "-n", "--config", "experiment=smoke", "add_recipes=[no_such]", check=False)
    assert proc.returncode != 0 and "--config add_recipes: added recipe: value 'no_such'" in proc.stdout + proc.stderr


def test_a_study_file_keeps_added_recipes_in_every_later_invocation(tmp_path, snakemake):
    # issue 42: --config add_recipes=[mine] lasted one invocation; a later plain `snakemake` planned the
    # figures and the report without it, and one figure needed experiment= and add_recipes= again
    (tmp_path / "configs" / "recipes").mkdir(parents=True)
    (tmp_path / "configs" / "recipes" / "mine.yaml").write_text("name: mine\nbase: bf16\n")
    study = tmp_path / "configs" / "study.yaml"
    study.write_text("add_recipes: [mine]\n")
    for target in ([], ["figures/tiny/nll.png"]):
        plan = snakemake(tmp_path, "-n", *target)
        assert snakemake.planned_jobs(plan)["train"] == 6 and "recipe=mine" in plan.stdout
    assert "--add-recipe mine" in snakemake(tmp_path, "-n", "-p", "paper/tiny/report.md").stdout
    assert snakemake.planned_jobs(snakemake(tmp_path, "-n", "--config", "add_recipes=[]"))["train"] == 5
    study.write_text("experiment: smoke\n")  # the study file chooses the experiment too
    assert snakemake.planned_jobs(snakemake(tmp_path, "-n"))["train"] == 4
    study.unlink()
    # a run of a recipe the study leaves out is said, with where to keep it
    done = tmp_path / "results" / "tiny" / "train" / "mine" / "seed0" / "done.json"
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    plan = snakemake(tmp_path, "-n")
    assert snakemake.planned_jobs(plan)["train"] == 5
    assert "warning: results/tiny/ holds runs of mine, which this study does not include" in plan.stderr
    assert "list them in configs/study.yaml (add_recipes: [mine])" in plan.stderr


def test_a_figure_of_another_experiment_says_which_config_to_add(tmp_path, snakemake):
    # issue 42: "No rule to produce figures/smoke/nll.png" gave no hint
    for target in ("figures/smoke/nll.png", "paper/smoke/report.md"):
        proc = snakemake(tmp_path, "-n", target, check=False)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and f"{target} belongs to experiment 'smoke'" in text
        assert f"run `snakemake --config experiment=smoke {target}`" in text
    assert snakemake.planned_jobs(snakemake(tmp_path, "-n", "figures/tiny/nll.png"))["figure_nll"] == 1


def test_a_binary_recipe_fails_the_dry_run_naming_the_file(tmp_path, snakemake):
    # issue 42: inside Snakemake a binary recipe was "UnicodeDecodeError in common.smk line 27"
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    proc = snakemake(tmp_path, "-n", "--config", f"add_recipes={binary}", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"{binary}: not a text file: byte 0x80 at offset 128 is not UTF-8" in text
    assert "UnicodeDecodeError" not in text


def test_data_sources_are_inputs_of_data_preparation(tmp_path, snakemake):
    (tmp_path / "corpus").mkdir()
    for i in range(3):
        (tmp_path / "corpus" / f"doc{i}.txt").write_text(f"document {i}: " + "some words of text " * 40 + "\n")
    exp = tmp_path / "texts.yaml"
    model = tmp_path / "tiny300.yaml"  # a vocabulary that three short documents can train
    model.write_text((PACKAGED / "models/tiny.yaml").read_text().replace("vocab_size: 2048", "vocab_size: 300"))
    exp.write_text(
        (PACKAGED / "experiment/smoke.yaml")
        .read_text()
        .replace("prose: {kind: stdlib_prose}", f"prose: {{kind: text, paths: ['{tmp_path}/corpus/*.txt']}}")
        .replace("code: {kind: stdlib_code}", f"code: {{kind: text, paths: ['{tmp_path}/corpus/doc0.txt']}}")
        .replace("vocab_size: 2048", "vocab_size: 300")
        .replace("model: tiny", f"model: {model}")
    )
    target = "results/smoke/data/manifest.json"
    snakemake(tmp_path, target, "--cores", "1", "--config", f"experiment={exp}")
    (tmp_path / "corpus" / "doc1.txt").touch()
    assert snakemake.planned_jobs(snakemake(tmp_path, target, "-n", "--config", f"experiment={exp}")) == {}
    (tmp_path / "corpus" / "doc1.txt").write_text("an edited document " * 30 + "\n")
    assert snakemake.planned_jobs(snakemake(tmp_path, target, "-n", "--config", f"experiment={exp}")) == {
        "prepare_data": 1
    }
    (tmp_path / "corpus" / "doc3.txt").write_text("a new document " * 30 + "\n")  # the glob matches one more
    plan = snakemake(tmp_path, target, "-n", "--config", f"experiment={exp}")
    assert snakemake.planned_jobs(plan) == {"prepare_data": 1} and "doc3.txt" in plan.stdout


@pytest.mark.slow
def test_snakemake_report_shows_figures_with_captions_and_the_claims(smoke_run, snakemake, tmp_path):
    out = tmp_path / "report.html"
    snakemake(smoke_run, "--report", str(out), "--config", "experiment=smoke")
    html = out.read_text()
    for caption in (
        "Training loss against tokens for each recipe",
        "Held-out negative log-likelihood",
        "Downstream aggregates (lm-eval groups",
        "Quantization events per recipe",
        "Model-body throughput",
        "The claims report: each claim of the paper",
    ):
        assert caption in html
    for name in FIGURES:
        assert f"{name}.png" in html
    assert "report.md" in html and '"rule": "train"' in html and "starttime" in html


def test_lint_finds_nothing_but_software_deployment(tmp_path, snakemake):
    proc = snakemake(tmp_path, "--lint", "--config", "experiment=smoke", check=False)
    text = proc.stdout + proc.stderr
    findings = set(re.findall(r"^    \* (.+?):?$", text, re.M))
    assert findings == {"Specify a conda environment or container for each rule."}, text[-3000:]


IMPORTED_TABLES = (
    "train/*/seed*/metrics.parquet",
    "train/*/seed*/telemetry.parquet",
    "eval/*/seed*/*.parquet",
    "eval/*/seed*/*.json",
)


@pytest.mark.slow
def test_imported_results_rebuild_figures_and_report_without_data_training_or_evaluation(
    smoke_run, snakemake, tmp_path
):
    # the tables of runs made elsewhere, in a fresh folder with no data, checkpoints or Snakemake records
    work = tmp_path / "imported"
    for pattern in IMPORTED_TABLES:
        for table in (smoke_run / "results/smoke").glob(pattern):
            target = work / "results/smoke" / table.relative_to(smoke_run / "results/smoke")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(table, target)
    local = work / "configs/experiment/smoke.yaml"
    local.parent.mkdir(parents=True)
    local.write_text((PACKAGED / "experiment/smoke.yaml").read_text() + "imported: true\n")
    plan = snakemake.planned_jobs(snakemake(work, "-n", "--config", "experiment=smoke"))
    assert plan == {
        "figure_loss": 1,
        "figure_nll": 1,
        "figure_downstream": 1,
        "figure_telemetry": 1,
        "figure_target": 1,
        "figure_throughput": 1,
        "report": 1,
        "all": 1,
    }
    snakemake(work, "--cores", "2", "--config", "experiment=smoke")
    for name in FIGURES:
        assert (work / f"figures/smoke/{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line for line in (work / "paper/smoke/report.md").read_text().splitlines() if line.startswith("| ")]
    original = [
        line for line in (smoke_run / "paper/smoke/report.md").read_text().splitlines() if line.startswith("| ")
    ]
    assert rows == original and len(rows) > 10
    assert not (work / "results/smoke/data").exists()
    # a missing table is named, not trained for
    (work / "results/smoke/eval/ue5m3/seed0/nll.parquet").unlink()
    (work / "paper/smoke/report.md").unlink()
    proc = snakemake(work, "-n", "--config", "experiment=smoke", check=False)
    assert proc.returncode != 0 and "results/smoke/eval/ue5m3/seed0/nll.parquet" in proc.stdout + proc.stderr


@pytest.mark.parametrize("study", ["small_v1", "small_v2", "small"])
def test_the_committed_small_study_plans_only_its_figures_and_report(snakemake, tmp_path, study):
    """results/small_v1/, small_v2/ and small/ hold runs made on GPUs: on a CPU the DAG draws from
    them and trains nothing, and the committed manifest lists exactly the runs whose tables are there."""
    from fp4repro.cli import main

    work = tmp_path / study
    shutil.copytree(REPO / "results" / study, work / "results" / study)
    shutil.copytree(REPO / "results/bench", work / "results/bench")
    plan = snakemake.planned_jobs(snakemake(work, "-n", "--config", f"experiment={study}"))
    assert plan == {
        "figure_loss": 1,
        "figure_nll": 1,
        "figure_downstream": 1,
        "figure_telemetry": 1,
        "figure_target": 1,
        "figure_throughput": 1,
        "report": 1,
        "all": 1,
    }
    assert (
        main(
            [
                "inventory",
                "--experiment",
                study,
                "--results",
                str(work / "results"),
                "--out",
                str(tmp_path / "runs.json"),
            ]
        )
        == 0
    )
    listed = json.loads((REPO / "results" / study / "runs.json").read_text())
    found = json.loads((tmp_path / "runs.json").read_text())
    assert [(r["recipe"], r["seed"], r["tokens"], r["corpus"]) for r in found["runs"]] == [
        (r["recipe"], r["seed"], r["tokens"], r["corpus"]) for r in listed["runs"]
    ]
    assert len(found["corpora"]) == 1 and found["runs"]
