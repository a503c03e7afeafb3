"""A small prepared experiment and finished-looking training runs for the evaluation tests.

Data: prose (docstrings) and code from 30 standard-library files, with generous valid/test
splits so that the held-out documents yield offline tasks. Runs: tiny-model checkpoints saved
exactly as training saves them (random weights: evaluation only needs the format), a
metrics.parquet and done.json.
"""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from fp4repro.config.experiment import load_experiment
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe
from fp4repro.model import NemotronH
from fp4repro.results import run_dir
from fp4repro.train import save_checkpoint

EXPERIMENT = {
    "name": "evaltest",
    "model": "tiny",
    "recipes": ["bf16", "nvfp4", "ue5m3"],
    "data": {
        "sources": {"prose": {"kind": "stdlib_prose"}, "code": {"kind": "stdlib_code"}},
        "tokenizer": {"vocab_size": 2048},
        "split": {"valid": 0.1, "test": 0.2},
        "seed": 1234,
        "max_files": 30,
    },
    "train": {
        "seq_len": 64,
        "batch_size": 8,
        "checkpoints": 2,
        "final_window": 0.25,
        "stages": [
            {"name": "s1", "tokens": 4096, "blend": {"prose": 0.7, "code": 0.3}},
            {"name": "s2", "tokens": 2048, "blend": {"prose": 0.4, "code": 0.6}},
        ],
    },
    "eval": {"n_items": 4, "nll_max_tokens": 512, "batch_size": 32, "seed": 5},
}
STEPS = (6, 12)


def write_experiment(folder: Path, **overrides) -> Path:
    """The test experiment (with top-level fields replaced by ``overrides``) as a YAML file."""
    path = folder / f"{overrides.get('name', EXPERIMENT['name'])}.yaml"
    path.write_text(yaml.safe_dump({**EXPERIMENT, **overrides}, sort_keys=False))
    return path


def make_run(results: Path, experiment: str, recipe: str, steps=STEPS, seed: int = 0) -> Path:
    """A finished training run (seed 0) of the tiny model: checkpoints, metrics.parquet and done.json."""
    run = run_dir(results, experiment, recipe, 0)
    torch.manual_seed(seed)
    model = NemotronH(load_model_config("tiny"), load_recipe(recipe))
    stored = load_recipe(recipe).config
    for step in steps:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))  # every checkpoint has its own weights
        save_checkpoint(
            {
                "model": model.state_dict(),
                "step": step,
                "tokens": step * 512,
                "stage": "s1",
                "model_config": "tiny",
                "recipe": recipe,
                "recipe_config": stored,
                "experiment": experiment,
            },
            run / "ckpt" / f"step_{step:08d}.pt",
        )
    pd.DataFrame(
        {
            "step": range(1, 13),
            "tokens": [512 * i for i in range(1, 13)],
            "stage": "s1",
            "loss": [8.0 - 0.25 * i for i in range(1, 13)],
            "lr": 1e-3,
            "grad_norm": 1.0,
            "tokens_per_s": 1.0,
        }
    ).to_parquet(run / "metrics.parquet", index=False)
    (run / "done.json").write_text(
        json.dumps(
            {"experiment": experiment, "recipe": recipe, "checkpoints": [f"ckpt/step_{s:08d}.pt" for s in steps]}
        )
    )
    return run


@pytest.fixture(scope="session")
def helpers():
    """The module's helpers for test modules (a conftest is not importable by name)."""
    return {"make_run": make_run, "write_experiment": write_experiment, "steps": STEPS}


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """(experiment config, YAML path, results root) with results/<exp>/data prepared."""
    from fp4repro.data import prepare_data

    root = tmp_path_factory.mktemp("eval")
    path = write_experiment(root)
    exp = load_experiment(path)
    prepare_data(exp, root / "results" / exp.name / "data", progress=False)
    return exp, path, root / "results"


@pytest.fixture(scope="session")
def manifest(prepared):
    from fp4repro.data import load_manifest

    exp, _, results = prepared
    return load_manifest(results / exp.name / "data")


@pytest.fixture(scope="session")
def runs(prepared):
    """recipe -> run folder, for bf16, nvfp4 and ue5m3."""
    exp, _, results = prepared
    return {r: make_run(results, exp.name, r) for r in exp.recipes}


@pytest.fixture(scope="session")
def offline_tasks(prepared, manifest):
    from fp4repro.eval.run import ensure_offline_tasks

    exp, _, results = prepared
    return ensure_offline_tasks(
        manifest, results / exp.name / "eval" / "tasks", n_items=exp.eval.n_items, seed=exp.eval.seed
    )
