"""The claims file: the packaged one is valid and a local one comes first; a broken one names
its field."""

from __future__ import annotations

import pytest
from synthetic_runs import CLAIMS

from fp4repro.config.files import claims_path
from fp4repro.report import ReportError, load_claims


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
