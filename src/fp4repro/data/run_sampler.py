"""The training samples of a whole run, over all its stages: each source read in one shuffled pass,
its windows dealt out to the stages in turn, so that no stage sees another stage's windows.

A stage draws ``n_k`` samples with its blend. Which source each of them comes from is megatron-core's
blending (``build_blending_indices``: every prefix of the stage's order follows its weights as
closely as possible), giving ``n_{k,s}`` samples of source s in stage k. Source s is one
``StageSampler`` over its training split alone, with N_s = Σ_k n_{k,s} windows (one shuffle of its
documents, megatron-core's ``GPTDataset``); stage k's j-th sample from s is window
``o_{k,s} + j`` of it, with ``o_{k,s} = Σ_{k'<k} n_{k',s}``. Windows of one source are consecutive
pieces of its shuffled token stream (each shares only its last token, the last target, with the
next), so as long as N_s · seq_len tokens fit in the source's training split, no training token is
read twice in a run. Beyond that megatron-core starts another epoch: ``epochs`` says how many, and
the run says so when it starts.

Sample ``i`` of stage k is a fixed function of (prepared data, every stage's blend and size,
sequence length, seed, k, i).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fp4repro.data.errors import DataError
from fp4repro.data.manifest import Manifest
from fp4repro.data.megatron_datasets import megatron_datasets
from fp4repro.data.sampler import StageSampler, active_blend

#: enters the run fingerprint: a change of how samples are drawn changes what a run computes
SAMPLING = "run-disjoint-1"


def blending(weights: list[float], size: int) -> np.ndarray:
    """The source of each of ``size`` samples for normalized ``weights`` (megatron-core's blending)."""
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    megatron_datasets().helpers.build_blending_indices(
        dataset_index, dataset_sample_index, np.asarray(weights, dtype=np.float64), len(weights), size, False
    )
    return dataset_index


@dataclass(frozen=True)
class Stage:
    """One stage's samples: ``stage[i]``, ``stage.batch(start, n)``, ``stage.source(i)``."""

    run: RunSampler
    index: int
    sources: tuple[str, ...]  # this stage's sources (positive weight), sorted
    pick: np.ndarray  # the source (position in ``sources``) of each sample
    within: np.ndarray  # the sample's window in its source's pass

    def __len__(self) -> int:
        return len(self.pick)

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range: stage {self.index} has {len(self)} samples")
        return self.run.passes[self.sources[self.pick[i]]][int(self.within[i])]

    def batch(self, start: int, batch_size: int) -> torch.Tensor:
        """Samples ``start .. start + batch_size - 1`` stacked: a LongTensor (batch_size, seq_len + 1)."""
        return torch.stack([self[i] for i in range(start, start + batch_size)])

    def source(self, i: int) -> str:
        return self.sources[self.pick[i]]


class RunSampler:
    """The stages of a run (``stages[k]``) from ``(blend, samples)`` per stage, in order."""

    def __init__(
        self, manifest: Manifest, stages: list[tuple[dict[str, float], int]], seq_len: int, seed: int, cache_dir=None
    ):
        if not stages:
            raise DataError("a run needs at least one stage")
        picks, names = [], []
        for blend, samples in stages:
            if samples < 1:
                raise DataError(f"a stage must draw at least one sample, not {samples}")
            sources, weights = active_blend(manifest, blend, "train")
            picks.append(blending(weights, samples))
            names.append(tuple(sources))
        counts: dict[str, int] = {}
        self.stages: list[Stage] = []
        for k, (sources, pick) in enumerate(zip(names, picks)):
            within = np.zeros(len(pick), dtype=np.int64)
            for j, name in enumerate(sources):
                mine = pick == j
                offset = counts.get(name, 0)
                within[mine] = offset + np.arange(int(mine.sum()))
                counts[name] = offset + int(mine.sum())
            self.stages.append(Stage(self, k, sources, pick, within))
        self.windows = counts  # windows each source gives the run
        self.seq_len = seq_len
        self.passes = {
            name: StageSampler(manifest, {name: 1.0}, seq_len, n, seed=seed, cache_dir=cache_dir)
            for name, n in sorted(counts.items())
        }
        self.supply = {name: max((manifest.tokens(name, "train") - 1) // seq_len, 1) for name in counts}

    @classmethod
    def of_run(cls, manifest: Manifest, train, seed: int, cache_dir=None) -> RunSampler:
        """The samples of a training run (``TrainConfig``: its stages' blends, steps and batch size)."""
        return cls(
            manifest,
            [(dict(stage.blend), steps * train.batch_size) for stage, steps in zip(train.stages, train.stage_steps())],
            train.seq_len,
            seed,
            cache_dir=cache_dir,
        )

    def epochs(self) -> dict[str, float]:
        """Passes over each source's training tokens the run makes (above 1: it repeats tokens)."""
        return {name: self.windows[name] / self.supply[name] for name in sorted(self.windows)}

    def repeats(self) -> str | None:
        """A sentence naming the sources the run reads more than once, or None."""
        over = {name: e for name, e in self.epochs().items() if e > 1}
        if not over:
            return None
        return "the run reads " + ", ".join(
            f"source '{name}' {math.ceil(e)} times ({self.windows[name]:,} windows of "
            f"{self.seq_len} tokens, {self.supply[name]:,} in its training split)"
            for name, e in over.items()
        )
