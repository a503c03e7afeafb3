"""Processes and megatron-core's parallel state for one run.

Launched by ``torchrun``, the process group comes from its environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``...); launched as the tasks of a Slurm job step (``srun``, one task per GPU), from
Slurm's (``slurm_environment``); started alone, it is a group of one. NCCL where there is a GPU,
gloo where there is none (megatron's modules can be built on a CPU, not run).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping

import torch
import torch.distributed as dist

from fp4repro.config.parallel import ParallelConfig, ParallelLayout, layout


def slurm_environment(env: Mapping[str, str]) -> dict[str, str]:
    """torch.distributed's variables for a task of a Slurm job step (srun) with several tasks,
    from Slurm's: RANK = SLURM_PROCID, WORLD_SIZE = SLURM_STEP_NUM_TASKS, LOCAL_RANK =
    SLURM_LOCALID, MASTER_ADDR = the step's first node (``scontrol show hostnames``), MASTER_PORT =
    20000 + (16 · job id + step id) mod 20000 (the same in every task of the step, distinct for
    steps and jobs sharing a node). Empty when torchrun has set them, and outside a step of more
    than one task (a batch script's own process is not one of its tasks)."""
    if "WORLD_SIZE" in env or int(env.get("SLURM_STEP_NUM_TASKS", "1")) <= 1 or "SLURM_PROCID" not in env:
        return {}
    nodes = env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]
    first = subprocess.run(
        ["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    port = 20000 + (16 * int(env["SLURM_JOB_ID"]) + int(env.get("SLURM_STEP_ID", "0"))) % 20000
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_STEP_NUM_TASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": first,
        "MASTER_PORT": str(port),
    }


def initialize(parallel: ParallelConfig, batch_size: int, seed: int) -> ParallelLayout:
    """Join (or make) the process group, split it as ``parallel`` says, seed megatron's
    model-parallel RNG; returns the layout (checked against the global batch ``batch_size``)."""
    from megatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():
        os.environ.update(slurm_environment(os.environ))
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "WORLD_SIZE" in os.environ:
            if torch.cuda.is_available():  # modulo: a task may see only its own GPU (srun --gpus-per-task)
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
            dist.init_process_group(backend)
        else:
            store = tempfile.mkdtemp(prefix="fp4repro_pg_")
            if torch.cuda.is_available():
                torch.cuda.set_device(0)
            dist.init_process_group(backend, init_method=f"file://{store}/rendezvous", rank=0, world_size=1)
    split = layout(parallel, dist.get_world_size(), batch_size)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=parallel.tensor, pipeline_model_parallel_size=parallel.pipeline
        )
    torch.manual_seed(seed)
    # without CUDA, megatron's RNG tracker cannot hold CUDA generator states: its inference
    # tracker draws every initialization from torch's CPU generator instead
    tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=not torch.cuda.is_available())
    return split


def shutdown() -> None:
    """Leave megatron's parallel state and the process group."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
