"""The files of the results layout: written with their provenance, read back checked (the
plots, the report and a resumed evaluation read the same files):

    results/<experiment>/train/<recipe>/{metrics.parquet, telemetry.parquet, done.json}
    results/<experiment>/eval/<recipe>/{nll.parquet, downstream.parquet, final_loss.json}

Every table and JSON result carries a provenance record (``fp4repro.provenance``): in a JSON
object under the key ``provenance``, in a parquet file as the schema metadata key
``fp4repro.provenance``. A missing file, a file that is not parquet or JSON, or a missing column
or key raises the caller's ``error`` class with the file's path and what it should have been.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from fp4repro.util import atomic_path, atomic_write_json

PROVENANCE_KEY = "fp4repro.provenance"

# Columns each table must have for its readers (the plots, the report, a resumed evaluation).
# The training tables have more (train/loop.py ``_write_tables``); the evaluation tables are
# exactly these, in this order (eval/run.py writes them).
METRICS_COLUMNS = ("step", "tokens", "stage", "loss")
TELEMETRY_COLUMNS = ("step", "layer", "operand", "blocks", "saturated_blocks", "underflow_blocks")
NLL_COLUMNS = ("recipe", "step", "tokens", "policy", "source", "nll", "tokens_evaluated")
DOWNSTREAM_COLUMNS = ("recipe", "step", "tokens", "policy", "aggregate", "task", "level", "metric", "value", "stderr",
                      "n")
FINAL_LOSS_KEYS = ("final_window", "loss", "tokens_from", "tokens_to")
# the telemetry column counting the blocks with each event
EVENT_COLUMNS = {"underflow": "underflow_blocks", "saturation": "saturated_blocks"}


def write_table(path: Path, table: pd.DataFrame, provenance: dict) -> None:
    """``table`` as parquet at ``path`` (atomically, no index) with ``provenance`` in its metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = pa.Table.from_pandas(table, preserve_index=False)
    metadata = {**(arrow.schema.metadata or {}), PROVENANCE_KEY.encode(): json.dumps(provenance).encode()}
    with atomic_path(path) as tmp:
        pq.write_table(arrow.replace_schema_metadata(metadata), tmp)


def table_provenance(path: Path) -> dict | None:
    """The provenance record of a parquet table written by ``write_table`` (None if it has none)."""
    import pyarrow.parquet as pq

    metadata = pq.read_schema(path).metadata or {}
    raw = metadata.get(PROVENANCE_KEY.encode())
    return json.loads(raw) if raw is not None else None


def write_json(path: Path, obj: dict, provenance: dict) -> None:
    """``obj`` as indented JSON at ``path`` (atomically), with ``provenance`` under its key."""
    atomic_write_json(path, {**obj, "provenance": provenance})


def check_exists(path: Path, error: type[Exception] = ValueError) -> Path:
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: no such file")
    return path


def read_table(path: Path, columns, what: str, error: type[Exception] = ValueError) -> pd.DataFrame:
    """A parquet table that must have ``columns``."""
    path = check_exists(path, error)
    try:
        df = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several types for a file that is not parquet
        raise error(f"{path}: not a readable parquet file ({what}): {err}") from err
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise error(f"{path}: missing column(s) {', '.join(missing)}: expected {what} with columns "
                    f"{', '.join(columns)} (has {', '.join(map(str, df.columns)) or 'none'})")
    return df


def read_json(path: Path, keys, what: str, error: type[Exception] = ValueError) -> dict:
    """A JSON object that must have ``keys``."""
    path = check_exists(path, error)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise error(f"{path}: not valid JSON ({what}): {err}") from err
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise error(f"{path}: missing key(s) {', '.join(missing)}: expected {what}")
    return data


def last_checkpoint(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """The rows of each ``by`` group's last evaluated checkpoint (largest step)."""
    if not by:
        return df[df["step"] == df["step"].max()]
    return df[df["step"] == df.groupby(by)["step"].transform("max")]


def block_rates(telemetry: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Blocks and blocks with each event (``EVENT_COLUMNS``) summed over everything not in ``by``
    (over all rows when ``by`` is empty), and each event's rate: events / blocks (NaN without
    blocks)."""
    counts = ["blocks", *EVENT_COLUMNS.values()]
    if by:
        sums = telemetry.groupby(by, sort=False)[counts].sum().reset_index()
    else:
        sums = telemetry[counts].sum().to_frame().T
    blocks = sums["blocks"].where(sums["blocks"] > 0)
    return sums.assign(**{event: sums[column] / blocks for event, column in EVENT_COLUMNS.items()})
