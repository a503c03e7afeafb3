"""Processes of a Slurm job step (srun, one task per GPU) form megatron's process group from
Slurm's environment, as torchrun's would."""

import sys

import pytest

from fp4repro.megatron.distributed import slurm_environment

pytestmark = pytest.mark.slurm

TASK = """
from fp4repro.config.parallel import ParallelConfig
from fp4repro.megatron.distributed import initialize
import torch.distributed as dist
split = initialize(ParallelConfig(), batch_size=4, seed=0)
t = __import__("torch").tensor([dist.get_rank() + 1])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: data {split.data}, sum {int(t)}", flush=True)
"""


def test_slurm_variables_become_torch_distributed_ones(slurm_cluster):
    env = {
        "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_ID": "12345",
        "SLURM_STEP_ID": "3",
        "SLURM_JOB_NODELIST": slurm_cluster.node,
        "PATH": slurm_cluster.env["PATH"],
    }
    assert slurm_environment(env) == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": slurm_cluster.node,
        "MASTER_PORT": str(20000 + (16 * 12345 + 3) % 20000),
    }
    assert slurm_environment({**env, "WORLD_SIZE": "2"}) == {}  # torchrun's win
    assert slurm_environment({**env, "SLURM_STEP_NUM_TASKS": "1"}) == {}  # one task: a group of one
    batch_script = {k: v for k, v in env.items() if k != "SLURM_STEP_NUM_TASKS"} | {"SLURM_NTASKS": "2"}
    assert slurm_environment(batch_script) == {}  # not a task of a step


def test_the_tasks_of_an_srun_step_form_one_process_group(slurm_cluster, tmp_path):
    script = tmp_path / "task.py"
    script.write_text(TASK)
    out = tmp_path / "job.out"
    job = slurm_cluster.sbatch(
        "--job-name=fp4-launch",
        "--ntasks=2",
        "--cpus-per-task=1",
        "--mem=4G",
        "--time=5",
        f"--output={out}",
        "--wrap",
        f"srun {sys.executable} {script}",
        cwd=tmp_path,
    )
    assert slurm_cluster.wait_for_end(job, timeout=240) == "COMPLETED", out.read_text()
    lines = sorted(line for line in out.read_text().splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 of 2: data 2, sum 3", "rank 1 of 2: data 2, sum 3"], out.read_text()
