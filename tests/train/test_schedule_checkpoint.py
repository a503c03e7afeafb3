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


def _held_writes(monkeypatch):
    """``save_checkpoint`` of fp4repro.train.checkpoint made to wait for the returned event before
    it writes: what the caller does between ``save`` and the write is then certain to come first."""
    import threading

    from fp4repro.train import checkpoint

    release, write = threading.Event(), checkpoint.save_checkpoint

    def held(obj, path):
        assert release.wait(timeout=30)
        write(obj, path)

    monkeypatch.setattr(checkpoint, "save_checkpoint", held)
    return release


def test_a_background_checkpoint_holds_the_tensors_as_they_were_when_it_was_saved(tmp_path, monkeypatch):
    """The training goes on changing its parameters in place (an optimizer step) while the writer's
    thread writes: the file holds the values of the moment ``save`` returned, the nested ones too."""
    from fp4repro.train.checkpoint import CheckpointWriter

    release = _held_writes(monkeypatch)
    weight, moments = torch.arange(6.0).reshape(2, 3), [torch.ones(3), (torch.zeros(2), 7)]
    pruned = []
    writer = CheckpointWriter()
    writer.save({"w": weight, "state": moments, "step": 5}, tmp_path / "resume.pt", then=lambda: pruned.append(1))
    weight.add_(100.0)  # an optimizer step before the write
    moments[0].mul_(-1.0)
    moments[1][0].fill_(3.0)
    assert pruned == []  # nothing written yet
    release.set()
    writer.wait()
    saved = load_checkpoint(tmp_path / "resume.pt")
    assert torch.equal(saved["w"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(saved["state"][0], torch.ones(3)) and torch.equal(saved["state"][1][0], torch.zeros(2))
    assert saved["state"][1][1] == 7 and saved["step"] == 5 and pruned == [1]


def test_a_failed_background_write_is_raised_once_by_the_next_save_or_wait(tmp_path, monkeypatch, capsys):
    """A full disk in the writer's thread reaches the caller: ``wait`` raises the error the write
    raised (the loop waits before it writes done.json), once; a ``save`` after it raises it too
    and writes nothing; ``wait_quietly`` (a caller ending on an error of its own) prints it."""
    from fp4repro.errors import DiskFullError
    from fp4repro.train import checkpoint

    def full(obj, path):
        raise DiskFullError(f"disk full writing {path}")

    monkeypatch.setattr(checkpoint, "save_checkpoint", full)
    writer = checkpoint.CheckpointWriter()
    writer.save({"step": 1}, tmp_path / "a.pt")
    with pytest.raises(DiskFullError, match="a.pt"):
        writer.wait()
    writer.wait()  # raised once
    writer.save({"step": 2}, tmp_path / "b.pt")
    with pytest.raises(DiskFullError, match="b.pt"):
        writer.save({"step": 3}, tmp_path / "c.pt")
    assert not list(tmp_path.iterdir())
    writer.save({"step": 4}, tmp_path / "d.pt")
    capsys.readouterr()
    writer.wait_quietly()
    assert capsys.readouterr().err == f"warning: a checkpoint write failed too: disk full writing {tmp_path / 'd.pt'}\n"
    writer.wait()  # printed, not kept
