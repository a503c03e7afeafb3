"""`fp4repro verify` on the tiny model (CPU runs are deterministic: a rerun is identical), what it
catches (a changed step of data, a changed logged row) and what it refuses before any compute."""

import dataclasses
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from fp4repro.cli import main
from fp4repro.config.study import load_study
from fp4repro.results import run_dir, table_provenance, write_table
from fp4repro.train import train
from fp4repro.train.verify import CommittedRun, Refusal, check_cadence, fast_tolerance, judge

NAME, RECIPE = "verified", "ue5m3_torch_gemm"  # FP32 GEMMs: the quickest recipe with telemetry on a CPU


def _experiment(guarded_file) -> str:
    """The guarded study (conftest.py) on its data, as 8 steps of 32 tokens, telemetry at every step."""
    return (
        guarded_file.read_text()
        .replace("name: guarded", f"name: {NAME}")
        .replace("recipes: [bf16]", f"recipes: [{RECIPE}]")
        .replace("tokens: 12800", "tokens: 256")
        .replace("checkpoints: 4", "checkpoints: 2")
        .replace("resume_every: 5", "resume_every: 4")
    )


@pytest.fixture(scope="module")
def committed(guarded, tmp_path_factory):
    """(the experiment file, the data folder, the results root holding its finished run of seed 0)."""
    guarded_file, data = guarded
    root = tmp_path_factory.mktemp("verify")
    path = root / f"{NAME}.yaml"
    path.write_text(_experiment(guarded_file))
    results = root / "results"
    train(load_study(path), RECIPE, data, run_dir(results, NAME, RECIPE, 0), device="cpu", progress=False)
    return path, data, results


def _copy(results, tmp_path):
    """A copy of the committed results to change (the module's run stays as it was)."""
    return shutil.copytree(results, tmp_path / "results")


def _verify(path, data, results, *extra) -> list[str]:
    return ["verify", "--experiment", str(path), "--recipe", RECIPE, "--data", str(data), "--results", str(results)] + [
        "--quiet",
        *extra,
    ]


def _files(folder) -> dict:
    return {p: p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def test_a_cpu_run_verifies_identical_and_its_folder_is_only_read(committed, capsys):
    path, data, results = committed
    folder = run_dir(results, NAME, RECIPE, 0)
    before = _files(folder)
    assert main(_verify(path, data, results)) == 0
    line = capsys.readouterr().out.strip()
    rows = len(pd.read_parquet(folder / "telemetry.parquet"))
    assert rows > 0 and line == f"identical: 8 steps of {NAME}/{RECIPE}/seed0 (loss and {rows} telemetry rows)"
    assert _files(folder) == before


def test_one_changed_step_of_data_is_caught_at_that_step(committed, capsys, monkeypatch):
    from fp4repro.train.engine import ReferenceEngine

    path, data, results = committed
    step = ReferenceEngine.step

    def perturbed(self, index, batch):  # the fourth step trains on its batch shifted by one token
        return step(self, index, batch.roll(1, dims=-1) if index == 3 else batch)

    monkeypatch.setattr(ReferenceEngine, "step", perturbed)
    assert main(_verify(path, data, results, "--steps", "5")) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"differs from step 4: 5-step rerun of {NAME}/{RECIPE}/seed0: metrics: loss "), line


def test_one_changed_telemetry_row_of_the_committed_run_is_caught_at_its_step(committed, tmp_path, capsys):
    path, data, results = committed
    results = _copy(results, tmp_path)
    table = run_dir(results, NAME, RECIPE, 0) / "telemetry.parquet"
    t = pd.read_parquet(table)
    row = t.index[t["step"] == 1][3]
    t.loc[row, "sq_error"] *= 1 + 2**-40
    write_table(table, t, table_provenance(table))
    assert main(_verify(path, data, results, "--steps", "3")) == 1
    line = capsys.readouterr().out.strip()
    where = f"{t.loc[row, 'layer']}.{t.loc[row, 'operand']}"
    assert line.startswith(f"differs from step 2: 3-step rerun of {NAME}/{RECIPE}/seed0: telemetry {where}: sq_error ")


# ---- the comparison, on the committed tables themselves (no compute) ------------------------------


def _run(committed) -> CommittedRun:
    _, _, results = committed
    return CommittedRun.load(run_dir(results, NAME, RECIPE, 0), "run")


def test_judge_names_the_first_differing_step_and_column(committed):
    run = _run(committed)
    m, t = run.metrics.copy(), run.telemetry.copy()
    assert judge(run, m, t, 8, "run", None).identical
    m.loc[m["step"] == 6, "grad_norm"] += 1e-9
    m.loc[m["step"] == 7, "loss"] += 1e-9
    verdict = judge(run, m, t, 8, "run", None)
    assert not verdict.identical and verdict.line.startswith(
        "differs from step 6: 8-step rerun of run: metrics: grad_norm "
    )
    assert judge(run, m, t, 5, "run", None).identical  # the steps after N are not compared
    t.loc[t.index[t["step"] == 2][0], "target"] = 1.0  # telemetry's step 2 is optimizer step 3
    assert judge(run, m, t, 8, "run", None).line.startswith("differs from step 3: 8-step rerun of run: telemetry ")
    fewer = run.telemetry[run.telemetry.index != run.telemetry.index[run.telemetry["step"] == 4][-1]]
    line = judge(run, run.metrics, fewer, 8, "run", None).line
    assert line.startswith("differs from step 5: ") and "row(s) committed at that step" in line
    # NaN (a target not recorded) equals NaN
    unset = run.telemetry.assign(target=np.nan)
    assert judge(dataclasses.replace(run, telemetry=unset), run.metrics, unset.copy(), 8, "run", None).identical
    # how a step was computed is not compared: its time, its process
    timed = run.metrics.assign(tokens_per_s=1.0, attempt=3)
    assert judge(run, timed, run.telemetry, 8, "run", None).identical


def test_a_fast_mode_rerun_is_judged_by_the_measured_spread(committed, tmp_path):
    run = _run(committed)
    spread = tmp_path / "spread.json"
    with pytest.raises(Refusal, match="without a measured spread: .*spread.json does not exist"):
        fast_tolerance(spread, NAME, "NVIDIA H200", 8)
    spread.write_text(json.dumps({"experiments": {NAME: {"device": "NVIDIA H200", "max_abs_dloss": [0, 0.01, 0.02]}}}))
    assert fast_tolerance(spread, NAME, "NVIDIA H200", 2) == pytest.approx(0.015)
    with pytest.raises(Refusal, match="measured 3 steps of it, not 4"):
        fast_tolerance(spread, NAME, "NVIDIA H200", 4)
    with pytest.raises(Refusal, match="has none for verified on NVIDIA B200"):
        fast_tolerance(spread, NAME, "NVIDIA B200", 2)
    m, t = run.metrics.copy(), run.telemetry.copy()
    m["loss"] += np.where(m["step"] == 3, 0.01, 0.0)
    m["grad_norm"] += 1.0  # not judged in fast mode, nor telemetry's values
    t["sq_error"] += 1.0
    within = judge(run, m, t, 8, "run", 0.015)
    assert within.identical and within.line.startswith(
        "within tolerance: 8 steps of run (largest |Δloss| 0.01 at step 3"
    )
    outside = judge(run, m, t, 8, "run", 0.005)
    assert not outside.identical and outside.line.startswith("differs from step 3: 8-step fast-mode rerun of run: ")
    assert not judge(run, m, t[t["step"] != 5], 8, "run", 0.015).identical  # rows still counted


def test_a_changed_telemetry_cadence_is_refused():
    t = pd.DataFrame({"step": [0, 0, 3, 6]})
    check_cadence(t, 8, 3, frozenset(), "run")
    with pytest.raises(Refusal, match=r"telemetry_every: 2 does \(first at step 3\)"):
        check_cadence(t, 8, 2, frozenset(), "run")
    # with telemetry at every sample of a 5-step amax hold: steps 0, 3, 5, 6 (and 9, 10, ... later)
    at_refresh = pd.DataFrame({"step": [0, 3, 5, 6, 9, 10]})
    check_cadence(at_refresh, 11, 3, frozenset({5}), "run")
    with pytest.raises(Refusal, match=r"telemetry_every: 3 with telemetry_at_refresh does \(first at step 6\)"):
        check_cadence(at_refresh[at_refresh["step"] != 5], 11, 3, frozenset({5}), "run")


# ---- refusals: one line, exit code 2, nothing computed --------------------------------------------


@pytest.fixture
def no_compute(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a refused verify trained")

    monkeypatch.setattr("fp4repro.train.verify.train", refuse)


def _refused(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def _edit_done(results, **changes):
    path = run_dir(results, NAME, RECIPE, 0) / "done.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_missing_run_is_refused(committed, tmp_path, capsys, no_compute):
    path, data, results = committed
    err = _refused(_verify(path, data, results, "--seed", "1"), capsys)
    assert err.startswith(f"fp4repro verify: error: no committed run of {NAME}/{RECIPE}/seed1 in ")
    assert "missing done.json, metrics.parquet, telemetry.parquet" in err
    err = _refused(_verify(path, data, results, "--steps", "9"), capsys)
    assert "has 8 steps (give 1 to 8)" in err


def test_a_corpus_of_another_digest_is_refused(committed, tmp_path, capsys, no_compute):
    path, data, results = committed
    results = _copy(results, tmp_path)
    table = run_dir(results, NAME, RECIPE, 0) / "metrics.parquet"
    write_table(table, pd.read_parquet(table), {**table_provenance(table), "data": "c0ffee"})
    err = _refused(_verify(path, data, results), capsys)
    assert "the corpus digest differs: the committed run trained on c0ffee, " in err


def test_other_numerics_are_refused(committed, tmp_path, capsys, no_compute):
    path, data, results = committed
    results = _copy(results, tmp_path)
    _edit_done(results, run_numerics="0123456789abcdef")
    err = _refused(_verify(path, data, results), capsys)
    assert "the run numerics fingerprint differs: the committed run computed with 0123456789abcdef, " in err
    done_path = run_dir(results, NAME, RECIPE, 0) / "done.json"
    done = json.loads(done_path.read_text())
    del done["numerics"]  # a run made before numerics were recorded
    done_path.write_text(json.dumps(done))
    err = _refused(_verify(path, data, results), capsys)
    assert "the numerics fingerprint differs: the committed run computed with v1 (before" in err


def test_a_config_of_another_run_fingerprint_is_refused_naming_the_field(committed, tmp_path, capsys, no_compute):
    path, data, results = committed
    changed = tmp_path / f"{NAME}.yaml"
    changed.write_text(path.read_text().replace("seq_len: 16", "seq_len: 16\n  lr: 1.0e-3"))
    err = _refused(_verify(changed, data, results), capsys)
    assert "the run fingerprint differs: the committed run is " in err and "(train.lr differ)" in err


def test_a_rerun_is_on_the_recorded_device_and_threads():
    import torch

    from fp4repro.train.verify import recorded_threads, rerun_device

    assert rerun_device("cpu (x86_64, 2 threads)", "run") == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(Refusal, match="run: made on NVIDIA H200, this machine has no CUDA device"):
            rerun_device("NVIDIA H200", "run")
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with recorded_threads(f"cpu (x86_64, {other} thread{'s' if other > 1 else ''})"):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
