"""Data: corpora, tokenizer, Megatron indexed datasets and the stage samplers training draws from.

manifest = prepare_data(exp, out_dir)        # idempotent; writes manifest.json last
manifest = load_manifest(out_dir)
run = RunSampler(manifest, [(blend, samples) for each stage], seq_len, seed)   # a run: stages disjoint
run.stages[k].batch(start, batch_size)       # LongTensor (batch_size, seq_len + 1)
sampler = StageSampler(manifest, {"prose": 0.7, "code": 0.3}, seq_len, num_samples, seed)   # one blend
validation_tokens(manifest, "prose")         # held-out token stream, documents joined by EOD
"""

from fp4repro.data.errors import DataError
from fp4repro.data.manifest import Manifest, load_manifest
from fp4repro.data.prepare import format_summary, prepare_data
from fp4repro.data.run_sampler import SAMPLING, RunSampler
from fp4repro.data.sampler import StageSampler, validation_tokens

__all__ = [
    "DataError",
    "Manifest",
    "RunSampler",
    "SAMPLING",
    "StageSampler",
    "format_summary",
    "load_manifest",
    "prepare_data",
    "validation_tokens",
]
