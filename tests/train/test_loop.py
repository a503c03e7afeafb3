"""End-to-end training on real text (a few standard-library modules), exact resume after SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time

import numpy as np
import pandas as pd
import pytest

from fp4repro.experiment import load_experiment
from fp4repro.train import NonFiniteLoss, train

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
  telemetry_every: 5
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
    exp = load_experiment(path)
    prepare_data(exp, root / "data", progress=False)
    return exp, path, root


def _cli(path, recipe, root, out, *extra):
    return [sys.executable, "-m", "fp4repro.cli", "train", "--experiment", str(path), "--recipe", recipe,
            "--data", str(root / "data"), "--out", str(out), "--quiet", *extra]


def test_resume_after_sigkill_is_bit_exact(prepared):
    exp, path, root = prepared
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    full = root / "full"
    subprocess.run(_cli(path, "ue5m3", root, full), check=True, env=env)
    killed = root / "killed"
    proc = subprocess.Popen(_cli(path, "ue5m3", root, killed), env=env)
    marker = killed / "resume" / "resume_00000010.pt.sha256"
    deadline = time.time() + 120
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "done.json").exists(), "the run finished before it could be killed"
    subprocess.run(_cli(path, "ue5m3", root, killed), check=True, env=env)
    a = pd.read_parquet(full / "metrics.parquet")
    b = pd.read_parquet(killed / "metrics.parquet")
    assert len(a) == exp.train.total_steps == 60
    assert np.array_equal(a["loss"].to_numpy(), b["loss"].to_numpy())          # bit for bit
    assert np.array_equal(a["grad_norm"].to_numpy(), b["grad_norm"].to_numpy())
    ta, tb = pd.read_parquet(full / "telemetry.parquet"), pd.read_parquet(killed / "telemetry.parquet")
    assert ta.drop(columns=[]).equals(tb)


def test_outputs_of_a_finished_run(prepared):
    exp, path, root = prepared
    out = root / "nvfp4"
    train(exp, "nvfp4", root / "data", out, device="cpu", progress=False)
    done = json.loads((out / "done.json").read_text())
    ckpts = sorted((out / "ckpt").glob("step_*.pt"))
    assert len(ckpts) == 12 and done["checkpoints"] == [f"ckpt/{p.name}" for p in ckpts]
    m = pd.read_parquet(out / "metrics.parquet")
    assert list(m.columns) == ["step", "tokens", "stage", "loss", "lr", "grad_norm", "tokens_per_s"]
    assert m["stage"].tolist() == ["s1"] * 40 + ["s2"] * 20
    assert m["loss"].iloc[-5:].mean() < m["loss"].iloc[:5].mean()             # it learns
    t = pd.read_parquet(out / "telemetry.parquet")
    assert set(t["step"]) == set(range(0, 60, 5)) and (t["blocks"] > 0).all()
    assert set(t["layer"].str.split(".").str[1].astype(int)) == {0}            # nvfp4: last 4 of 5 layers BF16


def test_periodic_amax_is_held_between_refreshes(prepared):
    exp, path, root = prepared
    out = root / "ue5m3"
    train(exp, "ue5m3", root / "data", out, device="cpu", progress=False, stop_after=20)
    t = pd.read_parquet(out / "telemetry.parquet")
    assert (t.loc[t["step"] == 0, "amax_ratio"] == 1.0).all()          # sampled at the first step
    assert (t.loc[t["step"] > 0, "amax_ratio"] != 1.0).any()           # held afterwards
    assert not (out / "done.json").exists()


def test_non_finite_loss_stops_with_a_diagnosis(prepared, tmp_path):
    exp, path, root = prepared
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXPERIMENT.replace("lr: 3.0e-3", "lr: 1.0e+6").replace("grad_clip", "grad_clip"))
    exp_bad = load_experiment(bad)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLoss) as err:
        train(exp_bad, "ue5m3", root / "data", out, device="cpu", progress=False)
    msg = str(err.value)
    assert msg.startswith("step ") and "worst operands: layers." in msg
    m = pd.read_parquet(out / "metrics.parquet")
    assert np.isfinite(m["loss"]).all() and not (out / "done.json").exists()


def test_resume_is_refused_after_the_config_changes(prepared, tmp_path, capsys):
    """A stale resume checkpoint (other schedule) must not be continued: the run starts at step 0
    and ends exactly like a fresh run of the new config."""
    import dataclasses

    exp, path, root = prepared
    out = tmp_path / "run"
    train(exp, "bf16", root / "data", out, device="cpu", progress=False, stop_after=20)
    changed = dataclasses.replace(exp, train=dataclasses.replace(exp.train, lr=1.0e-3))
    train(changed, "bf16", root / "data", out, device="cpu", progress=False, stop_after=20)
    assert "starting from step 0" in capsys.readouterr().err
    fresh = tmp_path / "fresh"
    train(changed, "bf16", root / "data", fresh, device="cpu", progress=False, stop_after=20)
    a, b = pd.read_parquet(out / "metrics.parquet"), pd.read_parquet(fresh / "metrics.parquet")
    assert len(a) == 20 and np.array_equal(a["loss"].to_numpy(), b["loss"].to_numpy())
