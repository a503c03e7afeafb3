"""The `fp4repro train` command of the small study of tests/conftest.py (``guarded``) for the tests
of its guards: the run folder's lock and owner, the data's digests, the disk space."""

import sys
from pathlib import Path

import pytest


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
