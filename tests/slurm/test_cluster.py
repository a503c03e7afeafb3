"""The single-node test Slurm itself: batch jobs with resources, and scancel.

Each test checks Slurm's own records of its job: the job-completion log (jobcomp/filetxt) and
`scontrol show job`.
"""

import os
import time

import pytest

pytestmark = pytest.mark.slurm


def test_node_is_idle_with_the_machines_cpus_and_memory(slurm_cluster):
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %P %T %c %m %l").stdout.split()
    node, partition, state, cpus, memory, time_limit = out
    assert (node, partition, state) == (slurm_cluster.node, slurm_cluster.partition + "*", "idle")
    assert int(cpus) == slurm_cluster.cpus == len(os.sched_getaffinity(0))
    assert int(memory) == slurm_cluster.memory_mb >= 4096
    assert time_limit == "infinite"


def test_batch_job_runs_with_the_requested_cpus_memory_and_time(slurm_cluster, tmp_path):
    cpus = min(2, slurm_cluster.cpus)
    script = tmp_path / "job.sh"
    # A job step too (srun), as Snakemake's slurm executor runs each rule in one.
    script.write_text(
        "#!/bin/bash\n"
        "set -eu\n"
        "echo cpus=$SLURM_CPUS_PER_TASK mem=$SLURM_MEM_PER_NODE\n"
        "srun --ntasks=1 bash -c 'echo step on $SLURMD_NODENAME'\n"
    )
    out = tmp_path / "job.out"
    job = slurm_cluster.sbatch(
        "--job-name=fp4-resources", f"--cpus-per-task={cpus}", "--mem=3G", "--time=7",
        f"--output={out}", str(script), cwd=tmp_path,
    )  # fmt: skip
    assert slurm_cluster.wait_for_end(job, timeout=60) == "COMPLETED", out.read_text()
    assert out.read_text().splitlines()[:2] == [
        f"cpus={cpus} mem=3072",
        f"step on {slurm_cluster.node}",
    ], out.read_text()

    record = slurm_cluster.jobcomp_record(job)
    assert record["JobState"] == "COMPLETED"
    assert record["Name"] == "fp4-resources"
    assert record["Partition"] == slurm_cluster.partition
    assert record["NodeList"] == slurm_cluster.node
    assert record["TimeLimit"] == "7"  # minutes
    assert int(record["ProcCnt"]) == cpus
    assert record["ExitCode"] == "0:0"
    tres = slurm_cluster.parse_tres(record["Tres"])
    assert int(tres["cpu"]) == cpus
    assert slurm_cluster.memory_in_mb(tres["mem"]) == 3072

    info = slurm_cluster.show_job(job)
    assert info["JobState"] == "COMPLETED"
    assert info["CPUs/Task"] == str(cpus)
    assert slurm_cluster.memory_in_mb(info["MinMemoryNode"]) == 3072
    assert info["TimeLimit"] == "00:07:00"


def _sleeper(slurm_cluster, tmp_path, name, *args):
    """Submits a job that records the pid of its `sleep 600` and waits until that runs."""
    pid_file = tmp_path / f"{name}.pid"
    job = slurm_cluster.sbatch(
        f"--job-name={name}", "--cpus-per-task=1", "--mem=100M", *args,
        f"--output={tmp_path / (name + '.out')}",
        "--wrap", f"sleep 600 & echo $! > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; wait",
        cwd=tmp_path,
    )  # fmt: skip
    assert slurm_cluster.wait_for_state(job, "RUNNING", timeout=30) == "RUNNING"
    deadline = time.monotonic() + 15
    while not pid_file.exists():
        assert time.monotonic() < deadline, f"job {job} never started its sleep"
        time.sleep(0.2)
    return job, int(pid_file.read_text())


def _assert_gone(pid, timeout=15):
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline, f"process {pid} of an ended job still runs"
        time.sleep(0.2)


def test_scancel_ends_a_running_job_as_cancelled(slurm_cluster, tmp_path):
    job, pid = _sleeper(slurm_cluster, tmp_path, "fp4-scancel", "--time=5")
    slurm_cluster.scancel(job)
    assert slurm_cluster.wait_for_end(job, timeout=30) == "CANCELLED"
    _assert_gone(pid)  # proctrack/linuxproc killed the job's processes

    record = slurm_cluster.jobcomp_record(job)
    assert record["JobState"] == "CANCELLED"
    assert record["NodeList"] == slurm_cluster.node  # it had started
    assert record["TimeLimit"] == "5"
