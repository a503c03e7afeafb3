import pytest
import torch

from fp4repro.train import WSDSchedule, eval_checkpoint_steps, load_checkpoint, save_checkpoint
from fp4repro.train.checkpoint import CheckpointError, load_latest_resume, prune_resume


def test_wsd_schedule():
    s = WSDSchedule.from_fractions(1.0, total_steps=100, warmup_fraction=0.1, decay_fraction=0.2, min_lr_ratio=0.1)
    assert s(0) == 0.1 and s(9) == 1.0  # linear warmup over 10 steps
    assert s(10) == 1.0 and s(79) == 1.0  # stable
    assert s(80) == 1.0 and abs(s(90) - 0.55) < 1e-12 and abs(s(99) - 0.145) < 1e-12  # decay to 0.1
    assert all(s(i) >= s(i + 1) for i in range(10, 99))


def test_wsd_schedule_in_words():
    s = WSDSchedule.from_fractions(8e-4, total_steps=30_000, warmup_fraction=0, decay_fraction=0.15, min_lr_ratio=0.01)
    assert s.describe() == (
        "lr 0.0008 (WSD over 30,000 steps): no warmup, the peak to step 25,500, then a linear decay over "
        "the last 4,500 steps (15%) to 1% of the peak"
    )
    s = WSDSchedule.from_fractions(1.0, total_steps=100, warmup_fraction=0.1, decay_fraction=0, min_lr_ratio=0.1)
    assert s.describe() == "lr 1 (WSD over 100 steps): a linear warmup over 10 steps, the peak to step 100, no decay"


def test_twelve_checkpoints_evenly_spaced_in_tokens():
    steps = eval_checkpoint_steps(192, 12)
    assert steps == [16 * i for i in range(1, 13)]
    assert eval_checkpoint_steps(7, 12) == [1, 2, 3, 4, 5, 6, 7]  # fewer steps than checkpoints


def test_checkpoint_round_trip_and_corruption(tmp_path, capsys):
    folder = tmp_path / "resume"
    for step in (10, 20, 30):
        save_checkpoint({"step": step, "w": torch.full((4,), float(step))}, folder / f"resume_{step:08d}.pt")
        prune_resume(folder)
    assert sorted(p.name for p in folder.glob("*.pt")) == ["resume_00000020.pt", "resume_00000030.pt"]
    assert load_latest_resume(folder)["step"] == 30
    newest = folder / "resume_00000030.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # truncated by a crash
    assert load_latest_resume(folder)["step"] == 20  # the previous one is used
    assert "truncated or corrupt" in capsys.readouterr().err
    (folder / "resume_00000020.pt.sha256").unlink()  # a write that never finished
    assert load_latest_resume(folder) is None
    with pytest.raises(CheckpointError, match=r"resume_00000030\.pt: sha256 .* truncated or corrupt"):
        load_checkpoint(newest)


class _NotATensor:
    """An object a checkpoint of ours never holds: pickling it in means the file is not ours."""


def test_checkpoints_are_read_without_running_code_from_them(tmp_path):
    ckpt = tmp_path / "resume_00000001.pt"
    save_checkpoint({"step": 1, "w": torch.ones(2), "numpy_like": (3, "x", None)}, ckpt)
    assert load_checkpoint(ckpt)["numpy_like"] == (3, "x", None)
    save_checkpoint({"step": 1, "payload": _NotATensor()}, ckpt)  # digest fine, content refused
    with pytest.raises(CheckpointError, match="holds test_schedule_checkpoint._NotATensor, not only tensors"):
        load_checkpoint(ckpt)
