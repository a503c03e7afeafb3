"""The files of the results layout: written with their provenance, read back checked (the
plots, the report and a resumed evaluation read the same files). One run per recipe and seed:

    results/<experiment>/train/<recipe>/seed<seed>/{metrics.parquet, telemetry.parquet, done.json}
    results/<experiment>/eval/<recipe>/seed<seed>/{nll.parquet, nll_documents.parquet,
                                                   downstream.parquet, downstream_items.parquet,
                                                   final_loss.json}

Every table and JSON result carries a provenance record (``fp4repro.provenance``): in a JSON
object under the key ``provenance``, in a parquet file as the schema metadata key
``fp4repro.provenance``. A missing file, a file that is not parquet or JSON, or a missing column
or key raises the caller's ``error`` class with the file's path and what it should have been.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from fp4repro.util import atomic_path, atomic_write_json

PROVENANCE_KEY = "fp4repro.provenance"
SEED_FOLDER = re.compile(r"^seed(\d+)$")


#: the measured run-to-run spread of fast-mode GPU runs, under the results root (written by
#: scripts/spread.py; read by ``fp4repro verify`` and the report):
#: {"experiments": {<experiment>: {"device": <GPU name>, "pairs": n, "steps": n, "max_abs_dloss": [the
#: largest |Δloss| over the measured pairs of same-seed runs at step 1, 2, ...]}}}
SPREAD = Path("bench/determinism/spread.json")


def repeats_bit_for_bit(device: str, deterministic: bool | None) -> bool:
    """Whether a run repeats bit for bit: every CPU run (``device`` as provenance records it,
    ``cpu (...)``) and every GPU run made with ``--deterministic`` (done.json's ``deterministic``)."""
    return device.startswith("cpu") or bool(deterministic)


def run_dir(results: Path, experiment: str, recipe: str, seed: int) -> Path:
    """The training run of one recipe and seed."""
    return Path(results) / experiment / "train" / recipe / f"seed{seed}"


def eval_dir(results: Path, experiment: str, recipe: str, seed: int) -> Path:
    """The evaluation of that run."""
    return Path(results) / experiment / "eval" / recipe / f"seed{seed}"


def study_runs(study, results: str | Path = "results") -> dict[str, tuple[int, ...]]:
    """The runs (recipe -> seeds) that the workflow plans and the report reads: every recipe of
    ``study`` with its seeds, or, for an imported experiment (runs made elsewhere, committed a few
    at a time), those whose training and evaluation tables are under ``results``; a recipe with none
    is left out.
    ``fp4repro inventory`` lists the rest as missing, and so does the report."""
    planned = study.runs
    if not study.experiment.imported:
        return planned

    def there(recipe, seed):  # trained and evaluated (a missing table beyond these is named by the DAG)
        return (run_dir(results, study.name, recipe, seed) / "metrics.parquet").is_file() and (
            eval_dir(results, study.name, recipe, seed) / "final_loss.json"
        ).is_file()

    present = {recipe: tuple(s for s in seeds if there(recipe, s)) for recipe, seeds in planned.items()}
    return {recipe: seeds for recipe, seeds in present.items() if seeds}


def unstudied_recipes(results: str | Path, experiment: str, recipes) -> list[str]:
    """The recipes outside ``recipes`` with a run under ``results/<experiment>/`` (a folder
    ``train/<recipe>/seed<s>/`` with its done.json, or ``eval/<recipe>/seed<s>/`` with its
    final_loss.json), sorted: runs that a study without them leaves out of its figures and report."""
    found = {
        folder.parent.parent.name
        for kind, name in (("train", "done.json"), ("eval", "final_loss.json"))
        for folder in Path(results, experiment, kind).glob(f"*/seed*/{name}")
        if SEED_FOLDER.match(folder.parent.name)
    }
    return sorted(found - set(recipes))


def run_of(path: Path) -> tuple[str, int] | None:
    """(recipe, seed) of a file in a run's or an evaluation's folder (``.../<recipe>/seed<seed>/file``),
    or None when the path does not follow the layout."""
    parts = Path(path).resolve().parts
    match = SEED_FOLDER.match(parts[-2]) if len(parts) >= 3 else None
    return (parts[-3], int(match.group(1))) if match else None


def experiment_of(path: Path) -> str | None:
    """``<experiment>`` of results/<experiment>/<train|eval>/<recipe>/seed<seed>/<file>, or None."""
    parts = Path(path).resolve().parts
    if len(parts) >= 5 and parts[-4] in ("train", "eval") and SEED_FOLDER.match(parts[-2]):
        return parts[-5]
    return None


# Columns each table must have for its readers (the plots, the report, a resumed evaluation).
# The training tables have more (train/loop.py ``_write_tables``); the evaluation tables are
# exactly these, in this order (eval/run.py writes them).
METRICS_COLUMNS = ("step", "tokens", "stage", "loss")
TELEMETRY_COLUMNS = (
    "step",
    "layer",
    "operand",
    "steps_since_refresh",
    "blocks",
    "saturated_blocks",
    "underflow_blocks",
    "nonzero_elements",
    "clipped_elements",
)
NLL_COLUMNS = ("recipe", "seed", "step", "tokens", "policy", "source", "nll", "tokens_evaluated")
# per held-out document: summed NLL (nats) over its predicted tokens, for paired bootstraps
NLL_DOCUMENT_COLUMNS = ("recipe", "seed", "step", "tokens", "policy", "source", "document", "nll_sum", "predicted")
DOWNSTREAM_COLUMNS = (
    "recipe",
    "seed",
    "step",
    "tokens",
    "policy",
    "aggregate",
    "task",
    "level",
    "metric",
    "value",
    "stderr",
    "n",
)
DOWNSTREAM_ITEM_COLUMNS = (
    "recipe",
    "seed",
    "step",
    "tokens",
    "policy",
    "aggregate",
    "task",
    "doc_id",
    "metric",
    "value",
)
# the column of the evaluation tables above with the order of the forwards that gave each row
# (``fp4repro.eval.order``: the cold replay's results depend on it); optional for readers: tables
# written before it lack it ("not recorded")
ORDER_COLUMN = "order"
# where an evaluation process's time went (fp4repro evaluate writes it beside its tables)
EVAL_SECONDS_FILE = "seconds.json"
# the column of downstream_items with each item's held-out source document (its index in the
# source's test split: items cut from one document are not independent); optional for readers:
# tables written before it lack it (``NO_DOCUMENT``)
DOCUMENT_COLUMN = "document"
NO_DOCUMENT = -1
FINAL_LOSS_KEYS = ("final_window", "loss", "tokens_from", "tokens_to")
# each telemetry event: (the column counting it, the column counting the units it can happen to)
EVENTS = {
    "underflow": ("underflow_blocks", "blocks"),
    "saturation": ("saturated_blocks", "blocks"),
    "clipping": ("clipped_elements", "nonzero_elements"),
}
# the GEMM operands by what they quantize (the target-T figure and the report's automatic-T section)
OPERAND_CLASSES = {
    "activations": ("fprop.x", "wgrad.x"),
    "weights": ("fprop.w", "dgrad.w"),
    "gradients": ("dgrad.dy", "wgrad.dy"),
}


def after_initialization(telemetry: pd.DataFrame) -> pd.DataFrame:
    """The rows of a telemetry table after step 0: step 0's amax is the initial weights', not one of
    training, so it is no "fresh" sample of a held amax (the report and the figures leave it out)."""
    return telemetry[telemetry["step"] > 0]


def with_operand_class(telemetry: pd.DataFrame) -> pd.DataFrame:
    """A telemetry table with an ``operand_class`` column (``OPERAND_CLASSES``; NaN for others)."""
    of = {op: name for name, ops in OPERAND_CLASSES.items() for op in ops}
    return telemetry.assign(operand_class=telemetry["operand"].map(of))


# the column of a telemetry table with the target T each quantization used (NaN: no tensor scale);
# optional for readers: tables written before the automatic target lack it ("not recorded")
TARGET_COLUMN = "target"


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


# The columns of the tables above that hold names (of a stage, a layer, an operand, a recipe, ...);
# every other column of them holds numbers.
TEXT_COLUMNS = frozenset(
    {"stage", "layer", "operand", "recipe", "policy", "source", "aggregate", "task", "level", "metric", ORDER_COLUMN}
)


def column_problem(table: pd.DataFrame, column: str) -> str | None:
    """What is wrong with the type of ``column`` (anything but numbers in a column of numbers, or
    numbers in a column of names: parquet may give names as categoricals or bytes), or None; an
    empty column is of either type."""
    values = table[column].dropna()
    numbers = pd.api.types.is_numeric_dtype(values)
    text = column in TEXT_COLUMNS
    if values.empty or numbers != text:
        return None
    expected = "text" if text else "numbers"
    return f"column '{column}' holds {values.dtype} values such as {values.tolist()[0]!r}: expected {expected}"


def read_table(path: Path, columns, what: str, error: type[Exception] = ValueError) -> pd.DataFrame:
    """A parquet table that must have ``columns``, each holding numbers or, in ``TEXT_COLUMNS``, text."""
    path = check_exists(path, error)
    try:
        df = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several types for a file that is not parquet
        raise error(f"{path}: not a readable parquet file ({what}): {err}") from err
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise error(
            f"{path}: missing column(s) {', '.join(missing)}: expected {what} with columns "
            f"{', '.join(columns)} (has {', '.join(map(str, df.columns)) or 'none'})"
        )
    # those the reader asks for, and the optional ones it may read (``TARGET_COLUMN``, ``ORDER_COLUMN``,
    # ``DOCUMENT_COLUMN``)
    for column in df.columns:
        if problem := column_problem(df, column):
            raise error(f"{path}: {problem} ({what})")
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


THROUGHPUT_WHAT = "a body-throughput results file (fp4repro bench throughput)"
# the paper's throughput ablation, in the order a throughput file's recipes are shown; always timed
THROUGHPUT_ABLATION = ("bf16", "nvfp4", "nvfp4_no_rht", "nvfp4_no_bf16_tail", "nvfp4_no_rht_no_bf16_tail", "ue5m3")


def throughput_files(folder: Path) -> list[Path]:
    """The body-throughput files in ``folder`` (``throughput_<device>.json``; none where the folder
    does not exist: nothing was measured), in name order."""
    return sorted(Path(folder).glob("throughput_*.json"))


def throughput_key(entry: dict) -> str:
    """The key of a body-throughput entry in its file: its model and shape, "small 1x2048" (a model
    is measured at several shapes: the paper's 1 x 1,024 tokens beside training's 1 x 8,192)."""
    return f"{entry['model']} {entry['batch']}x{entry['seq_len']}"


def components_key(entry: dict) -> str:
    """The key of a body-components entry in its file: its model and token count, "small 2048
    tokens" (its GEMM and quantization shapes follow the tokens alone)."""
    return f"{entry['model']} {entry['tokens']} tokens"


def shape_text(entry: dict) -> str:
    """A body-throughput entry's shape as the tables and the report say it: "1 x 8,192 tokens"."""
    return f"{entry['batch']} x {entry['seq_len']:,} tokens"


def read_throughput(path: Path, error: type[Exception] = ValueError) -> dict:
    """``throughput_key`` -> its entry of a body-throughput results file (``{"shapes": {key:
    entry}}``), each entry checked to hold its model, shape and columns of timed recipes and
    effects. A file written when entries were filed under their model alone is read under the same
    keys, so that a new measurement of the same model and shape replaces its entry."""
    shapes = read_json(path, ("shapes",), THROUGHPUT_WHAT, error)["shapes"]
    if not isinstance(shapes, dict):
        raise error(f"{path}: shapes: expected one entry per model and shape ({THROUGHPUT_WHAT})")
    for key, entry in shapes.items():
        columns = entry.get("columns") if isinstance(entry, dict) else None
        if not isinstance(columns, dict) or not all(
            isinstance(c, dict) and {"recipes", "effects"} <= set(c) for c in columns.values()
        ):
            raise error(f"{path}: shapes.{key}: expected columns, each with recipes and effects ({THROUGHPUT_WHAT})")
        if not {"model", "batch", "seq_len"} <= set(entry):
            raise error(f"{path}: shapes.{key}: expected its model, batch and seq_len ({THROUGHPUT_WHAT})")
    return {throughput_key(entry): entry for entry in shapes.values()}


COMPONENTS_WHAT = "a body-components file (fp4repro bench components)"


def read_components(path: Path, error: type[Exception] = ValueError) -> dict:
    """``components_key`` -> its entry of a body-components file (``{"shapes": {key: entry}}``),
    each entry checked to hold its model, its timed GEMMs and quantizations; read under those keys
    whatever the file filed them under (as ``read_throughput``)."""
    shapes = read_json(path, ("shapes",), COMPONENTS_WHAT, error)["shapes"]
    if not isinstance(shapes, dict) or not all(
        isinstance(e, dict) and {"model", "gemms", "quantizations", "tokens", "device"} <= set(e)
        for e in shapes.values()
    ):
        raise error(
            f"{path}: shapes: expected one entry per model and token count with model, gemms, quantizations, "
            f"tokens and device ({COMPONENTS_WHAT})"
        )
    return {components_key(entry): entry for entry in shapes.values()}


def record_shapes(out: Path, entry: dict, reader, key, provenance: dict, error: type[Exception]) -> dict:
    """File ``entry`` under ``key(entry)`` in the JSON at ``out`` (``{"shapes": {key: entry}}``,
    read by ``reader``), keeping the other entries; written atomically. Returns the whole file's
    content."""
    shapes = reader(out, error) if Path(out).is_file() else {}
    content = {"shapes": {**shapes, key(entry): entry}}
    write_json(out, content, provenance)
    return content


def column_timing(measured: dict) -> str:
    """How a measured column of a body-throughput entry timed its steps: ``cuda_graph`` (replays
    of each recipe's captured step) or ``eager`` (also every record made before replays existed)."""
    return measured.get("timing", "eager")


def gpu_idle(row: dict) -> float | None:
    """The share of a recipe's median step (a row of a measured column) that the GPU spent idle:
    1 − the kernel time of its profiled step (``kernels.kernel_ms``) over the median; None without
    a profile."""
    kernel_ms = row.get("kernels", {}).get("kernel_ms")
    return 1 - kernel_ms / row["median_ms"] if kernel_ms else None


def void_column(column: str, measured: dict) -> str | None:
    """Why a measured column of a body-throughput entry cannot be used, or None: an FP8-analogue
    column without its ``cast`` record was made before the cast clamped, when torch's cast (before
    2.12) turned operands beyond ±448 into NaN."""
    if column == "fp8_analogue" and "cast" not in measured:
        return (
            "void: made before the FP8 cast clamped (torch < 2.12 casts values beyond ±448 to NaN, so the "
            "analogue multiplied NaNs); measure again"
        )
    return None


def last_checkpoint(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """The rows of each ``by`` group's last evaluated checkpoint (largest step)."""
    if not by:
        return df[df["step"] == df["step"].max()]
    return df[df["step"] == df.groupby(by)["step"].transform("max")]


def event_rates(telemetry: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Each event's count and units (``EVENTS``) summed over everything not in ``by`` (over all
    rows when ``by`` is empty), and its rate: count / units (NaN without units)."""
    counts = list(dict.fromkeys(c for pair in EVENTS.values() for c in pair))
    if by:
        sums = telemetry.groupby(by, sort=False)[counts].sum().reset_index()
    else:
        sums = telemetry[counts].sum().to_frame().T
    return sums.assign(
        **{event: sums[count] / sums[units].where(sums[units] > 0) for event, (count, units) in EVENTS.items()}
    )
