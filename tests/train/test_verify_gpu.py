"""`fp4repro verify` on the committed GPU runs of `tiny` (results/bench/determinism/runs/): a run made
with --deterministic reruns identically, a fast-mode run within the measured spread
(results/bench/determinism/spread.json), and one changed step of data is caught at that step."""

import json
from pathlib import Path

import pytest
import torch

from fp4repro.cli import main
from fp4repro.config.experiment import load_experiment
from fp4repro.config.numerics import numerics_record
from fp4repro.config.study import load_study
from fp4repro.data import load_manifest
from fp4repro.data.prepare import prepare_data
from fp4repro.results import run_dir

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "results" / "bench" / "determinism" / "runs"
SPREAD = ROOT / "results" / "bench" / "determinism" / "spread.json"


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """tiny's data prepared here; skips where its digest is not the committed runs' (the corpus is
    this machine's Python and packages: verify would refuse the rerun, rightly)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    done = json.loads((run_dir(COMMITTED, "tiny", "ue5m3", 0) / "done.json").read_text())
    recorded = done["provenance"]["device"]
    if torch.cuda.get_device_name() != recorded:
        pytest.skip(f"the committed runs were made on {recorded}, this is {torch.cuda.get_device_name()}")
    here = numerics_record(load_study("tiny").recipe("ue5m3"), load_study("tiny").model.layer_linears)["numerics"]
    if done.get("numerics") != here:
        pytest.skip(
            f"the committed runs computed with numerics {done.get('numerics')}, this code with {here}: verify "
            "refuses them, rightly; re-make them: scripts/remake_verify_runs.sh tiny ue5m3:deterministic nvfp4:fast"
        )
    out = tmp_path_factory.mktemp("tiny") / "data"
    prepare_data(load_experiment("tiny"), out, progress=False)
    digest = load_manifest(out).data_hash
    if digest != done["provenance"]["data"]:
        pytest.skip(f"tiny's corpus here is {digest}, the committed runs trained on {done['provenance']['data']}")
    return out


def _verify(data, recipe, *extra) -> list[str]:
    return ["verify", "--experiment", "tiny", "--recipe", recipe, "--results", str(COMMITTED), "--data", str(data)] + [
        "--quiet",
        "--spread",
        str(SPREAD),
        *extra,
    ]


def test_a_deterministic_gpu_run_reruns_identically(tiny_data, capsys):
    assert main(_verify(tiny_data, "ue5m3")) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("identical: 150 steps of tiny/ue5m3/seed0 (loss and "), line


def test_a_fast_mode_gpu_run_reruns_within_the_measured_spread(tiny_data, capsys):
    measured_on = json.loads(SPREAD.read_text())["experiments"].get("tiny", {}).get("device")
    if measured_on != torch.cuda.get_device_name():
        pytest.skip(
            f"the spread of tiny's fast-mode reruns was measured on {measured_on}, this is "
            f"{torch.cuda.get_device_name()}: verify cannot judge a fast-mode rerun here; measure it with "
            "scripts/determinism_pairs.sh and scripts/spread.py"
        )
    assert main(_verify(tiny_data, "nvfp4")) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("within tolerance: 150 steps of tiny/nvfp4/seed0 (largest |Δloss| "), line


def test_one_changed_step_of_data_is_caught_at_that_step_on_gpu(tiny_data, capsys, monkeypatch):
    from fp4repro.train.engine import ReferenceEngine

    step = ReferenceEngine.step

    def perturbed(self, index, batch):  # the sixth step trains on its batch shifted by one token
        return step(self, index, batch.roll(1, dims=-1) if index == 5 else batch)

    monkeypatch.setattr(ReferenceEngine, "step", perturbed)
    assert main(_verify(tiny_data, "ue5m3", "--steps", "8")) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith("differs from step 6: 8-step rerun of tiny/ue5m3/seed0: metrics: loss "), line
