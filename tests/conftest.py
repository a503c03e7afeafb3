import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Without CUDA, Triton kernels run in Triton's interpreter. The variable must be set before
# anything imports triton (megatron-core does, and the kernels read it when they are defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _outside_the_checkout(tmp_path, monkeypatch):
    """Every test runs in its own empty folder: configs are looked up in ./configs first, so a
    user's ./configs at the repository root must not change what the tests see."""
    monkeypatch.chdir(tmp_path)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---------------------------------------------------------------------------- model configs

#: Every layer type at tiny sizes; a Mamba chunk of 8 makes short sequences span several chunks.
TEST_MODEL = dict(name="test", pattern="M-M*-", hidden_size=32, vocab_size=64, mlp_hidden_size=64,
                  attn_heads=4, attn_kv_heads=2, attn_head_dim=8, mamba_heads=8, mamba_head_dim=8,
                  mamba_state_size=8, mamba_groups=2, mamba_conv_kernel=4, mamba_chunk_size=8)


@pytest.fixture
def make_config():
    """A ModelConfig of every layer type at tiny sizes, with fields replaced by keyword."""
    from fp4repro.config.model import ModelConfig

    def make(**overrides) -> ModelConfig:
        return ModelConfig(**{**TEST_MODEL, **overrides})
    return make


# ------------------------------------------------------------------------- the Snakemake DAG

SNAKEFILE = Path(__file__).resolve().parents[1] / "workflow" / "Snakefile"


class Snakemake:
    """`snakemake -s workflow/Snakefile -d WORKDIR ARGS` in a subprocess (tests/workflow, tests/slurm)."""

    @staticmethod
    def command(workdir: Path, *args: str) -> list[str]:
        return [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir), *args]

    def __call__(self, workdir: Path, *args: str, check: bool = True, env: dict | None = None,
                 timeout: float = 900) -> subprocess.CompletedProcess:
        cmd = self.command(workdir, *args)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**(env or os.environ), "OMP_NUM_THREADS": "1"})
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                                 f"{proc.stderr[-4000:]}")
        return proc

    @staticmethod
    def planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
        """Rule -> job count from a dry run's 'Job stats' table ({} when nothing is to be done)."""
        text = proc.stdout + proc.stderr
        if "Nothing to be done" in text:
            return {}
        table = text.split("Job stats:")[1].split("total")[0]
        return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.fixture(scope="session")
def snakemake() -> Snakemake:
    return Snakemake()


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, snakemake) -> Path:
    """The reduced study (the packaged configs/experiment/smoke.yaml) run locally through Snakemake,
    once per session: its working directory (results/, figures/, paper/smoke/report.md, logs/)."""
    workdir = tmp_path_factory.mktemp("smoke-local")
    snakemake(workdir, "--cores", "2", "--config", "experiment=smoke")
    return workdir
