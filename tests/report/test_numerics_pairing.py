"""The report pairs only runs computed with the same numerics (fp4repro.config.numerics)."""

from __future__ import annotations

import pandas as pd
from synthetic_runs import rows_of, write_run

from fp4repro.results import run_dir, table_provenance, write_table


def test_the_report_does_not_pair_runs_of_different_numerics(tmp_path):
    results = tmp_path / "results"
    write_run(results, "nvfp4", 0)
    write_run(results, "ue5m3", 0, loss=-0.1)
    for recipe, value in (("nvfp4", "v2-digest"), ("ue5m3", "v2-digest")):
        path = run_dir(results, "tiny", recipe, 0) / "metrics.parquet"
        write_table(path, pd.read_parquet(path), {**(table_provenance(path) or {}), "numerics": value})
    assert rows_of("final_loss", results)[0].measured
    path = run_dir(results, "tiny", "ue5m3", 0) / "metrics.parquet"
    write_table(path, pd.read_parquet(path), {**(table_provenance(path) or {}), "numerics": "another"})
    row = rows_of("final_loss", results)[0]
    assert row.note.startswith("not paired: the runs were computed with different numerics")
    assert "nvfp4 seed 0: v2-digest" in row.note and "ue5m3 seed 0: another" in row.note
