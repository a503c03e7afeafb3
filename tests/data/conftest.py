"""Small experiments for the data tests: two synthetic sources with disjoint alphabets (so that a
token tells which source it came from), written as JSONL and plain text files."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from fp4repro.config.experiment import load_experiment

ALPHA_LETTERS = "abcdefghijklm"
BETA_LETTERS = "nopqrstuvwxyz"


def sentence(rng: np.random.Generator, letters: str, words: int) -> str:
    return " ".join("".join(rng.choice(list(letters), size=int(rng.integers(2, 8)))) for _ in range(words))


def write_experiment(
    folder: Path,
    sources: dict,
    tokenizer: dict | None = None,
    split: dict | None = None,
    name: str = "datatest",
    max_files: int | None = None,
):
    """Write and load an experiment using the tiny model with the given data sources (an evenly
    spread subset of ``max_files`` files per source, when given)."""
    first = next(iter(sources))
    raw = {
        "name": name,
        "model": "tiny",
        "recipes": ["bf16"],
        "data": {
            "sources": sources,
            "tokenizer": tokenizer or {"vocab_size": 2048},
            "split": split or {"valid": 0.1, "test": 0.1},
            "seed": 7,
            **({"max_files": max_files} if max_files is not None else {}),
        },
        "train": {"seq_len": 32, "batch_size": 4, "stages": [{"name": "s1", "tokens": 4096, "blend": {first: 1.0}}]},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_experiment(path)


@pytest.fixture(scope="session")
def make_experiment():
    """``write_experiment`` as a fixture, for test modules (conftest is not importable by name)."""
    return write_experiment


@pytest.fixture(scope="session")
def synthetic_inputs(tmp_path_factory) -> dict:
    """alpha: 300 JSONL records (plus 3 duplicates, one differing only in line ends and trailing
    blanks); beta: 40 text files. Returns the source configs."""
    root = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(0)
    records = [{"id": i, "text": sentence(rng, ALPHA_LETTERS, 40)} for i in range(300)]
    records += [records[0], records[1], {"id": -1, "text": "\r\n" + records[2]["text"] + "  \r\n\n"}]
    (root / "alpha").mkdir()
    with open(root / "alpha" / "part0.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records[:150])
    with open(root / "alpha" / "part1.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records[150:])
    (root / "beta").mkdir()
    for i in range(40):
        (root / "beta" / f"doc{i:02d}.txt").write_text(sentence(rng, BETA_LETTERS, 120) + "\n")
    return {
        "alpha": {"kind": "jsonl", "paths": [str(root / "alpha" / "*.jsonl")], "field": "text"},
        "beta": {"kind": "text", "paths": [str(root / "beta" / "*.txt")]},
    }


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, synthetic_inputs):
    """The synthetic experiment, prepared once: (experiment, manifest)."""
    from fp4repro.data import prepare_data

    root = tmp_path_factory.mktemp("prepared")
    exp = write_experiment(root, synthetic_inputs)
    return exp, prepare_data(exp, root / "data", progress=False)
