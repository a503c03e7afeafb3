"""A small study and its prepared data for the tests that start `fp4repro train` (its guards: the
run folder's lock and owner, the data's digests, the disk space)."""

import sys
import sysconfig
from pathlib import Path

import pytest

STDLIB = sysconfig.get_paths()["stdlib"]
#: 400 steps of the tiny model: long enough for a run to still be training while a test looks at it
GUARDED = f"""name: guarded
model: tiny
recipes: [bf16]
data:
  sources:
    prose: {{kind: text, paths: ["{STDLIB}/json/*.py", "{STDLIB}/textwrap.py"]}}
  tokenizer: {{vocab_size: 2048}}
  split: {{valid: 0.1, test: 0.1}}
train:
  seq_len: 16
  batch_size: 2
  checkpoints: 4
  telemetry_every: 1
  resume_every: 5
  stages:
    - {{name: s1, tokens: 12800, blend: {{prose: 1.0}}}}
"""


@pytest.fixture(scope="session")
def guarded(tmp_path_factory) -> tuple[Path, Path]:
    """(the study's experiment file, its prepared data folder), prepared once per session."""
    from fp4repro.config.experiment import load_experiment
    from fp4repro.data import prepare_data

    root = tmp_path_factory.mktemp("guarded")
    path = root / "guarded.yaml"
    path.write_text(GUARDED)
    prepare_data(load_experiment(path), root / "data", progress=False)
    return path, root / "data"


@pytest.fixture
def train_command(guarded):
    """``train_command(out, *extra)``: the `fp4repro train` command of the guarded study's bf16 run
    into ``out`` (``data=`` another data folder)."""

    def command(out: Path, *extra: str, data: Path | None = None) -> list[str]:
        path, prepared = guarded
        return [sys.executable, "-m", "fp4repro.cli", "train", "--experiment", str(path), "--recipe", "bf16"] + [
            "--data",
            str(data or prepared),
            "--out",
            str(out),
            "--quiet",
            *extra,
        ]

    return command
