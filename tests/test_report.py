"""The claims file against measured results: directions, noise, and what cannot be measured."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from fp4repro.config.files import PACKAGED
from fp4repro.config.study import load_study
from fp4repro.config.files import claims_path
from fp4repro.report import ReportError, load_claims, measure, write_report

CLAIMS = PACKAGED / "claims.yaml"


def _results(root: Path, losses: dict, nll: dict, acc: dict, underflow: dict) -> Path:
    exp = root / "results" / "tiny"
    for recipe in losses:
        ev = exp / "eval" / recipe
        ev.mkdir(parents=True)
        (ev / "final_loss.json").write_text(json.dumps({"loss": losses[recipe], "loss_stderr": 0.01}))
        pd.DataFrame([{"recipe": recipe, "step": s, "tokens": s * 10, "policy": p, "source": "blend",
                       "nll": nll[recipe] + (192 - s), "tokens_evaluated": 100}
                      for s in (96, 192) for p in ("bf16", "quantized")]).to_parquet(ev / "nll.parquet")
        pd.DataFrame([{"recipe": recipe, "step": 192, "tokens": 1920, "policy": "quantized", "aggregate": agg,
                       "task": agg, "level": "aggregate", "metric": "acc", "value": v, "stderr": 0.02, "n": 100}
                      for agg, v in acc[recipe].items()]).to_parquet(ev / "downstream.parquet")
        tr = exp / "train" / recipe
        tr.mkdir(parents=True)
        pd.DataFrame([{"step": 0, "layer": "layers.0.mixer.in_proj", "operand": op, "blocks": 10_000,
                       "saturated_blocks": 0, "underflow_blocks": underflow[recipe] if op == "dgrad.dy" else 0}
                      for op in ("dgrad.dy", "wgrad.dy", "fprop.x")]).to_parquet(tr / "telemetry.parquet")
    return exp


def test_the_packaged_claims_file_is_valid_and_a_local_one_comes_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert claims_path() == CLAIMS
    paper, claims = load_claims(CLAIMS)
    assert "UE5M3" in paper["title"] and {c.measure for c in claims} == {
        "final_loss", "heldout_nll", "downstream", "telemetry", "throughput"}
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "claims.yaml").write_text(CLAIMS.read_text())
    assert claims_path().resolve() == (tmp_path / "configs" / "claims.yaml").resolve()


def test_a_broken_claims_file_names_the_field(tmp_path):
    bad = tmp_path / "claims.yaml"
    bad.write_text(CLAIMS.read_text().replace("expect: lower", "expect: smaller", 1))
    with pytest.raises(ReportError, match=r"claims.yaml: field 'claims.0.expect': value 'smaller'"):
        load_claims(bad)


def test_directions_noise_and_unmeasured_claims(tmp_path):
    exp = _results(tmp_path, losses={"nvfp4": 3.00, "ue5m3": 2.90, "ue5m3_t2048": 2.95},
                   nll={"nvfp4": 3.5, "ue5m3": 3.6, "ue5m3_t2048": 3.6},
                   acc={"nvfp4": {"a": 0.50, "b": 0.40}, "ue5m3": {"a": 0.60, "b": 0.40},
                        "ue5m3_t2048": {"a": 0.5, "b": 0.5}},
                   underflow={"nvfp4": 0, "ue5m3": 40, "ue5m3_t2048": 10})
    _, claims = load_claims(CLAIMS)
    recipes = ("nvfp4", "ue5m3", "ue5m3_t2048")
    rows = {r.label: r for c in claims for r in measure(c, exp, recipes)}
    loss = rows["final_loss"]
    assert loss.reproduced and loss.beyond_noise and loss.difference == pytest.approx(-0.10)
    assert math.isclose(loss.stderr, math.hypot(0.01, 0.01))
    nll = rows["heldout_nll"]                                # last checkpoint (192), quantized policy
    assert (nll.recipe_value, nll.baseline_value) == (3.6, 3.5) and not nll.reproduced and nll.beyond_noise is None
    assert rows["downstream: a"].reproduced and rows["downstream: a"].beyond_noise
    assert not rows["downstream: b"].reproduced                # a tie is not the paper's direction
    under = rows["t2048_underflow"]
    assert (under.recipe_value, under.baseline_value) == (10 / 20_000, 40 / 20_000) and under.reproduced
    assert rows["t2048_saturation"].note.startswith("not resolved: no saturation events")
    assert rows["throughput_no_rht_no_bf16_tail"].note.startswith("not measured")


def test_write_report_writes_markdown_with_figure_links(tmp_path, monkeypatch):
    _results(tmp_path, losses={r: 3.0 for r in ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4")},
             nll={r: 3.0 for r in ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4")},
             acc={r: {"a": 0.5} for r in ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4")},
             underflow={r: 1 for r in ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4")})
    monkeypatch.chdir(tmp_path)
    write_report(load_study("tiny"), "claims", "paper/tiny/report.md", figures=["figures/tiny/loss.png"])
    text = (tmp_path / "paper/tiny/report.md").read_text()
    assert "from experiment `tiny`" in text and "1,078,464 parameters" in text
    assert "![loss](../../figures/tiny/loss.png)" in text
    assert "| throughput_no_rht_no_bf16_tail | +21.2% tokens/s |" in text
