"""The run folder's lock (issue 42: two `fp4repro train` on one run folder both trained from step 0
and wrote the same files)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fp4repro.train.lock import LOCK_NAME, RunFolderInUse, run_lock

HOLD = "import sys, time; from fp4repro.train.lock import run_lock\nwith run_lock(sys.argv[1]):\n    time.sleep(600)\n"


def _wait_for_holder(out: Path, pid: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until ``pid`` has written itself into the lock file (it holds the lock from then on)."""
    deadline = time.time() + timeout
    lock = out / LOCK_NAME
    while not (lock.is_file() and lock.read_text().strip() == str(pid)):
        assert proc.poll() is None, f"the holder ended ({proc.returncode}) before it held the lock"
        assert time.time() < deadline, "the holder never held the lock"
        time.sleep(0.05)


def test_a_held_folder_is_refused_naming_the_holder_and_a_dead_holders_lock_never_blocks(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)])
    try:
        _wait_for_holder(out, holder.pid, holder)
        with pytest.raises(RunFolderInUse, match=rf"^run folder {out} is in use by pid {holder.pid} "):
            with run_lock(out):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (out / LOCK_NAME).read_text().strip() == str(holder.pid)  # the dead holder's file stays ...
    with run_lock(out):  # ... and blocks nothing: the kernel released its lock
        assert (out / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with run_lock(out):  # released at the end of the block
        pass


@pytest.mark.slow
def test_a_second_train_on_a_folder_in_use_exits_1_and_a_killed_trainings_lock_is_released(tmp_path, train_command):
    out = tmp_path / "run"
    first = subprocess.Popen(train_command(out), stderr=subprocess.DEVNULL)
    try:
        _wait_for_holder(out, first.pid, first)
        second = subprocess.run(train_command(out, "--stop-after", "1"), capture_output=True, text=True, check=False)
        assert first.poll() is None, "the first training ended before the second tried the folder"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert second.returncode == 1 and second.stderr.count("\n") == 1, second.stderr
    assert second.stderr.startswith(f"fp4repro train: error: run folder {out} is in use by pid {first.pid} ")
    # the killed holder's lock is gone with it: the same command now trains (and resumes its run)
    third = subprocess.Popen(train_command(out, "--stop-after", "2"), stderr=subprocess.PIPE, text=True)
    _, err = third.communicate(timeout=600)
    assert third.returncode == 0, err
    assert "step 0 of 400" in err or "resuming from step" in err
    assert (out / LOCK_NAME).read_text() == f"{third.pid}\n"  # it held the lock
