"""Training through megatron-core (one GPU) with the same loop, outputs and evaluation as the
reference backend: a run finishes with its tables and 12 evaluation checkpoints that the reference
model loads and ``evaluate`` scores; a run stopped at step 30 and resumed repeats the uninterrupted
run bit for bit with deterministic algorithms; its quantized operands are the reference run's."""

import json
import sysconfig

import pandas as pd
import pytest
import torch

from fp4repro.config.study import load_study
from fp4repro.results import run_dir
from fp4repro.train import train

pytestmark = pytest.mark.gpu

STDLIB = sysconfig.get_paths()["stdlib"]
EXPERIMENT = f"""name: megatrontest
model: tiny
recipes: [bf16, ue5m3]
backend: {{backend}}
data:
  sources:
    prose: {{{{kind: text, paths: ["{STDLIB}/json/*.py", "{STDLIB}/textwrap.py"]}}}}
    code: {{{{kind: text, paths: ["{STDLIB}/email/*.py"]}}}}
  tokenizer: {{{{vocab_size: 2048}}}}
  split: {{{{valid: 0.1, test: 0.1}}}}
train:
  seq_len: 64
  batch_size: 4
  lr: 3.0e-3
  checkpoints: 12
  telemetry_every: 1
  resume_every: 10
  stages:
    - {{{{name: s1, tokens: 10240, blend: {{{{prose: 0.7, code: 0.3}}}}}}}}
    - {{{{name: s2, tokens: 5120, blend: {{{{prose: 0.4, code: 0.6}}}}}}}}
eval:
  policies: [bf16, quantized]
  nll_max_tokens: 2048
"""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from fp4repro.data import prepare_data

    root = tmp_path_factory.mktemp("megatron_train")
    studies = {}
    for backend in ("megatron", "reference"):
        path = root / f"{backend}.yaml"
        path.write_text(EXPERIMENT.format(backend=backend))
        studies[backend] = load_study(path)
    prepare_data(studies["megatron"].experiment, root / "data", progress=False)
    return studies, root


@pytest.fixture
def deterministic():
    yield
    torch.use_deterministic_algorithms(False)


def _losses(out):
    return pd.read_parquet(out / "metrics.parquet").set_index("step")["loss"]


def test_a_megatron_run_finishes_evaluates_and_resumes_bit_for_bit(prepared, deterministic, megatron_cpu):
    from fp4repro.eval.run import evaluate
    from fp4repro.model import NemotronH
    from fp4repro.train import load_checkpoint

    studies, root = prepared
    study = studies["megatron"]
    whole = run_dir(root / "results", "megatrontest", "ue5m3", 0)
    train(study, "ue5m3", root / "data", whole, progress=False, deterministic=True)
    done = json.loads((whole / "done.json").read_text())
    assert done["backend"] == "megatron" and len(done["checkpoints"]) == 12
    losses = _losses(whole)
    assert len(losses) == 60 and losses.iloc[-10:].mean() < losses.iloc[:5].mean() - 1.0

    # an evaluation checkpoint is the reference model's state dict; evaluate scores all 12
    last = load_checkpoint(whole / done["checkpoints"][-1])
    NemotronH(study.model, study.recipe("ue5m3")).load_state_dict(last["model"], strict=True)
    out = evaluate(
        study, "ue5m3", results=root / "results", data=root / "data", device="cuda", downstream=False, progress=False
    )
    nll = pd.read_parquet(out / "nll.parquet")
    assert nll["step"].nunique() == 12 and nll["nll"].notna().all()

    # stop at 30 (a resume checkpoint), resume in a new process' place: the same engine rebuilt
    resumed = root / "resumed"
    train(study, "ue5m3", root / "data", resumed, progress=False, deterministic=True, stop_after=30)
    assert not (resumed / "done.json").exists()
    train(study, "ue5m3", root / "data", resumed, progress=False, deterministic=True)
    # the second attempt began after step 30, from the checkpoint (with deterministic algorithms a
    # restart from step 0 would give the same losses: equal losses alone prove no resume)
    attempts = pd.read_parquet(resumed / "metrics.parquet").set_index("step")["attempt"]
    assert (attempts.loc[:30] == 0).all() and (attempts.loc[31:] == 1).all()
    again = _losses(resumed)
    assert again.index.tolist() == losses.index.tolist()
    assert again.loc[31:35].tolist() == losses.loc[31:35].tolist()  # bit for bit
    assert again.tolist() == losses.tolist()


def test_megatron_and_reference_runs_quantize_the_same_operands_from_the_same_start(prepared, megatron_cpu):
    studies, root = prepared
    outs = {}
    for backend, study in studies.items():
        outs[backend] = root / f"operands_{backend}"
        train(study, "ue5m3", root / "data", outs[backend], progress=False, stop_after=10)
    parts = {
        b: pd.concat(pd.read_parquet(p) for p in sorted((o / "runs").glob("*/telemetry/upto_*.parquet")))
        for b, o in outs.items()
    }
    keys = {b: set(zip(t["layer"], t["operand"])) for b, t in parts.items()}
    assert keys["megatron"] == keys["reference"] and len(keys["megatron"]) > 10
    first = {
        b: pd.concat(pd.read_parquet(p) for p in sorted((o / "runs").glob("*/metrics/upto_*.parquet"))).set_index(
            "step"
        )["loss"]
        for b, o in outs.items()
    }
    # the same initial weights and the first batch: the first losses differ by BF16 rounding only
    assert abs(first["megatron"].loc[1] - first["reference"].loc[1]) < 1e-2 * first["reference"].loc[1]


@pytest.mark.parametrize("backend", ["megatron", "reference"])
def test_a_run_with_fused_kernels_resumes_bit_for_bit(prepared, deterministic, megatron_cpu, backend):
    # fused AdamW's state loaded from a resume checkpoint onto the GPU (megatron's through its
    # distributed optimizer's loader) and the compiled norms, in deterministic mode: stopped at 10
    # and resumed in a new engine, steps 11-20 repeat (the compiled kernels are this process's)
    from fp4repro.train.runs import list_runs

    studies, root = prepared
    study = studies[backend].with_train(fused_kernels=True)
    whole, resumed = root / f"fused_{backend}", root / f"fused_{backend}_resumed"
    train(study, "ue5m3", root / "data", whole, progress=False, deterministic=True, stop_after=20)
    train(study, "ue5m3", root / "data", resumed, progress=False, deterministic=True, stop_after=10)
    train(study, "ue5m3", root / "data", resumed, progress=False, deterministic=True, stop_after=20)
    (run,) = list_runs(whole)
    (again,) = list_runs(resumed)
    assert json.loads((run.path / "run.json").read_text())["numerics"]["train"]["fused_kernels"] is True
    losses = run.assemble("metrics", ["step", "loss", "attempt"]).set_index("step")
    repeated = again.assemble("metrics", ["step", "loss", "attempt"]).set_index("step")
    assert (repeated.loc[11:, "attempt"] == 1).all() and len(losses) == 20
    assert repeated["loss"].tolist() == losses["loss"].tolist()
