"""``fp4repro prepare-data``: prepare an experiment's data and print what is in it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fp4repro.data.errors import DataError
from fp4repro.data.prepare import format_summary, prepare_data


def default_data_dir(experiment_name: str) -> Path:
    """Where an experiment's prepared data lives unless told otherwise."""
    return Path("results") / experiment_name / "data"


def prepare_data_main(experiment: str, out_dir: str | None, progress: bool = True) -> int:
    """Prepare the data of ``experiment`` (a name in configs/experiment/ or a YAML path) into
    ``out_dir`` (default ``results/<experiment>/data``), then print a summary table.

    Returns the exit status: 0 on success, 2 for an unusable experiment config, 1 for unusable
    input data (the message names the source and the path).
    """
    from fp4repro.experiment import ExperimentError, load_experiment

    try:
        exp = load_experiment(experiment)
    except ExperimentError as err:
        print(f"fp4repro prepare-data: {err}", file=sys.stderr)
        return 2
    target = Path(out_dir) if out_dir else default_data_dir(exp.name)
    started = time.perf_counter()
    try:
        manifest = prepare_data(exp, target, progress=progress)
    except DataError as err:
        print(f"fp4repro prepare-data: {err}", file=sys.stderr)
        return 1
    print(format_summary(manifest))
    print(f"data of experiment '{exp.name}' in {target} ({time.perf_counter() - started:.1f} s)")
    return 0
