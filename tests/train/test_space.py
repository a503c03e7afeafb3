"""Disk space for a run's checkpoints, checked before any compute (issue 42: a 1.45B-parameter run
of 150 steps wrote 22-36 GB, and the third such run filled a 64 GB disk mid-write)."""

from pathlib import Path

import pytest

import fp4repro.train.loop as loop
import fp4repro.train.space as space
from fp4repro.cli import main
from fp4repro.config.study import load_study
from fp4repro.train import list_runs, train
from fp4repro.train.space import CheckpointSizes, checkpoints_to_write

#: a 1.44B-parameter Nemotron-H with the tiny model's vocabulary (it reads the guarded study's data)
LARGE = """name: large
pattern: "M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"
hidden_size: 2048
vocab_size: 2048
mlp_hidden_size: 8192
attn_heads: 16
attn_kv_heads: 4
attn_head_dim: 128
mamba_heads: 64
mamba_head_dim: 64
mamba_state_size: 128
mamba_groups: 8
mamba_conv_kernel: 4
mamba_chunk_size: 128
norm_eps: 1.0e-5
rope: false
"""


def test_the_checkpoints_an_attempt_writes_and_the_resume_checkpoints_it_adds_at_once():
    # 10 steps, evaluation checkpoints at 5 and 10, a resume checkpoint every 5 steps
    assert checkpoints_to_write(0, 10, {5, 10}, 5, 0) == (2, 2)
    # resumed at 5 with one on disk: saves at 10, 15, 20; at most three exist (two kept, one written)
    assert checkpoints_to_write(5, 20, {10, 20}, 5, 1) == (2, 2)
    assert checkpoints_to_write(5, 20, {10, 20}, 5, 2) == (2, 1)
    assert checkpoints_to_write(7, 9, set(), 5, 2) == (0, 1)  # the save at the attempt's last step
    assert checkpoints_to_write(10, 10, {10}, 5, 2) == (0, 0)  # nothing left to train


def test_the_sizes_cover_the_checkpoints_a_run_writes(guarded, tmp_path):
    path, data = guarded
    short = tmp_path / "short.yaml"
    short.write_text(path.read_text().replace("tokens: 12800", "tokens: 320"))  # 10 steps
    study = load_study(short)
    out = train(study, "bf16", data, tmp_path / "run", device="cpu", progress=False)
    (run,) = list_runs(out)
    sizes = CheckpointSizes.of(study, "bf16")
    for found, estimate in ((run.ckpt.glob("step_*.pt"), sizes.evaluation), (run.resume.glob("*.pt"), sizes.resume)):
        files = [p.stat().st_size for p in found]
        assert files and all(size <= estimate <= 1.1 * size for size in files), (files, estimate)


def test_a_third_large_run_that_the_disk_cannot_hold_stops_before_any_compute(guarded, tmp_path, monkeypatch, capsys):
    path, data = guarded
    (Path("configs") / "models").mkdir(parents=True)  # the tests run in tmp_path: ./configs is theirs
    (Path("configs") / "models" / "large.yaml").write_text(LARGE)
    large = tmp_path / "large.yaml"  # 150 steps, two evaluation checkpoints, a resume checkpoint every 50
    large.write_text(
        path.read_text()
        .replace("model: tiny", "model: large")
        .replace("tokens: 12800", "tokens: 4800")
        .replace("checkpoints: 4", "checkpoints: 2")
        .replace("resume_every: 5", "resume_every: 50")
    )
    sizes = CheckpointSizes.of(load_study(large), "bf16")
    assert 5.7e9 < sizes.evaluation < 5.9e9 and 17.2e9 < sizes.resume < 17.5e9  # 1.44B FP32 weights, AdamW x3
    kept = 2 * sizes.evaluation + 2 * sizes.resume  # what each finished run keeps: 46 GB
    free = 64_000_000_000 - kept  # one finished run on a 64 GB disk ...
    needed = 2 * sizes.evaluation + 3 * sizes.resume  # ... and the next needs 2 evaluation, 3 resume at once

    def no_compute(*args, **kwargs):
        raise AssertionError("the model was built: the space check came after compute began")

    monkeypatch.setattr(space, "free_bytes", lambda folder: free)
    monkeypatch.setattr(loop, "build_engine", no_compute)
    out = tmp_path / "run"
    args = ["train", "--experiment", str(large), "--recipe", "bf16", "--data", str(data), "--out", str(out)]
    assert main([*args, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fp4repro train: error: {out}: the run's checkpoints need ")
    assert f"need {needed:,} bytes ({needed / 1e9:.2f} GB) (2 evaluation checkpoints of {sizes.evaluation:,} " in err
    assert f"3 resume checkpoints of {sizes.resume:,} bytes" in err
    assert f"but its filesystem has {free:,} bytes ({free / 1e9:.2f} GB) free" in err
    assert not list(out.glob("runs/*/resume")) and not list(out.glob("runs/*/ckpt"))
    monkeypatch.setattr(space, "free_bytes", lambda folder: needed)  # room enough: it goes on to build the model
    with pytest.raises(AssertionError, match="the model was built"):
        main(args)
