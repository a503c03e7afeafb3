"""The megatron backend's resume folders as the run folders see them (no GPU: the folders only)."""

import pytest
import torch

from fp4repro.megatron.resume import resume_dirs
from fp4repro.train.runs import RunFolder


def test_only_complete_resume_folders_count_newest_first(tmp_path):
    run = RunFolder(tmp_path, "abc")
    for name in ("resume_00000010.dist", "resume_00000030.dist", ".resume_00000040.dist.partial"):
        (run.resume / name).mkdir(parents=True)
    (run.resume / "resume_00000050.dist").write_text("a file, not a checkpoint folder")
    assert [p.name for p in resume_dirs(run.resume)] == ["resume_00000030.dist", "resume_00000010.dist"]
    assert run.resume_step() == 30


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_the_megatron_backend_without_cuda_says_so_before_reading_data(tmp_path):
    from fp4repro.config.study import load_study
    from fp4repro.errors import FP4ReproError
    from fp4repro.train import train

    path = tmp_path / "exp.yaml"
    path.write_text(
        "name: m\nmodel: tiny\nrecipes: [bf16]\nbackend: megatron\n"
        "data: {sources: {prose: {kind: stdlib_prose}}, tokenizer: {vocab_size: 2048}}\n"
        "train: {seq_len: 64, batch_size: 4, stages: [{name: s, tokens: 2560, blend: {prose: 1.0}}]}\n"
    )
    with pytest.raises(FP4ReproError, match="backend megatron trains on CUDA GPUs .* none is visible"):
        train(load_study(path), "bf16", tmp_path / "no_data", tmp_path / "out")


# A process importing megatron-core (and so mamba-ssm) records the environment it sees then.
_SEE_IMPORT_OF_MEGATRON_CORE = """
import os, sys
from fp4repro.config.study import load_study
from fp4repro.errors import FP4ReproError
from fp4repro.train import train

seen = []
class See:
    def find_spec(self, name, path=None, target=None):
        if name == "megatron.core" and not seen:
            seen.append(os.environ.get("MAMBA_DETERMINISTIC"))
        return None
sys.meta_path.insert(0, See())
try:
    train(load_study(sys.argv[1]), "bf16", sys.argv[2], sys.argv[3], deterministic=True)
except FP4ReproError:
    pass
print(seen)
"""


@pytest.mark.slow
def test_deterministic_mode_is_chosen_before_megatron_core_is_imported(tmp_path):
    """mamba-ssm fixes its kernels' launch configs when megatron-core imports it: a deterministic
    run must have chosen mamba-ssm's deterministic mode by then, whatever imports megatron-core
    first (the backend's refusal of a machine without CUDA does, before the engine is built)."""
    import os
    import subprocess
    import sys

    path = tmp_path / "exp.yaml"
    path.write_text(
        "name: m\nmodel: tiny\nrecipes: [bf16]\nbackend: megatron\n"
        "data: {sources: {prose: {kind: stdlib_prose}}, tokenizer: {vocab_size: 2048}}\n"
        "train: {seq_len: 64, batch_size: 4, stages: [{name: s, tokens: 2560, blend: {prose: 1.0}}]}\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MAMBA_DETERMINISTIC"}
    argv = [sys.executable, "-c", _SEE_IMPORT_OF_MEGATRON_CORE, str(path), str(tmp_path / "d"), str(tmp_path / "o")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['1']", done.stderr
