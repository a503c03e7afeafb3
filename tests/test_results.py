"""The results layout's readers: a table with the right columns but values of the wrong type is
an error naming the file and the column (issue 42: a 49-line ValueError from `fp4repro plot loss`)."""

import subprocess
import sys

import pandas as pd
import pytest

from fp4repro.results import METRICS_COLUMNS, read_table, write_table


def _metrics(**columns) -> pd.DataFrame:
    table = pd.DataFrame({"step": [1, 2], "tokens": [256, 512], "stage": ["s1", "s1"], "loss": [3.5, 3.25]})
    return table.assign(**columns)


def test_a_column_of_text_where_numbers_belong_names_the_file_and_the_column(tmp_path):
    path = tmp_path / "metrics.parquet"
    write_table(path, _metrics(loss=["3.5", "high"]), {})
    with pytest.raises(
        ValueError, match=r"metrics\.parquet: column 'loss' holds \S+ values such as '3.5': expected numbers"
    ):
        read_table(path, METRICS_COLUMNS, "a training metrics table")


def test_numbers_where_names_belong_are_an_error_and_empty_or_categorical_columns_are_not(tmp_path):
    path = tmp_path / "metrics.parquet"
    write_table(path, _metrics(stage=[1, 2]), {})
    with pytest.raises(ValueError, match=r"column 'stage' holds int64 values such as 1: expected text"):
        read_table(path, METRICS_COLUMNS, "a training metrics table")
    write_table(path, _metrics(stage=pd.Categorical(["s1", "s2"])), {})
    assert read_table(path, METRICS_COLUMNS, "a training metrics table")["stage"].tolist() == ["s1", "s2"]
    write_table(path, pd.DataFrame(columns=list(METRICS_COLUMNS)), {})  # no rows: object columns
    assert read_table(path, METRICS_COLUMNS, "a training metrics table").empty


def test_plot_of_a_table_with_strings_in_it_is_one_line_and_exit_1(tmp_path):
    metrics = tmp_path / "results" / "x" / "train" / "bf16" / "seed0" / "metrics.parquet"
    write_table(metrics, _metrics(loss=["3.5", "3.25"]), {})
    proc = subprocess.run(
        [sys.executable, "-m", "fp4repro.cli", "plot", "loss", str(metrics), "--out", str(tmp_path / "loss.png")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"fp4repro plot: error: {metrics}: column 'loss' holds")
    assert not (tmp_path / "loss.png").exists()
