"""Disk space for a run's checkpoints, checked against its run folder's filesystem before any compute.

A run writes evaluation checkpoints (the model's weights, ``TrainConfig.checkpoints`` of them) and
rolling resume checkpoints (the weights, AdamW's two moments, the quantization state and the RNG
states). The newest two resume checkpoints are kept, and a new one is written whole before the
oldest is removed, so up to three exist at once. A 1.45B-parameter model writes several GB per
checkpoint; a run that finds the disk full mid-write has wasted its compute (its files are intact:
writes are atomic), so the space it will need is compared with what is free before it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fp4repro.errors import FP4ReproError
from fp4repro.model import NemotronH
from fp4repro.util import free_bytes

RESUME_KEPT = 2  # the newest resume checkpoints kept (fp4repro.train.checkpoint.prune_resume)
PER_TENSOR = 1024  # a saved tensor's file overhead beyond its bytes (torch.save: about 350)
STATES = 1 << 20  # a resume checkpoint's quantization and RNG states (tens of kB at 8B)


class NotEnoughSpace(FP4ReproError):
    """The run folder's filesystem has less free space than the run's checkpoints will take."""


@dataclass(frozen=True)
class CheckpointSizes:
    """Bytes of one checkpoint of each kind, from the model's tensors, a little above the file's."""

    evaluation: int  # the weights (state_dict)
    resume: int  # the weights, AdamW's two moments of every parameter, the quantization and RNG states

    @classmethod
    def of(cls, study, recipe_name: str) -> CheckpointSizes:
        """The sizes for the study's model under a recipe, built on the meta device (no memory)."""
        with torch.device("meta"):
            model = NemotronH(study.model, study.recipe(recipe_name))
        state = model.state_dict().values()
        weights = sum(t.numel() * t.element_size() + PER_TENSOR for t in state)
        moments = sum(2 * (p.numel() * p.element_size() + PER_TENSOR) for p in model.parameters())
        return cls(weights, weights + moments + STATES)


def checkpoints_to_write(
    start_step: int, end_step: int, eval_steps: set[int], resume_every: int, resume_on_disk: int
) -> tuple[int, int]:
    """(evaluation checkpoints, the most resume checkpoints that will exist beyond those on disk)
    of an attempt that trains steps ``start_step + 1 .. end_step``. A resume checkpoint is saved
    every ``resume_every`` steps and at ``end_step``; each is written before the oldest of the
    ``RESUME_KEPT`` kept ones is removed."""
    steps = range(start_step + 1, end_step + 1)
    evaluations = sum(1 for s in steps if s in eval_steps)
    saves = sum(1 for s in steps if s % resume_every == 0 or s == end_step)
    kept = min(resume_on_disk, RESUME_KEPT)
    resumes = min(kept + saves, RESUME_KEPT + 1) - kept if saves else 0
    return evaluations, resumes


def _size(n: int) -> str:
    """'1,234,567,890 bytes (1.23 GB)'."""
    return f"{n:,} bytes ({n / 1e9:.2f} GB)"


def check_free_space(folder: Path, sizes: CheckpointSizes, evaluations: int, resumes: int) -> None:
    """``NotEnoughSpace``, naming what the checkpoints need and what is free, when the filesystem
    of ``folder`` cannot hold ``evaluations`` evaluation and ``resumes`` resume checkpoints."""
    needed = evaluations * sizes.evaluation + resumes * sizes.resume
    free = free_bytes(folder)
    if free is None or needed <= free:
        return
    raise NotEnoughSpace(
        f"{folder}: the run's checkpoints need {_size(needed)} ({evaluations} evaluation checkpoints of "
        f"{_size(sizes.evaluation)}, {resumes} resume checkpoints of {_size(sizes.resume)}: the newest "
        f"{RESUME_KEPT} are kept and the next is written before the oldest goes), but its filesystem has "
        f"{_size(free)} free; free some space (`fp4repro runs --prune` removes the runs of other configs) or "
        "train into a folder on another disk (--out)"
    )
