"""End-to-end training on real text (a few standard-library modules), exact resume after SIGKILL."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fp4repro.cli import main
from fp4repro.config.study import load_study
from fp4repro.data import load_manifest
from fp4repro.data.integrity import token_digests
from fp4repro.data.prepare import tokens_hash
from fp4repro.results import run_dir, table_provenance
from fp4repro.train import list_runs, train
from fp4repro.train.checkpoint import load_checkpoint, resume_checkpoints
from fp4repro.train.loop import TELEMETRY
from fp4repro.train.runs import run_fingerprint

STDLIB = sysconfig.get_paths()["stdlib"]
EXPERIMENT = f"""name: smalltest
model: tiny
recipes: [bf16, nvfp4, ue5m3]
data:
  sources:
    prose: {{kind: text, paths: ["{STDLIB}/json/*.py", "{STDLIB}/textwrap.py"]}}
    code: {{kind: text, paths: ["{STDLIB}/email/*.py"]}}
  tokenizer: {{vocab_size: 2048}}
  split: {{valid: 0.1, test: 0.1}}
train:
  seq_len: 64
  batch_size: 4
  lr: 3.0e-3
  checkpoints: 12
  telemetry_every: 1
  resume_every: 10
  stages:
    - {{name: s1, tokens: 10240, blend: {{prose: 0.7, code: 0.3}}}}
    - {{name: s2, tokens: 5120, blend: {{prose: 0.4, code: 0.6}}}}
"""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from fp4repro.data import prepare_data

    root = tmp_path_factory.mktemp("train")
    path = root / "smalltest.yaml"
    path.write_text(EXPERIMENT)
    study = load_study(path)
    prepare_data(study.experiment, root / "data", progress=False)
    return study, path, root


def _cli(path, recipe, root, out, *extra):
    return [
        sys.executable,
        "-m",
        "fp4repro.cli",
        "train",
        "--experiment",
        str(path),
        "--recipe",
        recipe,
        "--data",
        str(root / "data"),
        "--out",
        str(out),
        "--quiet",
        "--device",
        "cpu",
        *extra,
    ]


def _run_folder(out) -> Path:
    (run,) = list_runs(out)
    return run


@pytest.mark.slow
def test_resume_after_sigkill_is_bit_exact(prepared):
    """Kill a run right after its step-10 resume checkpoint: the second process resumes from the
    newest checkpoint on disk, runs only the steps after it, and ends bit for bit like an
    uninterrupted run. Without resume/ the same command starts over (and says so)."""
    _, path, root = prepared
    # half the steps of the module's experiment (the same data): a kill after step 10 of 30
    path = root / "sigkill.yaml"
    path.write_text(
        EXPERIMENT.replace("name: smalltest", "name: sigkill")
        .replace("tokens: 5120,", "tokens: 2560,")
        .replace("tokens: 10240,", "tokens: 5120,")
    )
    study = load_study(path)
    # The uninterrupted run goes on beside the killed run and its resumption, so that the test takes
    # the time of one run, not of two: one thread each, two processes on two cores (every process
    # computes with the same number of threads, as their losses are compared bit for bit).
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full = root / "full"
    uninterrupted = subprocess.Popen(_cli(path, "ue5m3", root, full), env=env)
    try:
        killed = root / "killed"
        proc = subprocess.Popen(_cli(path, "ue5m3", root, killed), env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while (
            proc.poll() is None
            and time.time() < deadline
            and not any(killed.glob("runs/*/resume/resume_00000010.pt.sha256"))
        ):
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not (killed / "done.json").exists(), "the run finished before it could be killed"
        run = _run_folder(killed)
        complete = [
            int(p.name[7:15])
            for p in resume_checkpoints(run.resume)  # resume_<step>.pt
            if p.with_name(p.name + ".sha256").is_file()
        ]  # with its digest
        second = subprocess.run(_cli(path, "ue5m3", root, killed), check=True, env=env, capture_output=True, text=True)
        assert uninterrupted.wait(timeout=300) == 0
    finally:
        uninterrupted.kill()
    newest = int(re.search(r"resuming from step (\d+) of 30", second.stderr).group(1))
    assert newest == max(complete) and newest >= 10  # the newest checkpoint that was complete
    a = pd.read_parquet(full / "metrics.parquet")
    b = pd.read_parquet(killed / "metrics.parquet")
    assert len(a) == study.experiment.train.total_steps == 30
    assert b["step"].tolist() == list(range(1, 31))
    # steps 1..newest come from the killed process, only the later ones were computed again
    assert (b["attempt"] == (b["step"] > newest).astype(int)).all()
    assert np.array_equal(a["loss"].to_numpy(), b["loss"].to_numpy())  # bit for bit
    assert np.array_equal(a["grad_norm"].to_numpy(), b["grad_norm"].to_numpy())
    ta, tb = pd.read_parquet(full / "telemetry.parquet"), pd.read_parquet(killed / "telemetry.parquet")
    assert ta.equals(tb)

    # the same command without resume/ starts again from step 0 (its first 5 steps: the same losses)
    shutil.rmtree(run.resume)
    (killed / "done.json").unlink()
    third = subprocess.run(
        _cli(path, "ue5m3", root, killed, "--stop-after", "5"), check=True, env=env, capture_output=True, text=True
    )
    assert "starting at step 0 of 30" in third.stderr and "resuming" not in third.stderr
    c = run.assemble("metrics", ["step", "loss", "attempt"])
    assert c["step"].tolist() == [1, 2, 3, 4, 5] and (c["attempt"] == 2).all()
    assert np.array_equal(a["loss"].to_numpy()[:5], c["loss"].to_numpy())


@pytest.mark.slow
def test_outputs_of_a_finished_run(prepared):
    study, path, root = prepared
    out = root / "nvfp4"
    train(study, "nvfp4", root / "data", out, device="cpu", progress=False)
    done = json.loads((out / "done.json").read_text())
    run = _run_folder(out)
    ckpts = sorted(run.ckpt.glob("step_*.pt"))
    assert len(ckpts) == 12 and done["checkpoints"] == [f"runs/{run.fingerprint}/ckpt/{p.name}" for p in ckpts]
    assert done["fingerprint"] == run.fingerprint and done["provenance"]["device"].startswith("cpu")
    [recipe_file] = done["recipe_files"]  # committed tables name no machine's path
    assert recipe_file == "fp4repro/configs/recipes/nvfp4.yaml"
    assert table_provenance(out / "metrics.parquet")["packages"]["torch"] == torch.__version__
    m = pd.read_parquet(out / "metrics.parquet")
    assert list(m.columns) == ["step", "tokens", "stage", "loss", "lr", "grad_norm", "tokens_per_s", "attempt"]
    assert m["stage"].tolist() == ["s1"] * 40 + ["s2"] * 20
    assert m["loss"].iloc[-5:].mean() < m["loss"].iloc[:5].mean()  # it learns
    # the process's seconds by phase: its steps' sum is what the metrics' step times add up to
    seconds = done["process_seconds"]
    step_seconds = (m["tokens"].diff().fillna(m["tokens"].iloc[0]) / m["tokens_per_s"]).to_numpy()
    assert seconds["first_step"] == pytest.approx(step_seconds[0], abs=0.051)
    assert seconds["steps"] == pytest.approx(step_seconds[1:].sum(), abs=0.051)
    assert seconds["checkpoints"] > 0 and seconds["setup"] >= 0  # 0.1 s resolution: setup may round to 0
    parts = ("setup", "first_step", "steps", "checkpoints", "other")
    assert sum(seconds[p] for p in parts) == pytest.approx(seconds["wall"], abs=0.3)
    t = pd.read_parquet(out / "telemetry.parquet")
    assert set(t["step"]) == set(range(60)) and (t["blocks"] > 0).all()
    assert set(t["layer"].str.split(".").str[1].astype(int)) == {0, 1, 2, 3}  # nvfp4: the last of 5 layers BF16
    assert list(t.columns) == TELEMETRY
    clipped = t["clipped_elements"]
    assert pd.api.types.is_integer_dtype(clipped) and (clipped >= 0).all()
    assert (clipped <= t["nonzero_elements"]).all()  # a clipped element is a non-zero one
    # nvfp4 rounds dY stochastically, and SR counts each element above 6 as clipped: every block
    # max whose E4M3 scale rounded down
    sr = t["operand"].str.startswith(("dgrad.dy", "wgrad.dy"))
    assert clipped[sr].sum() > 0


def test_periodic_amax_is_held_between_refreshes(prepared):
    study, path, root = prepared
    out = root / "ue5m3"
    train(study, "ue5m3", root / "data", out, device="cpu", progress=False, stop_after=20)
    t = _run_folder(out).assemble("telemetry", ["step", "operand", "steps_since_refresh", "amax_ratio"])
    assert (t["steps_since_refresh"] == t["step"] % 50).all()  # the phase of the 50-step refresh
    assert (t.loc[t["step"] == 0, "amax_ratio"] == 1.0).all()  # sampled at the first step
    assert (t.loc[t["step"] > 0, "amax_ratio"] != 1.0).any()  # held afterwards
    assert not (out / "done.json").exists()


def test_a_diverged_run_is_kept_as_a_result_with_the_failing_steps_telemetry(prepared, tmp_path, capsys):
    from fp4repro.eval.run import evaluate

    study, path, root = prepared
    bad = tmp_path / "bad.yaml"
    # a resume checkpoint after every step: the failing step's telemetry must not replace the last one's
    bad.write_text(EXPERIMENT.replace("lr: 3.0e-3", "lr: 1.0e+6").replace("resume_every: 10", "resume_every: 1"))
    study_bad = load_study(bad)
    out = run_dir(tmp_path / "results", "smalltest", "ue5m3", 0)
    train(study_bad, "ue5m3", root / "data", out, device="cpu", progress=False)
    assert "diverged: step " in capsys.readouterr().err
    done = json.loads((out / "done.json").read_text())
    step = done["diverged"]["step"]
    assert 1 < step < 60 and done["steps"] == step - 1
    assert (
        done["diverged"]["reason"].startswith(f"step {step}: non-finite")
        and "worst operands: layers." in done["diverged"]["reason"]
    )
    assert all(int(c[-11:-3]) < step for c in done["checkpoints"])
    m = pd.read_parquet(out / "metrics.parquet")
    assert np.isfinite(m["loss"]).all() and m["step"].max() == step - 1
    t = pd.read_parquet(out / "telemetry.parquet")
    failing = t[t["step"] == step - 1]  # telemetry steps count from 0
    assert len(failing) and (failing["nonfinite_blocks"] > 0).any()
    assert sorted(set(t["step"])) == list(range(step))
    assert (t["steps_since_refresh"] == t["step"] % 50).all()  # the redo quantizes in the failing step's phase
    # evaluation scores what checkpoints there are and carries the divergence to the report
    ev = evaluate(
        study_bad,
        "ue5m3",
        results=tmp_path / "results",
        data=root / "data",
        device="cpu",
        downstream=False,
        progress=False,
    )
    assert json.loads((ev / "final_loss.json").read_text())["diverged"]["step"] == step
    assert pd.read_parquet(ev / "nll.parquet")["step"].nunique() == len(done["checkpoints"])


@pytest.mark.parametrize("failing, resume_every", [(3, (1, 100)), (49, (100,))], ids=["plain-step", "before-a-refresh"])
def test_a_run_that_reads_each_step_after_launching_the_next_diverges_as_one_that_reads_it_at_once(
    prepared, tmp_path, monkeypatch, failing, resume_every
):
    # With fused AdamW the reference engine leaves a step's loss and norm on the device and the
    # loop reads them after launching the next step (at once before a checkpoint, and before a
    # step that samples a fresh amax: ue5m3 samples at step 50). One step's loss is made NaN, the
    # steps after it are finite. At a plain step, a resume checkpoint after every step (every
    # read at once) and one at the end only (every read one step late) must fail at the same step
    # with the same tables, the failing step's redo included: the step launched after the failure
    # updates nothing (AdamW skips it on the device). Before a refresh, the redo must quantize in
    # the failing step's phase with the amax it held, not the one the next step would sample.
    import fp4repro.train.engine as engine_module

    study, path, root = prepared
    real_loss = engine_module.lm_loss

    def nan_at_the_failing_step(model, inputs, targets):
        calls.append(1)
        loss = real_loss(model, inputs, targets)
        return loss * float("nan") if len(calls) == failing + 1 else loss

    monkeypatch.setattr(engine_module, "lm_loss", nan_at_the_failing_step)
    tables = []
    for every in resume_every:
        calls = []
        run_study = study.with_train(fused_kernels=True, resume_every=every, checkpoints=1)
        out = tmp_path / f"every{every}"
        train(run_study, "ue5m3", root / "data", out, device="cpu", progress=False)
        done = json.loads((out / "done.json").read_text())
        metrics = pd.read_parquet(out / "metrics.parquet").drop(columns="tokens_per_s")
        tables.append((done["diverged"], done["steps"], metrics, pd.read_parquet(out / "telemetry.parquet")))
    (diverged, steps, metrics, telemetry), *lagged = tables
    assert diverged["step"] == failing + 1 and steps == failing
    for other in lagged:
        assert other[0] == diverged and other[1] == steps
        pd.testing.assert_frame_equal(other[2], metrics)
        pd.testing.assert_frame_equal(other[3], telemetry)
    rows = telemetry.groupby("step").size()  # the failing step's redo replaces its rows, once
    assert list(rows.index) == list(range(failing + 1)) and rows.nunique() == 1
    assert (telemetry["steps_since_refresh"] == telemetry["step"] % 50).all()  # the redo's phase too


def test_a_step_returned_as_floats_is_read_before_the_next_is_launched(prepared, tmp_path, monkeypatch):
    # torch's single-tensor AdamW cannot skip on the device: its engine reads loss and norm in the
    # step, and the loop must not launch another step after a non-finite one (it would update)
    import fp4repro.train.engine as engine_module

    study, path, root = prepared
    real_loss, calls = engine_module.lm_loss, []

    def nan_at_step_3(model, inputs, targets):
        calls.append(1)
        loss = real_loss(model, inputs, targets)
        return loss * float("nan") if len(calls) == 4 else loss

    monkeypatch.setattr(engine_module, "lm_loss", nan_at_step_3)
    run_study = study.with_train(fused_kernels=False, resume_every=100, checkpoints=1)
    train(run_study, "ue5m3", root / "data", tmp_path / "run", device="cpu", progress=False)
    assert json.loads((tmp_path / "run" / "done.json").read_text())["diverged"]["step"] == 4
    assert len(calls) == 5  # steps 0-3 and the failing step's redo: no step 4


def test_a_config_change_of_the_numbers_starts_a_new_run_beside_the_old(prepared, tmp_path, capsys):
    """Another learning rate is another run: it starts at step 0 in its own folder, says which
    field changed, and leaves the old run (and its checkpoints) where it was; it ends exactly
    like a fresh run of the new config."""
    import dataclasses

    study, path, root = prepared
    out = tmp_path / "run"
    train(study, "bf16", root / "data", out, device="cpu", progress=False)  # a finished run
    assert (out / "done.json").is_file()
    (old,) = list_runs(out)
    old_files = sorted(p.name for p in old.path.rglob("*"))
    changed = dataclasses.replace(
        study,
        experiment=dataclasses.replace(study.experiment, train=dataclasses.replace(study.experiment.train, lr=1.0e-3)),
    )
    capsys.readouterr()
    train(changed, "bf16", root / "data", out, device="cpu", progress=False, stop_after=20)
    err = capsys.readouterr().err
    assert "starting at step 0 of 60" in err and "train.lr differ" in err and "fp4repro runs --prune" in err
    # the finished run's done.json and tables no longer describe this folder; its run folder stays
    assert "done.json and the tables of the finished run of another config were removed" in err
    assert not (out / "done.json").exists() and not (out / "metrics.parquet").exists()
    assert {r.fingerprint for r in list_runs(out)} == {old.fingerprint, _new_fingerprint(out, old)}
    assert sorted(p.name for p in old.path.rglob("*")) == old_files  # nothing of the old run touched
    fresh = tmp_path / "fresh"
    train(changed, "bf16", root / "data", fresh, device="cpu", progress=False, stop_after=20)
    new_run = next(r for r in list_runs(out) if r.fingerprint != old.fingerprint)
    a = new_run.assemble("metrics", ["step", "loss"])
    b = _run_folder(fresh).assemble("metrics", ["step", "loss"])
    assert len(a) == 20 and np.array_equal(a["loss"].to_numpy(), b["loss"].to_numpy())


def _new_fingerprint(out, old) -> str:
    return next(r.fingerprint for r in list_runs(out) if r.fingerprint != old.fingerprint)


@pytest.mark.slow
def test_a_change_of_what_is_recorded_resumes(prepared, tmp_path, capsys):
    """telemetry_every and resume_every change what is recorded, not the numbers: the run resumes."""
    import dataclasses

    study, path, root = prepared
    out = tmp_path / "run"
    train(study, "ue5m3", root / "data", out, device="cpu", progress=False, stop_after=20)
    recorded = dataclasses.replace(
        study,
        experiment=dataclasses.replace(
            study.experiment, train=dataclasses.replace(study.experiment.train, telemetry_every=7, resume_every=3)
        ),
    )
    capsys.readouterr()
    train(recorded, "ue5m3", root / "data", out, device="cpu", progress=False)
    assert "resuming from step 20 of 60" in capsys.readouterr().err
    assert len(list_runs(out)) == 1
    t = pd.read_parquet(out / "telemetry.parquet")
    assert set(t["step"]) == set(range(20)) | set(range(21, 60, 7))


def test_runs_lists_every_run_and_prune_removes_only_other_configs(prepared, tmp_path, capsys):
    import dataclasses

    from fp4repro.cli import main

    study, path, root = prepared
    results = tmp_path / "results"
    out = run_dir(results, study.name, "bf16", 0)
    other = dataclasses.replace(
        study,
        experiment=dataclasses.replace(study.experiment, train=dataclasses.replace(study.experiment.train, lr=1.0e-3)),
    )
    train(other, "bf16", root / "data", out, device="cpu", progress=False, stop_after=3)
    train(study, "bf16", root / "data", out, device="cpu", progress=False, stop_after=3)
    assert len(list_runs(out)) == 2
    capsys.readouterr()
    args = [
        "runs",
        "--experiment",
        str(path),
        "--recipe",
        "bf16",
        "--results",
        str(results),
        "--data",
        str(root / "data"),
    ]
    assert main(args) == 0
    listing = capsys.readouterr().out
    states = [line.rsplit("  ", 1)[-1] for line in listing.splitlines()[1:3]]
    assert sorted(states) == ["current config", "other config"]
    assert "`fp4repro runs --prune` deletes them" in listing and len(list_runs(out)) == 2  # listing deletes nothing
    assert main([*args, "--prune"]) == 0
    (kept,) = list_runs(out)
    assert kept.record()["numerics"]["train"]["lr"] == study.experiment.train.lr


def test_a_run_can_start_from_another_runs_checkpoint(prepared, tmp_path):
    from fp4repro.data import RunSampler, load_manifest
    from fp4repro.model import NemotronH
    from fp4repro.train import load_checkpoint
    from fp4repro.train.engine import lm_loss

    study, path, root = prepared
    first = tmp_path / "first"
    train(study, "bf16", root / "data", first, device="cpu", progress=False, stop_after=10)
    ckpt = sorted((_run_folder(first).ckpt).glob("step_*.pt"))[-1]
    start = tmp_path / "start"
    train(study, "bf16", root / "data", start, device="cpu", progress=False, stop_after=1, init_from=ckpt)
    # the first loss is the checkpoint's model on the run's first batch, computed here by hand
    t = study.experiment.train
    run = RunSampler.of_run(load_manifest(root / "data"), t, 0, cache_dir=root / "data" / "cache")
    batch = run.stages[0].batch(0, t.batch_size)
    model = NemotronH(study.model, study.recipe("bf16"))
    model.load_state_dict(load_checkpoint(ckpt)["model"])
    expected = lm_loss(model, batch[:, :-1], batch[:, 1:]).item()
    got = _run_folder(start).assemble("metrics", ["step", "loss"])
    assert got["loss"].iloc[0] == expected
    # another start is another run: not the seed's fingerprint
    fresh = tmp_path / "fresh"
    train(study, "bf16", root / "data", fresh, device="cpu", progress=False, stop_after=1)
    assert _run_folder(fresh).fingerprint != _run_folder(start).fingerprint
    assert pd.read_parquet(_run_folder(fresh).path / "metrics" / "upto_00000001.parquet")["loss"].iloc[0] != expected


def test_a_checkpoint_of_another_model_is_refused_before_training(prepared, tmp_path):
    from fp4repro.errors import FP4ReproError
    from fp4repro.train import save_checkpoint

    study, path, root = prepared
    bad = tmp_path / "other.pt"
    save_checkpoint({"model": {}, "model_config": "small", "step": 1}, bad)
    with pytest.raises(
        FP4ReproError, match="written for model config 'small', but experiment 'smalltest' trains 'tiny'"
    ):
        train(study, "bf16", root / "data", tmp_path / "run", device="cpu", progress=False, init_from=bad)
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_whose_weights_do_not_fit_is_refused_naming_the_tensor(prepared, tmp_path):
    from fp4repro.errors import FP4ReproError
    from fp4repro.model import NemotronH
    from fp4repro.train import save_checkpoint

    study, path, root = prepared
    weights = NemotronH(study.model).state_dict()
    weights["embedding.weight"] = weights["embedding.weight"][:-1]
    bad = tmp_path / "cut.pt"
    save_checkpoint({"model": weights, "model_config": "tiny", "step": 1}, bad)
    with pytest.raises(
        FP4ReproError, match=r"do not fit model 'tiny'.*embedding.weight: shape \(2047, 128\) in the checkpoint"
    ):
        train(study, "bf16", root / "data", tmp_path / "run", device="cpu", progress=False, init_from=bad)
    assert not (tmp_path / "run").exists()


def test_the_gemm_model_changes_the_losses_and_nothing_else(prepared):
    """ue5m3 (probe-matched GEMMs) and ue5m3_torch_gemm (FP32 GEMMs) on the same batches: the same
    quantized operands, other GEMM outputs. Where a group's sum is exact in FP32 both GEMMs give
    it, so the first steps can agree; the runs part once an inexact sum rounds differently."""
    _, path, root = prepared
    study = load_study(path, add_recipes=("ue5m3_torch_gemm",))
    losses = {}
    for recipe in ("ue5m3", "ue5m3_torch_gemm"):
        out = root / f"gemm_{recipe}"
        train(study, recipe, root / "data", out, device="cpu", progress=False, stop_after=8)
        losses[recipe] = _run_folder(out).assemble("metrics", ["step", "loss"])["loss"].to_numpy()
    probe, fp32 = losses["ue5m3"], losses["ue5m3_torch_gemm"]
    assert len(probe) == len(fp32) == 8 and np.isfinite(probe).all()
    assert (probe != fp32).any()
    assert np.abs(probe - fp32).max() < 0.05


# ---- what stops a run before it computes, or mid-run with one line (issue 42) --------------------


def _copy_of(data: Path, folder: Path) -> Path:
    shutil.copytree(data, folder, ignore=shutil.ignore_patterns("cache"))
    return folder


def test_a_token_file_changed_in_place_stops_training_before_any_step(guarded, tmp_path, train_command):
    # a .bin overwritten with other valid ids of the same size trained without a word under the clean
    # data's fingerprint
    _, data = guarded
    data = _copy_of(data, tmp_path / "data")
    path = data / "prose_train.bin"
    np.roll(np.fromfile(path, dtype=np.uint16), 1).tofile(path)
    out = tmp_path / "run"
    proc = subprocess.run(train_command(out, "--stop-after", "1", data=data), capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"fp4repro train: error: {path}: sha256 ") and "prepare-data` again" in proc.stderr
    assert not list(out.glob("runs/*/metrics")) and not list(out.glob("runs/*/resume"))
    # the manifest's digests are the run's data: other token files, another fingerprint
    study = load_study(guarded[0])
    manifest = load_manifest(data)
    entry = manifest.sources["prose"].datasets["train"]
    other = {**manifest.sources}
    other["prose"] = dataclasses.replace(
        other["prose"], datasets={**other["prose"].datasets, "train": dataclasses.replace(entry, bin_sha256="f" * 64)}
    )
    tampered = tokens_hash(manifest.inputs_hash, other)
    assert run_fingerprint(study, "bf16", 0, tampered)[1] != run_fingerprint(study, "bf16", 0, manifest.data_hash)[1]


@pytest.mark.slow
def test_token_ids_beyond_the_vocabulary_stop_training_with_one_line_naming_file_and_offset(
    guarded, tmp_path, train_command
):
    # a .bin of 0xFFFF ended in a 44-line IndexError; here its manifest records the file's digest (data
    # prepared elsewhere with another tokenizer), so the ids themselves are what is caught
    _, data = guarded
    data = _copy_of(data, tmp_path / "data")
    path = data / "prose_train.bin"
    np.full_like(np.fromfile(path, dtype=np.uint16), 0xFFFF).tofile(path)
    raw = json.loads((data / "manifest.json").read_text())
    raw["sources"]["prose"]["splits"]["train"]["bin_sha256"] = token_digests(data / "prose_train")[0]
    (data / "manifest.json").write_text(json.dumps(raw))
    proc = subprocess.run(
        train_command(tmp_path / "run", "--stop-after", "1", data=data), capture_output=True, text=True
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"fp4repro train: error: token id 65535 ≥ vocab 2048 in {path} at offset 0 (byte 0)")


def test_a_training_that_fails_waits_for_the_checkpoint_being_written_before_it_ends(guarded, tmp_path, monkeypatch):
    """A step fails while the step-5 resume checkpoint is still being written in the background (its
    write held back 1.5 s): the error reaches the caller only after that write has ended, so that
    nothing writes in the run folder once its lock is released (or a temporary folder removed)."""
    from fp4repro.train import checkpoint
    from fp4repro.train.engine import ReferenceEngine

    write, step_of = checkpoint.save_checkpoint, ReferenceEngine.step

    def slow_write(obj, path):
        time.sleep(1.5)
        write(obj, path)

    def failing_step(self, step, batch):
        if step == 6:
            raise RuntimeError("a CUDA error at step 7")
        return step_of(self, step, batch)

    monkeypatch.setattr(checkpoint, "save_checkpoint", slow_write)
    monkeypatch.setattr(ReferenceEngine, "step", failing_step)
    path, data = guarded
    out = tmp_path / "run"
    args = ["train", "--experiment", str(path), "--recipe", "bf16", "--data", str(data), "--out", str(out), "--quiet"]
    with pytest.raises(RuntimeError, match="a CUDA error at step 7"):
        main(args)
    (run,) = list_runs(out)
    assert [p.name for p in resume_checkpoints(run.resume)] == ["resume_00000005.pt"]
    assert load_checkpoint(run.resume / "resume_00000005.pt")["step"] == 5


def test_a_full_disk_during_training_is_one_line_and_the_run_resumes_from_its_last_checkpoint(
    guarded, tmp_path, capsys, full_disk
):
    path, data = guarded
    out = tmp_path / "run"
    args = ["train", "--experiment", str(path), "--recipe", "bf16", "--data", str(data), "--out", str(out), "--quiet"]
    full_disk("resume_00000010")  # the second resume checkpoint finds the disk full
    assert main([*args, "--stop-after", "10"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    (run,) = list_runs(out)
    assert err.startswith(f"fp4repro train: error: disk full writing {run.resume / 'resume_00000010.pt'}; ")
    assert err.endswith(" bytes free; nothing was replaced")
    assert [p.name for p in resume_checkpoints(run.resume)] == ["resume_00000005.pt"]
    assert load_checkpoint(run.resume / "resume_00000005.pt")["step"] == 5  # intact
    assert not [p for p in run.resume.iterdir() if p.name.endswith(".tmp")]
    full_disk(None)  # space again: the same command resumes from the checkpoint that was complete
    assert main([*args, "--stop-after", "10"]) == 0
    assert "resuming from step 5 of 400" in capsys.readouterr().err
    assert [p.name for p in resume_checkpoints(run.resume)] == ["resume_00000010.pt", "resume_00000005.pt"]


def test_an_experiment_asking_for_deterministic_mode_trains_in_it_without_the_flag(guarded, tmp_path):
    # issue 41: committed runs are made in deterministic mode (its cost is measured in
    # results/bench/determinism/cost_h200.json); the experiment says so, the workflow passes no flag
    path, data = guarded
    asked = tmp_path / "guarded.yaml"
    asked.write_text(
        path.read_text().replace("resume_every: 5", "resume_every: 5\n  deterministic: true").replace("12800", "256")
    )
    out = tmp_path / "run"
    try:
        assert (
            main(["train", "--experiment", str(asked), "--recipe", "bf16", "--data", str(data), "--out", str(out)]) == 0
        )
    finally:  # (the variables it set are restored by conftest's _process_environment_restored)
        torch.use_deterministic_algorithms(False)
    assert json.loads((out / "done.json").read_text())["deterministic"] is True


def test_telemetry_at_refresh_records_every_amax_sample_besides_the_cadence(prepared, tmp_path):
    study, _, root = prepared
    recipe = tmp_path / "ue5m3_k5.yaml"
    recipe.write_text(
        "name: ue5m3_k5\nbase: ue5m3\ndescription: ue5m3 with its amaxes sampled every 5 steps.\n"
        "defaults: {tensor_scaling: {kind: periodic, interval: 5}}\n"
        "sources: [{choice: tensor amax, kind: reading, source: 'a sample every 5 steps: a choice of this test'}]\n"
    )
    path = tmp_path / "exp.yaml"
    path.write_text(
        EXPERIMENT.replace("recipes: [bf16, nvfp4, ue5m3]", f"recipes: [{recipe}]").replace(
            "telemetry_every: 1", "telemetry_every: 7\n  telemetry_at_refresh: true"
        )
    )
    out = tmp_path / "run"
    train(load_study(path), "ue5m3_k5", root / "data", out, device="cpu", progress=False, stop_after=12)
    steps = set(_run_folder(out).assemble("telemetry", TELEMETRY)["step"])
    assert steps == {0, 5, 7, 10}  # the cadence's 0 and 7, the samples at 0, 5 and 10


def test_a_seed_outside_curve_seeds_saves_only_its_final_evaluation_checkpoint(prepared, tmp_path):
    _, _, root = prepared
    path = tmp_path / "exp.yaml"
    path.write_text(
        EXPERIMENT.replace("recipes: [bf16, nvfp4, ue5m3]", "recipes: [bf16]")
        .replace("  batch_size: 4\n", "  batch_size: 4\n  seeds: [0, 1]\n")
        .replace("tokens: 10240", "tokens: 2048")  # 8 + 4 steps of 256 tokens, a checkpoint after each
        .replace("tokens: 5120", "tokens: 1024")
        + "eval: {curve_seeds: [0]}\n"
    )
    study = load_study(path)
    out = tmp_path / "seed1"
    train(study, "bf16", root / "data", out, seed=1, device="cpu", progress=False)
    run = _run_folder(out)
    assert [p.name for p in run.ckpt.glob("step_*.pt")] == ["step_00000012.pt"]  # the evaluation reads no other
    assert json.loads((out / "done.json").read_text())["checkpoints"] == [
        f"runs/{run.fingerprint}/ckpt/step_00000012.pt"
    ]


def test_fused_kernels_train_a_run_of_their_own_close_to_the_default_kernels(prepared, tmp_path):
    # torch's fused AdamW and compiled norms: the same formulas, other roundings (tested in
    # test_fused_kernels.py), so another fingerprint; the run folders made without the field keep
    # theirs (the field is left out of their numerics). Six bf16 steps stay within 1e-4 of each other.
    _, path, root = prepared
    losses, numerics = {}, {}
    for name, extra in (("plain", ()), ("fused", ("--fused-kernels",))):
        out = tmp_path / name
        assert main(_cli(path, "bf16", root, out, "--stop-after", "6", *extra)[3:]) == 0
        run = _run_folder(out)
        numerics[name] = json.loads((run.path / "run.json").read_text())["numerics"]["train"]
        losses[name] = run.assemble("metrics", ["step", "loss"])["loss"].to_numpy()
    assert "fused_kernels" not in numerics["plain"] and numerics["fused"].pop("fused_kernels") is True
    assert numerics["fused"] == numerics["plain"]
    assert len(losses["fused"]) == 6 and (losses["fused"] != losses["plain"]).any()
    np.testing.assert_allclose(losses["fused"], losses["plain"], rtol=1e-4)


def test_fused_kernels_on_an_experiment_without_them_need_a_folder_of_their_own(guarded, tmp_path, capsys):
    # the default folder holds the experiment's own run: a fused run there would retire its outputs
    path, data = guarded
    args = ["train", "--experiment", str(path), "--recipe", "bf16", "--data", str(data), "--fused-kernels"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--fused-kernels: experiment 'guarded' trains without them (train.fused_kernels: false)" in err
    assert "give this run a folder of its own with --out" in err and not (tmp_path / "results").exists()
