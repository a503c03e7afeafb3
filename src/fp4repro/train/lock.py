"""The lock of a run folder: one ``fp4repro train`` writes into a run folder (``out``) at a time.

An OS file lock (``flock``) on ``out/.lock``, held for as long as the process trains. The kernel
releases it when the process ends, however it ends (SIGKILL and a power cut included), so a lock
file left behind by a dead process never blocks the next run; no pid is ever checked for being
alive. The file holds the holder's pid, for the message that names it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fp4repro.errors import FP4ReproError

LOCK_NAME = ".lock"


class RunFolderInUse(FP4ReproError):
    """Another process holds the run folder's lock."""


def _holder(fd: int) -> str:
    """The pid the lock file names (what its holder wrote), or 'unknown' before it has written it."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"


@contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock for the block; ``RunFolderInUse`` naming the holder's pid at once when
    another process holds it (the second of two trainings on one folder stops, it does not wait)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderInUse(
                f"run folder {out} is in use by pid {_holder(fd)} (another `fp4repro train`); wait for it to "
                "end, or give this run a folder of its own (--out)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock (the kernel does it too, if the process dies first)
