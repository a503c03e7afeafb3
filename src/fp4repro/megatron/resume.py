"""Resume checkpoints of the megatron backend: megatron-core's ``dist_checkpointing`` (torch_dist
format, reshardable), made atomic.

Every rank writes its shards into ``.resume_<step>.dist.partial/``; after all have finished,
rank 0 renames it to ``resume_<step>.dist/``, so a folder with the final name is complete (a
crash leaves only partial ones, removed by the next save). The newest two are kept. A folder
that does not load is reported and the one before it is tried; when none of them loads the run
stops with the reasons rather than start again from step 0 (a resume on another number of
processes, say, whose per-rank state does not fit).

Importing this module does not import megatron-core (the run folders read its names).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import traceback
from pathlib import Path

import torch.distributed as dist

from fp4repro.errors import FP4ReproError

RESUME_DIR_PATTERN = re.compile(r"^resume_(\d{8})\.dist$")


def resume_dirs(folder: Path) -> list[Path]:
    """Complete resume checkpoints in ``folder``, newest first."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and RESUME_DIR_PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(RESUME_DIR_PATTERN.match(p.name).group(1)), reverse=True)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save(sharded_state_dict: dict, folder: Path, step: int, keep: int = 2) -> Path:
    """Write a resume checkpoint of ``step`` (collective: every rank calls it); returns its folder."""
    from megatron.core import dist_checkpointing

    final = folder / f"resume_{step:08d}.dist"
    partial = folder / f".{final.name}.partial"
    if _rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(".resume_*.dist.partial"):  # this save's, or a crashed one's
            shutil.rmtree(stale, ignore_errors=True)
        partial.mkdir()
    _barrier()
    dist_checkpointing.save(sharded_state_dict, str(partial))
    _barrier()
    if _rank() == 0:
        if final.exists():  # the same step saved again (a resumed run's last step)
            shutil.rmtree(final)
        os.replace(partial, final)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        for old in resume_dirs(folder)[keep:]:
            shutil.rmtree(old)
    _barrier()
    return final


def load_newest(sharded_state_dict_of, folder: Path) -> tuple[dict, int] | None:
    """(state, step) of the newest resume checkpoint that loads, or None. ``sharded_state_dict_of()``
    gives the sharded state dict to load into (built afresh for each try: loading consumes it)."""
    from megatron.core import dist_checkpointing

    failures = []
    for path in resume_dirs(folder):
        try:
            state = dist_checkpointing.load(sharded_state_dict_of(), str(path))
        except Exception as err:  # any reason a folder cannot be read: fall back to the one before
            reason = "".join(traceback.format_exception_only(err)).strip()  # the type too: some say nothing else
            print(
                f"warning: skipping resume checkpoint {path}: {reason}\n"
                f"{''.join(traceback.format_tb(err.__traceback__)[-4:])}",
                file=sys.stderr,
            )
            failures.append(f"{path.name}: {reason}")
            continue
        return state, int(RESUME_DIR_PATTERN.match(path.name).group(1))
    if failures:
        raise FP4ReproError(
            f"{folder}: no resume checkpoint loads ({'; '.join(failures)}); the run does not start "
            "again from step 0 over them: resume with the processes they were written by, or "
            "move the folder away to start afresh"
        )
    return None
