"""The whole report: ``write_report``'s Markdown (verdicts, sections, figure links) and the
``fp4repro report`` command's count of the verdicts."""

from __future__ import annotations

from pathlib import Path

from synthetic_runs import BLEND, CLAIMS, write_run

from fp4repro.config.study import load_study
from fp4repro.report import load_claims, measure, write_report
from fp4repro.statistics import SUGGESTIVE


def test_write_report_writes_markdown_with_verdicts_and_figure_links(tmp_path, monkeypatch):
    results = tmp_path / "results"
    for recipe in ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4", "nvfp4_first_last_bf16"):
        write_run(results, recipe, 0, loss=-0.1 if recipe == "ue5m3" else 0.0, underflow=0.002, clipped=0.001)
    monkeypatch.chdir(tmp_path)
    write_report(load_study("tiny"), "claims", "paper/tiny/report.md", figures=["figures/tiny/loss.png"])
    text = (tmp_path / "paper/tiny/report.md").read_text()
    assert "from experiment `tiny`" in text and "1,078,464 parameters" in text and "seeds bf16 0; " in text
    assert "![loss](../../figures/tiny/loss.png)" in text
    assert "| throughput_no_rht_no_bf16_tail | more model-body tokens/s (+21.2% tokens/s) |" in text
    loss_line = next(line for line in text.splitlines() if line.startswith("| final_loss |"))
    assert "batch means" in loss_line and f"**{SUGGESTIVE}**" in loss_line
    assert "Mechanism: an element clipped at ±6" in text
    # beyond the paper (ue5m3 and ue5m3_t2048 are studied): after the claims, before the figures
    assert text.index("## Claims") < text.index("## Beyond the paper: an automatic target T") < text.index("## Figures")
    assert (
        "| ue5m3_t2048 |" in text
        and "- ue5m3_auto has no results here (not among the recipes, or not run yet): no comparison." in text
    )


def test_the_report_command_counts_the_verdicts(tmp_path, monkeypatch, capsys):
    from fp4repro.cli import main

    results = tmp_path / "results"
    for recipe in ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4"):
        write_run(results, recipe, 0, loss=-0.1 if recipe == "ue5m3" else 0.0, underflow=0.002)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--experiment", "tiny"]) == 0
    out = capsys.readouterr().out
    rows = measure_all(results)
    measured = [r for r in rows if r.measured]
    assert f"wrote paper/tiny/report.md: {len(rows)} lines, {len(measured)} measured" in out
    assert f"{sum(r.verdict == SUGGESTIVE for r in measured)} {SUGGESTIVE}" in out


def measure_all(results: Path) -> list:
    return [
        row
        for c in load_claims(CLAIMS)[1]
        for row in measure(
            c, results / "tiny", dict.fromkeys(("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4"), (0,)), BLEND
        )
    ]
