"""Re-run the first steps of a committed training run and compare what it logged (``fp4repro verify``).

A committed run is the folder ``<results>/<experiment>/train/<recipe>/seed<seed>/`` of a run that
ended: its done.json, metrics.parquet and telemetry.parquet. Before any compute, ``verify`` refuses
(``Refusal``: exit code 2, one line) a run that cannot be repeated here: one that is missing, data
whose digest is not the one the run trained on, numerics (``fp4repro.config.numerics``) other than
the ones it recorded, a config whose run fingerprint is not the run's, another device. Then it
trains the first N steps again into a temporary folder (the committed folder is only read), on the
recorded device (the CPU with the recorded number of threads, or a GPU of the recorded name), in
deterministic mode when the run was made in it, and compares the tables row by row.

Deterministic runs: every CPU run (its kernels reduce in a fixed order: a second run is identical;
done.json's ``deterministic`` says whether torch's deterministic algorithms were on, which a CPU
run does not need) and every GPU run made with ``--deterministic``. Their rerun must be identical:
every column of every metrics row but ``tokens_per_s`` and ``attempt`` (how long a step took, which
process computed it) and every column of every telemetry row, equal as numbers (NaN equal to NaN).

Fast-mode GPU runs: each step's loss must be within the tolerance measured for that many steps
(``SPREAD``: 1.5 x the largest per-step |Δloss| between two same-seed runs over as many steps), the
other metrics columns but ``grad_norm`` equal, and the same telemetry rows logged (steps, layers,
operands), whose values are not judged (no spread is measured for them). Without a measured spread
a fast-mode run is refused: no tolerance is made up.

Steps are counted as metrics.parquet counts them, from 1: telemetry's step s (counted from 0) is
optimizer step s + 1. Runs started from a checkpoint (``--init-from``) are refused (their
fingerprint includes the checkpoint's digest, which done.json does not name).
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fp4repro.config.numerics import UNRECORDED, numerics_record
from fp4repro.data import load_manifest
from fp4repro.errors import ConfigError, FP4ReproError
from fp4repro.results import METRICS_COLUMNS, SPREAD, read_table, repeats_bit_for_bit, run_dir, table_provenance
from fp4repro.train.cadence import is_telemetry_step, refresh_steps_of
from fp4repro.train.loop import METRICS, TELEMETRY, train
from fp4repro.train.runs import RunFolder, changed_fields, run_fingerprint

TOLERANCE_FACTOR = 1.5
#: the metrics columns that say how a step was computed, not what: never compared
UNCOMPARED = ("tokens_per_s", "attempt")


class Refusal(ConfigError):
    """The committed run cannot be repeated here; nothing was computed (exit code 2)."""


@dataclass(frozen=True)
class Verdict:
    identical: bool  # or within tolerance
    line: str


@dataclass(frozen=True)
class CommittedRun:
    done: dict
    metrics: pd.DataFrame
    telemetry: pd.DataFrame
    origin: dict  # metrics.parquet's provenance
    folder: Path

    @classmethod
    def load(cls, folder: Path, name: str) -> CommittedRun:
        missing = [f for f in ("done.json", "metrics.parquet", "telemetry.parquet") if not (folder / f).is_file()]
        if missing:
            raise Refusal(
                f"no committed run of {name} in {folder} (missing {', '.join(missing)}: `fp4repro train` writes "
                "them when a run ends)"
            )
        done = json.loads((folder / "done.json").read_text())
        metrics = read_table(folder / "metrics.parquet", METRICS_COLUMNS, "a training metrics table", Refusal)
        telemetry = read_table(folder / "telemetry.parquet", ("step",), "a training telemetry table", Refusal)
        return cls(done, metrics, telemetry, table_provenance(folder / "metrics.parquet") or {}, folder)

    @property
    def device(self) -> str:
        return self.origin.get("device") or self.done.get("provenance", {}).get("device") or "unrecorded"


def check_repeatable(study, recipe: str, seed: int, run: CommittedRun, data_dir: Path, name: str) -> None:
    """Refuse, naming both values, a rerun that would not compute the committed run's numbers: its
    corpus digest, its numerics fingerprints, its run fingerprint (the config)."""
    try:
        data_hash = load_manifest(data_dir).data_hash
    except FP4ReproError as err:
        raise Refusal(f"{name}: cannot read the data to rerun on: {err}") from None
    recorded = run.origin.get("data") or run.done.get("provenance", {}).get("data")
    if recorded != data_hash:
        raise Refusal(
            f"{name}: the corpus digest differs: the committed run trained on {recorded or 'unrecorded data'}, "
            f"{data_dir} holds {data_hash} (prepare the run's data, or give it with --data)"
        )
    here = numerics_record(study.recipe(recipe), study.model.layer_linears)
    for key in ("numerics", "run_numerics"):
        if run.done.get(key, UNRECORDED) != here[key]:
            raise Refusal(
                f"{name}: the {key.replace('_', ' ')} fingerprint differs: the committed run computed with "
                f"{run.done.get(key, UNRECORDED)}, this code computes with {here[key]} (numerics version "
                f"{here['numerics_version']}): its numbers cannot be repeated here"
            )
    numerics, fingerprint = run_fingerprint(study, recipe, seed, data_hash)
    if run.done.get("fingerprint") != fingerprint:
        old = RunFolder(run.folder, str(run.done.get("fingerprint"))).record()  # where its run folder is kept
        fields = changed_fields(old["numerics"], numerics) if old else []
        raise Refusal(
            f"{name}: the run fingerprint differs: the committed run is {run.done.get('fingerprint')}, the current "
            f"config makes {fingerprint} ("
            + (f"{', '.join(fields)} differ" if fields else "its config, or a checkpoint it started from, changed")
            + ")"
        )


def rerun_device(recorded: str, name: str) -> str:
    """The device to rerun on: the CPU, or a GPU of the recorded name (refused otherwise)."""
    if recorded.startswith("cpu"):
        return "cpu"
    import torch

    here = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    if here != recorded:
        raise Refusal(f"{name}: made on {recorded}, this machine has {here}: a rerun on another device is not the run")
    return "cuda"


@contextlib.contextmanager
def recorded_threads(recorded: str):
    """The CPU's thread count of the committed run (``cpu (x86_64, 2 threads)``) while it reruns."""
    import torch

    match = re.match(r"cpu \(.*, (\d+) threads?\)$", recorded)
    before = torch.get_num_threads()
    if match:
        torch.set_num_threads(int(match.group(1)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fast_tolerance(spread: Path, experiment: str, device: str, steps: int) -> float:
    """1.5 x the largest per-step |Δloss| measured over ``steps`` steps of ``experiment`` on ``device``."""
    why = f"cannot judge a fast-mode (non-deterministic) rerun of {experiment} without a measured spread"
    if not Path(spread).is_file():
        raise Refusal(f"{why}: {spread} does not exist (rerun a run made with --deterministic instead)")
    entry = json.loads(Path(spread).read_text()).get("experiments", {}).get(experiment)
    if not entry or entry.get("device") != device:
        raise Refusal(f"{why}: {spread} has none for {experiment} on {device}")
    measured = entry["max_abs_dloss"]
    if len(measured) < steps:
        raise Refusal(f"{why}: {spread} measured {len(measured)} steps of it, not {steps}")
    return TOLERANCE_FACTOR * max(measured[:steps])


def verify(
    study,
    recipe: str,
    seed: int,
    data_dir: Path,
    results: Path,
    steps: int | None = None,
    spread: Path | None = None,
    scratch: Path | None = None,
    progress: bool = False,
) -> Verdict:
    """Re-run the first ``steps`` steps (default: all) of the committed run under ``results`` and
    judge them; ``spread``: the measured spread file (default ``<results>/SPREAD``)."""
    name = f"{study.name}/{recipe}/seed{seed}"
    folder = run_dir(results, study.name, recipe, seed)
    run = CommittedRun.load(folder, name)
    total = int(run.done.get("steps") or 0)
    steps = total if steps is None else steps
    if not 1 <= steps <= total:
        raise Refusal(f"--steps {steps}: the committed run of {name} has {total} steps (give 1 to {total})")
    check_repeatable(study, recipe, seed, run, Path(data_dir), name)
    device = rerun_device(run.device, name)
    deterministic = repeats_bit_for_bit(run.device, run.done.get("deterministic"))
    tolerance = (
        None if deterministic else fast_tolerance(spread or Path(results) / SPREAD, study.name, run.device, steps)
    )
    check_cadence(run.telemetry, steps, study.experiment.train.telemetry_every, refresh_steps_of(study, recipe), name)
    with tempfile.TemporaryDirectory(prefix="fp4repro-verify-", dir=scratch) as tmp, recorded_threads(run.device):
        out = Path(tmp) / "run"
        train(
            study,
            recipe,
            Path(data_dir),
            out,
            seed=seed,
            device=device,
            progress=progress,
            stop_after=steps,
            deterministic=bool(run.done.get("deterministic")),
        )
        rerun = RunFolder(out, run.done["fingerprint"])
        metrics, telemetry = rerun.assemble("metrics", METRICS), rerun.assemble("telemetry", TELEMETRY)
    return judge(run, metrics, telemetry, steps, name, tolerance)


def check_cadence(telemetry: pd.DataFrame, steps: int, every: int, refreshes: frozenset[int], name: str) -> None:
    """Refuse a run whose telemetry was logged at other steps than ``telemetry_every`` (and
    ``telemetry_at_refresh``: ``refreshes``) log now (the cadence is outside the fingerprint: a
    changed one would read as a difference of every row)."""
    logged = set(telemetry.loc[telemetry["step"] < steps, "step"].astype(int))
    expected = {s for s in range(steps) if is_telemetry_step(s, every, refreshes)}
    if logged and logged != expected:
        odd = min(logged ^ expected)
        raise Refusal(
            f"{name}: the committed run logged telemetry at other steps than telemetry_every: {every}"
            f"{' with telemetry_at_refresh' if refreshes else ''} does (first at step {odd + 1}): set the cadence "
            "it was made with"
        )


def _equal(a: pd.Series, b: pd.Series) -> np.ndarray:
    """Row by row: the same value (NaN equal to NaN)."""
    x, y = a.to_numpy(), b.to_numpy()
    same = np.asarray(x == y, dtype=bool)
    if x.dtype.kind == "f" and y.dtype.kind == "f":
        same |= np.isnan(x) & np.isnan(y)
    return same


def _value(v):
    return v.item() if hasattr(v, "item") else v


def first_difference(committed: pd.DataFrame, rerun: pd.DataFrame, columns, table: str, offset: int):
    """(the first optimizer step at which the two tables differ, what differs there), or None.
    Rows are compared in their order; ``offset`` turns the table's step into the optimizer step
    (1 for telemetry, counted from 0)."""
    a, b = committed.reset_index(drop=True), rerun.reset_index(drop=True)
    n = min(len(a), len(b))
    aligned = a["step"].to_numpy()[:n] == b["step"].to_numpy()[:n]
    end = n if aligned.all() else int(np.argmin(aligned))  # the first row whose step is not the other's
    differs = np.zeros(end, dtype=bool)
    for column in columns:
        differs |= ~_equal(a[column][:end], b[column][:end])
    if differs.any():
        row = int(np.argmax(differs))
        where = f" {a['layer'][row]}.{a['operand'][row]}" if "layer" in a else ""
        changed = [c for c in columns if not _equal(a[c][row : row + 1], b[c][row : row + 1])[0]]
        more = f" (and {', '.join(changed[1:])})" if changed[1:] else ""
        return int(a["step"][row]) + offset, (
            f"{table}{where}: {changed[0]} {_value(a[changed[0]][row])!r} committed, "
            f"{_value(b[changed[0]][row])!r} rerun{more}"
        )
    if end == len(a) == len(b):
        return None
    steps = [int(t["step"][end]) for t in (a, b) if end < len(t)]
    step = min(steps)
    counts = [int((t["step"] == step).sum()) for t in (a, b)]
    return step + offset, f"{table}: {counts[0]} row(s) committed at that step, {counts[1]} rerun"


def judge(run: CommittedRun, metrics: pd.DataFrame, telemetry: pd.DataFrame, steps: int, name: str, tolerance):
    """The verdict on a rerun of ``steps`` steps: identical (``tolerance`` None), or every loss
    within ``tolerance`` and the rest as the module's docstring says."""
    committed_metrics = run.metrics[run.metrics["step"] <= steps]
    committed_telemetry = run.telemetry[run.telemetry["step"] < steps]
    metrics, telemetry = metrics[metrics["step"] <= steps], telemetry[telemetry["step"] < steps]
    metric_columns = [c for c in METRICS if c not in UNCOMPARED and c in committed_metrics]
    telemetry_columns = [c for c in TELEMETRY if c in committed_telemetry]
    if tolerance is not None:  # fast mode: the loss within the spread, telemetry rows there
        metric_columns = [c for c in metric_columns if c not in ("loss", "grad_norm")]
        telemetry_columns = ["step", "layer", "operand"]
    found = [
        d
        for d in (
            first_difference(committed_metrics, metrics, metric_columns, "metrics", 0),
            first_difference(committed_telemetry, telemetry, telemetry_columns, "telemetry", 1),
        )
        if d is not None
    ]
    rows = f"{len(committed_telemetry)} telemetry rows"
    if found:
        step, what = min(found)
        return Verdict(False, f"differs from step {step}: {steps}-step rerun of {name}: {what}")
    if tolerance is None:
        return Verdict(True, f"identical: {steps} steps of {name} (loss and {rows})")
    delta = np.abs(committed_metrics["loss"].to_numpy() - metrics["loss"].to_numpy())
    worst = int(np.argmax(delta))
    step = int(committed_metrics["step"].iloc[worst])
    if delta[worst] > tolerance:
        over = int(np.argmax(delta > tolerance))
        return Verdict(
            False,
            f"differs from step {int(committed_metrics['step'].iloc[over])}: {steps}-step fast-mode rerun of {name}: "
            f"|Δloss| {delta[over]:.3g} > tolerance {tolerance:.3g} (largest {delta[worst]:.3g} at step {step})",
        )
    return Verdict(
        True,
        f"within tolerance: {steps} steps of {name} (largest |Δloss| {delta[worst]:.3g} at step {step} ≤ "
        f"{tolerance:.3g}, {TOLERANCE_FACTOR} x the measured spread; {rows} present, their values not judged)",
    )
