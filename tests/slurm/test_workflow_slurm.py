"""`snakemake --profile slurm` on the single-node test Slurm: the reduced study's jobs through sbatch
(data, then the training and evaluation of one recipe), equal to the local smoke run's.

The repository's cluster profile is installed with `make slurm-profile` into a temporary config
home, as a user would install it; the test cluster has no accounting, so the run adds the two
options the profile documents for such clusters (`--slurm-no-account`, `--slurm-status-command
squeue`), and polls every 2 s (see STEADY_POLLING). Each test checks Slurm's own records
(`scontrol show job`) of the jobs it submitted.
"""

import json
import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from fp4repro.config.files import PACKAGED

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# what a cluster without accounting needs (documented in the profile), and faster polling than a
# real cluster wants (the defaults wait 40 s before the first status check and 10 s between)
NO_ACCOUNTING = (
    "--slurm-no-account",
    "--slurm-status-command",
    "squeue",
    "--slurm-init-seconds-before-status-checks",
    "1",
    "--seconds-between-status-checks",
    "2",
)
# The plugin waits 10 s longer after each status check that finds no job ended (up to 3 minutes,
# with no option to change it): on this cluster that left every job's end unnoticed for up to 20 s,
# a third of the tests' time. Snakemake starts here with the plugin's wait between checks held at
# --seconds-between-status-checks; submission, status queries and everything else are the plugin's.
STEADY_POLLING = """
import asyncio
import snakemake_executor_plugin_slurm as plugin

async def sleep(self):
    await asyncio.sleep(self.workflow.remote_execution_settings.seconds_between_status_checks)

assert "sleep" not in vars(plugin.Executor)    # what is replaced is the remote executors' common wait
plugin.Executor.sleep = sleep
from snakemake.cli import main
main()
"""


@pytest.fixture(scope="module")
def slurm_snakemake(snakemake):
    """The `snakemake` fixture's runner, starting Snakemake with STEADY_POLLING."""
    return type(snakemake)("-c", STEADY_POLLING)


@pytest.fixture(scope="module")
def slurm_profile_env(slurm_cluster, tmp_path_factory):
    """The cluster's client environment with XDG_CONFIG_HOME holding the installed `slurm` profile."""
    home = tmp_path_factory.mktemp("xdg")
    env = {**slurm_cluster.env, "XDG_CONFIG_HOME": str(home)}
    subprocess.run(["make", "-s", "-C", str(REPO), "slurm-profile"], env=env, check=True, capture_output=True)
    assert (home / "snakemake" / "slurm" / "config.yaml").read_text() == (
        REPO / "workflow/profiles/slurm/config.yaml"
    ).read_text()
    return env


def rule_jobs(slurm_cluster, first_id: int) -> dict[str, list[dict]]:
    """Rule -> Slurm's records of the jobs submitted since ``first_id`` (the executor names each
    job's rule in its comment: rule_<name>_wildcards_...)."""
    jobs: dict[str, list[dict]] = {}
    for job in slurm_cluster.jobs():
        if int(job["JobId"]) >= first_id:
            rule = re.match(r"rule_(.+?)(_wildcards_.*)?$", job.get("Comment", "")).group(1)
            jobs.setdefault(rule, []).append(job)
    return jobs


def next_job_id(slurm_cluster) -> int:
    return max((int(j["JobId"]) for j in slurm_cluster.jobs()), default=0) + 1


# the jobs of one quantized recipe: every kind of rule that becomes a Slurm job (the figures and the
# report are local rules, run beside Snakemake as in the local smoke run); the cancelled training
# below is bf16's
RECIPES = ("ue5m3",)


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, slurm_profile_env, tmp_path_factory, slurm_snakemake):
    workdir = tmp_path_factory.mktemp("smoke-slurm")
    first = next_job_id(slurm_cluster)
    targets = [f"results/smoke/eval/{recipe}/seed0/final_loss.json" for recipe in RECIPES]
    proc = slurm_snakemake(
        workdir, *targets, "--profile", "slurm", *NO_ACCOUNTING, "--config", "experiment=smoke", env=slurm_profile_env
    )
    return workdir, rule_jobs(slurm_cluster, first), proc


def test_every_rule_ran_as_a_slurm_job_with_the_profiles_resources(slurm_run, slurm_cluster):
    _, jobs, _ = slurm_run
    # the light rules (figures, report) are local rules: they run beside Snakemake, not as jobs
    assert {rule: len(j) for rule, j in jobs.items()} == {"prepare_data": 1, "train": 1, "evaluate": 1}
    for job in (j for js in jobs.values() for j in js):
        assert job["JobState"] == "COMPLETED" and job["NodeList"] == slurm_cluster.node
    # resources: the experiment's (smoke.yaml)
    expected = {"prepare_data": (3000, "00:10:00"), "train": (2000, "00:10:00"), "evaluate": (2000, "00:10:00")}
    for rule, (mem_mb, limit) in expected.items():
        for job in jobs[rule]:
            got = (job["CPUs/Task"], slurm_cluster.memory_in_mb(job["MinMemoryNode"]), job["TimeLimit"])
            assert got == ("1", mem_mb, limit), (rule, job)


def test_cancelled_training_fails_and_the_rerun_resumes(
    slurm_run, slurm_cluster, slurm_profile_env, tmp_path, slurm_snakemake
):
    """scancel a training job mid-run: Snakemake reports it failed; the rerun continues from the
    newest resume checkpoint (not from step 0) and finishes every step."""
    workdir, _, _ = slurm_run
    text = (PACKAGED / "experiment/smoke.yaml").read_text()
    longer = text.replace("tokens: 4096", "tokens: 20480").replace("resume_every: 4", "resume_every: 5")
    exp = tmp_path / "smoke.yaml"  # same name: reuses the prepared data of the run above
    exp.write_text(longer)
    target = "results/smoke/train/bf16/seed0/done.json"
    run_dir = tmp_path / "run"
    (run_dir / "results/smoke").mkdir(parents=True)
    (run_dir / "results/smoke/data").symlink_to(workdir / "results/smoke/data")
    args = (target, "--profile", "slurm", *NO_ACCOUNTING, "--config", f"experiment={exp}")

    first = next_job_id(slurm_cluster)
    proc = subprocess.Popen(
        slurm_snakemake.command(run_dir, *args),
        env={**slurm_profile_env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_folder = run_dir / "results/smoke/train/bf16/seed0"
    try:
        deadline = time.monotonic() + 180
        while not any(run_folder.glob("runs/*/resume/resume_*.pt.sha256")):
            assert proc.poll() is None and time.monotonic() < deadline, "no resume checkpoint appeared"
            time.sleep(0.2)
        (train_job,) = rule_jobs(slurm_cluster, first)["train"]
        slurm_cluster.scancel(int(train_job["JobId"]))
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode != 0 and "CANCELLED" in out, out[-3000:]
    assert slurm_cluster.show_job(int(train_job["JobId"]))["JobState"] == "CANCELLED"
    assert not (run_dir / target).exists()

    slurm_snakemake(run_dir, *args, env=slurm_profile_env)
    log = (run_dir / "logs/smoke/train/bf16/seed0.log").read_text()
    resumed = int(re.search(r"resuming from step (\d+) of 88", log).group(1))
    assert resumed >= 5 and resumed % 5 == 0
    metrics = pd.read_parquet(run_dir / "results/smoke/train/bf16/seed0/metrics.parquet")
    assert metrics["step"].tolist() == list(range(1, 89))
    assert (metrics["attempt"] == (metrics["step"] > resumed).astype(int)).all()  # only the rest ran again


def test_slurm_outputs_equal_the_local_run(slurm_run, smoke_run):
    # last in the module: the local run is shared with tests/workflow, and a worker that needs it
    # while another worker makes it waits idle
    workdir, _, _ = slurm_run
    for recipe in RECIPES:
        for table, drop in (
            ("train/{}/seed0/metrics.parquet", ["tokens_per_s"]),
            ("train/{}/seed0/telemetry.parquet", []),
            ("eval/{}/seed0/nll.parquet", []),
            ("eval/{}/seed0/nll_documents.parquet", []),
            ("eval/{}/seed0/downstream.parquet", []),
        ):
            rel = Path("results/smoke") / table.format(recipe)
            a = pd.read_parquet(workdir / rel).drop(columns=drop)
            b = pd.read_parquet(smoke_run / rel).drop(columns=drop)
            pd.testing.assert_frame_equal(a, b, check_exact=True, obj=str(rel))
        rel = Path(f"results/smoke/eval/{recipe}/seed0/final_loss.json")
        a, b = (json.loads((root / rel).read_text()) for root in (workdir, smoke_run))
        assert a.pop("provenance")["created"] and b.pop("provenance")  # when and where differ
        assert a == b
