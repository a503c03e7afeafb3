"""Training samples of one stage: megatron-core's ``GPTDataset`` per source, blended by the stage's
weights with ``BlendedDataset``, both built by ``BlendedMegatronDatasetBuilder``.

Sample ``i`` is a fixed function of (prepared data, blend, sequence length, seed, number of
samples, i): a window of ``seq_len + 1`` consecutive tokens of the source's shuffled document
stream (documents joined by EOD, windows may span documents), the source picked so that every
prefix of the sample order follows the blend weights as closely as possible.

Index caches: megatron-core saves each GPTDataset's document/sample/shuffle indices as ``.npy``
files. Those of one sampler live in their own folder, ``<cache_dir>/<split>-<key>``, whose name is
a hash of everything that determines them. The folder is built under a temporary name and renamed
into place when complete, and never changed afterwards; so a killed build leaves only a temporary
folder (ignored), and concurrent builders each build their own copy, the first rename wins and the
others (identical, by determinism) are dropped. Inside a ``torch.distributed`` process group the
ranks share one build through megatron-core's rank-0-first protocol instead.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from fp4repro.data.corpus import SPLITS
from fp4repro.data.errors import DataError
from fp4repro.data.indexed import read_token_stream
from fp4repro.data.integrity import check_token_ids
from fp4repro.data.manifest import Manifest
from fp4repro.data.megatron_datasets import megatron_datasets
from fp4repro.data.tokenizer import MegatronTokenizer


@functools.cache
def _single_process_builder_class() -> type:
    """megatron-core's ``BlendedMegatronDatasetBuilder``, made usable without ``torch.distributed``.

    ``BlendedDataset`` asks for the process rank before saving its index cache, which fails when
    no process group exists. Outside a process group its indices are therefore built in memory
    (one pass in C++, cheap) instead of cached; the GPTDataset caches, the expensive part, stay.
    """
    mc = megatron_datasets()

    class SingleProcessBuilder(mc.BlendedMegatronDatasetBuilder):
        @staticmethod
        def build_generic_dataset(cls, is_built_on_rank, synchronize_ranks, *args):
            if cls is mc.BlendedDataset and not torch.distributed.is_initialized():
                *head, config = args
                args = (*head, dataclasses.replace(config, path_to_cache=None))
            return mc.BlendedMegatronDatasetBuilder.build_generic_dataset(
                cls, is_built_on_rank, synchronize_ranks, *args
            )

    return SingleProcessBuilder


_MEGATRON_LOGS_LOCK = threading.Lock()


@contextmanager
def _quiet_megatron_logs():
    """megatron-core logs every index build (and warns when an index is not cached); keep that
    out of training output while a sampler is built. One build at a time per process, so that
    the logger's level is always restored to what it was."""
    logger = logging.getLogger("megatron.core")
    with _MEGATRON_LOGS_LOCK:
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            logger.setLevel(level)


def active_blend(manifest: Manifest, blend: dict[str, float], split: str) -> tuple[list[str], list[float]]:
    """The sources with positive weight (megatron-core rejects zero weights) and their normalized
    weights, in sorted source order; every one of them must have tokens in ``split``."""
    if not blend:
        raise DataError("empty blend: give at least one source with a positive weight")
    for name, weight in blend.items():
        manifest.entry(name, split)  # unknown source or split -> clear error
        if not weight >= 0:
            raise DataError(f"blend weight of source '{name}' is {weight}; weights must be >= 0")
    names = sorted(name for name, weight in blend.items() if weight > 0)
    if not names:
        raise DataError(f"blend {blend} has no source with a positive weight")
    for name in names:
        if manifest.tokens(name, split) == 0:
            raise DataError(
                f"source '{name}' has no tokens in split '{split}' of {manifest.root}, "
                f"but the blend gives it weight {blend[name]}"
            )
    total = sum(blend[name] for name in names)
    return names, [blend[name] / total for name in names]


class StageSampler:
    """Fixed-length token windows drawn from a weighted blend of prepared sources.

    ``sampler[i]`` is a LongTensor of ``seq_len + 1`` tokens (inputs are ``[:-1]``, targets
    ``[1:]``), the same for the same (manifest, blend, seq_len, num_samples, seed, split, i);
    ``len(sampler) >= num_samples``. ``sampler.source(i)`` names the source sample ``i`` came from.
    """

    def __init__(
        self,
        manifest: Manifest,
        blend: dict[str, float],
        seq_len: int,
        num_samples: int,
        seed: int,
        split: str = "train",
        cache_dir: Path | None = None,
    ):
        if seq_len < 1 or num_samples < 1:
            raise DataError(f"seq_len ({seq_len}) and num_samples ({num_samples}) must be positive")
        if split not in SPLITS:
            raise DataError(f"unknown split '{split}' (splits: {', '.join(SPLITS)})")
        self.manifest = manifest
        self.split = split
        self.seq_len = seq_len
        self.num_samples = num_samples
        self.seed = seed
        self.sources, self.weights = active_blend(manifest, blend, split)
        self.prefixes = [manifest.prefix(name, split) for name in self.sources]
        for prefix in self.prefixes:  # ids the model has no embedding for: an error here, not inside the model
            check_token_ids(prefix, manifest.vocab_size)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else manifest.root / "cache"
        self._dataset = self._build()

    # ---- construction

    def _cache_key(self) -> str:
        """Hash of everything the index caches depend on."""
        datasets = [
            [name, prefix, self.manifest.documents(name, self.split), self.manifest.tokens(name, self.split)]
            for name, prefix in zip(self.sources, self.prefixes)
        ]
        payload = {
            "data": self.manifest.data_hash,
            "split": self.split,
            "datasets": datasets,
            "weights": self.weights,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "megatron": megatron_datasets().version,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]

    def _megatron_config(self, path_to_cache: Path):
        mc = megatron_datasets()
        blend_per_split: list = [None] * len(mc.Split)
        blend_per_split[mc.Split[self.split].value] = (self.prefixes, self.weights)
        tokenizer = MegatronTokenizer(self.manifest.tokenizer_path, self.manifest.vocab_size, self.manifest.eod_id)
        return mc.GPTDatasetConfig(
            random_seed=self.seed,
            sequence_length=self.seq_len,
            blend_per_split=blend_per_split,
            tokenizer=tokenizer,
            path_to_cache=str(path_to_cache),
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            create_attention_mask=False,
        )

    def _build_datasets(self, path_to_cache: Path):
        mc = megatron_datasets()
        split_index = mc.Split[self.split].value
        sizes: list = [None] * len(mc.Split)
        sizes[split_index] = self.num_samples
        builder = _single_process_builder_class()(
            mc.GPTDataset, sizes, lambda: True, self._megatron_config(path_to_cache)
        )
        with _quiet_megatron_logs():
            return builder.build()[split_index]

    def _build(self):
        final = self.cache_dir / f"{self.split}-{self._cache_key()}"
        if final.is_dir() or torch.distributed.is_initialized():
            # In a process group, megatron-core's own protocol applies: every rank calls this, the
            # first rank builds and saves the indices, the others wait at a barrier and load them.
            return self._build_datasets(final)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=self.cache_dir))
        try:
            dataset = self._build_datasets(staging)  # a cache miss: indices are built and held in memory
            staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared
            try:
                staging.rename(final)
            except OSError:
                if not final.is_dir():  # not "another process was first": a real failure
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return dataset

    # ---- access

    def __len__(self) -> int:
        return len(self._dataset)

    def _check_index(self, i: int) -> int:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range: this sampler has {len(self)} samples")
        return int(i)

    def __getitem__(self, i: int) -> torch.Tensor:
        sample = self._dataset[self._check_index(i)]
        # megatron returns tokens = window[:-1] and labels = window[1:]; rebuild the window.
        return torch.cat([sample["tokens"], sample["labels"][-1:]])

    def batch(self, start: int, batch_size: int) -> torch.Tensor:
        """Samples ``start .. start + batch_size - 1`` stacked: a LongTensor (batch_size, seq_len + 1)."""
        return torch.stack([self[i] for i in range(start, start + batch_size)])

    def source(self, i: int) -> str:
        """The source sample ``i`` is drawn from."""
        i = self._check_index(i)
        if isinstance(self._dataset, megatron_datasets().BlendedDataset):
            return self.sources[int(self._dataset.dataset_index[i])]
        return self.sources[0]


def validation_tokens(manifest: Manifest, source: str, split: str = "valid") -> np.ndarray:
    """The whole token stream of a (source, split) as int64, documents in stored order, each
    followed by EOD: the input of held-out NLL."""
    if manifest.tokens(source, split) == 0:
        return np.zeros(0, dtype=np.int64)
    check_token_ids(manifest.prefix(source, split), manifest.vocab_size)
    return read_token_stream(manifest.prefix(source, split), manifest.eod_id)
