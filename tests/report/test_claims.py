"""The claims file: the packaged one is valid and a local one comes first; a broken one names
its field."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from synthetic_runs import CLAIMS

from fp4repro.config.files import claims_path
from fp4repro.config.model import load_model_config
from fp4repro.config.study import load_study
from fp4repro.report import ReportError, load_claims
from fp4repro.report.claims import claim_policies


def test_the_packaged_claims_file_is_valid_and_a_local_one_comes_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert claims_path() == CLAIMS
    paper, claims = load_claims(CLAIMS)
    assert "UE5M3" in paper["title"] and {c.measure for c in claims} == {
        "final_loss",
        "heldout_nll",
        "downstream",
        "telemetry",
        "throughput",
    }
    assert {c.event for c in claims if c.measure == "telemetry"} == {"underflow", "saturation", "clipping"}
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "claims.yaml").write_text(CLAIMS.read_text())
    assert claims_path().resolve() == (tmp_path / "configs" / "claims.yaml").resolve()


def test_a_broken_claims_file_names_the_field(tmp_path):
    bad = tmp_path / "claims.yaml"
    bad.write_text(CLAIMS.read_text().replace("expect: lower", "expect: smaller", 1))
    with pytest.raises(ReportError, match=r"claims.yaml: field 'claims.0.expect': value 'smaller'"):
        load_claims(bad)


# a path of the authors' artifact (MrHuff/ue5m3-fp4), then where in the file
ARTIFACT_PATH = re.compile(r"^(docs|reproduce)/[\w./-]+\.(tex|csv|json|yaml|md)\b")


def test_every_claim_has_the_papers_number_cited_by_artifact_path_or_says_why_not():
    _, claims = load_claims(CLAIMS)
    for c in claims:
        reported = c.reported
        assert reported is not None and reported.scale, c.id
        if reported.measured_at == "summary-only":
            assert not reported.difference and "summary" in reported.note, c.id
            continue
        assert reported.difference, f"{c.id}: measured at {reported.measured_at} but no number"
        for v in reported.difference + reported.values:
            assert ARTIFACT_PATH.match(v.source), f"{c.id}: {v.of}: {v.source!r} is not an artifact path"
    by_id = {c.id: c.reported for c in claims}
    # the numbers (40, item 4): final-window loss per recipe, the T ablation at 350M only
    loss = {v.of: v.value for v in by_id["final_loss"].values}
    assert loss == {
        "bf16": 2.2651,
        "ue5m3_te_settings": 2.2902,
        "ue5m3": 2.3090,
        "ue5m3_torch_gemm": 2.3157,
        "ue5m3_b32": 2.3241,
        "nvfp4": 2.3474,
        "nvfp4_no_rht_no_bf16_tail": 2.4420,
    }
    assert by_id["final_loss"].difference[0].value == pytest.approx(loss["ue5m3"] - loss["nvfp4"], abs=5e-5)
    assert by_id["throughput_no_rht_no_bf16_tail"].difference[0].value == 21.2
    assert "batch 1 x 1,024 tokens" in by_id["throughput_no_rht_no_bf16_tail"].scale
    assert by_id["final_loss_t2048"].measured_at == "350M" and "one run (seed 42)" in by_id["final_loss_t2048"].scale
    assert {i for i, r in by_id.items() if r.measured_at == "summary-only"} == {
        "t2048_underflow",
        "t2048_saturation",
        "t2048_clipping",
    }


def test_a_paper_number_without_a_source_is_refused(tmp_path):
    bad = tmp_path / "claims.yaml"
    text = CLAIMS.read_text()
    cited = ', source: "docs/technical_report/main.tex, table tab:results (window-mean training loss)"}'
    assert cited in text
    bad.write_text(text.replace(cited, "}", 1))
    with pytest.raises(ReportError, match=r"field 'claims.0.reported.values.0': .*'source' is a required property"):
        load_claims(bad)


def test_a_measured_claim_needs_a_number_and_a_summary_only_one_a_reason(tmp_path):
    bad = tmp_path / "claims.yaml"
    text = CLAIMS.read_text()
    bad.write_text(text.replace("      measured_at: 8B\n", "      measured_at: summary-only\n", 1))
    with pytest.raises(ReportError, match=r"field 'claims.0.reported'"):
        load_claims(bad)  # a summary-only claim with the paper's difference
    start = text.index("    reported: &t_events_summary_only\n")
    note = text.index("      note: >-\n", start)
    bad.write_text(text[:note] + text[text.index("  - id: t2048_saturation") :])
    # the events claims share that block (a YAML anchor): one of them is named
    ids = [c.id for c in load_claims(CLAIMS)[1]]
    shared = "|".join(str(ids.index(f"t2048_{event}")) for event in ("underflow", "saturation", "clipping"))
    with pytest.raises(ReportError, match=rf"field 'claims\.({shared})\.reported': .*'note' is a required property"):
        load_claims(bad)


def test_a_throughput_claim_names_the_shape_and_gpu_the_paper_timed(tmp_path):
    _, claims = load_claims(CLAIMS)
    setup = {c.id: c.reported.setup for c in claims}["throughput_no_rht_no_bf16_tail"]
    # the authors' report_summary.json (native_8b_runtime_ablation) and tab:runtime
    assert (setup.batch, setup.seq_len, setup.gpu, setup.device) == (1, 1024, "NVIDIA GB200", "gb200")
    assert setup.linears == (("nvfp4", 96, 16), ("nvfp4_no_rht_no_bf16_tail", 112, 0))
    # the authors' 8B, whose 112 internal linears the setup counts
    assert setup.model == "nemotron_h_8b_paper" and load_model_config(setup.model).n_layers == 52
    assert ARTIFACT_PATH.match(setup.source)
    assert setup.text().startswith("1 x 1,024 tokens on one NVIDIA GB200, linears FP4+BF16 nvfp4 96+16")
    assert all(c.reported.setup is None for c in claims if c.measure != "throughput")
    bad = tmp_path / "claims.yaml"
    text = CLAIMS.read_text()
    start = text.index("      setup:\n")
    bad.write_text(text[:start] + text[text.index("  - id: t2048_underflow") :])
    with pytest.raises(ReportError, match=r"field 'claims\.\d+\.reported': .*'setup' is a required property"):
        load_claims(bad)


def test_a_claim_under_each_recipes_own_policy_resolves_per_experiment():
    """paper8b evaluates each recipe's own policy (eval.policies has recipe): ue5m3 under the cold
    D = 50 replay and nvfp4 under the current amax, as the authors' validation protocol; tiny does
    not, and its line says that ue5m3's own policy was not evaluated."""
    claim = {c.id: c for c in load_claims(CLAIMS)[1]}["heldout_nll"]
    assert claim.policy == "recipe"
    paper = claim_policies(claim, load_study("paper8b"))
    assert paper.of == {"ue5m3": "replay", "nvfp4": "quantized"} and paper.not_evaluated == {}
    assert paper.text(claim) == "ue5m3 under replay, nvfp4 under quantized"
    tiny = claim_policies(claim, load_study("tiny"))
    assert tiny.of == {"ue5m3": "quantized", "nvfp4": "quantized"}
    assert tiny.not_evaluated == {"ue5m3": "replay: eval.policies lacks recipe"}
    assert tiny.text(claim) == "quantized policy (not evaluated under ue5m3's own, replay: eval.policies lacks recipe)"
    fixed = replace(claim, policy="bf16")
    assert claim_policies(fixed, load_study("paper8b")).of == {"ue5m3": "bf16", "nvfp4": "bf16"}
