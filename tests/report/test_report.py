"""The whole report: ``write_report``'s Markdown (verdicts, sections, figure links) and the
``fp4repro report`` command's count of the verdicts."""

from __future__ import annotations

from pathlib import Path

from synthetic_runs import BLEND, CLAIMS, write_run

from fp4repro.config.study import load_study
from fp4repro.report import load_claims, measure, write_report
from fp4repro.report.claims import claim_policies
from fp4repro.statistics import SUGGESTIVE


def test_write_report_writes_markdown_with_verdicts_and_figure_links(tmp_path, monkeypatch):
    results = tmp_path / "results"
    for recipe in ("bf16", "nvfp4", "ue5m3", "ue5m3_t448", "mxfp4", "nvfp4_first_last_bf16"):
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
    assert text.index("## Claims") < text.index("## Figures")
    # the automatic-T section compares the fixed-T recipes of the earlier numerics (the small study's
    # ue5m3 and ue5m3_t2048, fp4repro.report.sections); tiny studies one of them
    assert "## Beyond the paper: an automatic target T" not in text


def test_the_report_command_counts_the_verdicts(tmp_path, monkeypatch, capsys):
    from fp4repro.cli import main

    results = tmp_path / "results"
    for recipe in ("bf16", "nvfp4", "ue5m3", "ue5m3_t448", "mxfp4"):
        write_run(results, recipe, 0, loss=-0.1 if recipe == "ue5m3" else 0.0, underflow=0.002)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--experiment", "tiny"]) == 0
    out = capsys.readouterr().out
    rows = measure_all(results)
    measured = [r for r in rows if r.measured]
    assert f"wrote paper/tiny/report.md: {len(rows)} lines, {len(measured)} measured" in out
    assert f"{sum(r.verdict == SUGGESTIVE for r in measured)} {SUGGESTIVE}" in out


def measure_all(results: Path) -> list:
    study = load_study("tiny")
    runs = dict.fromkeys(("bf16", "nvfp4", "ue5m3", "ue5m3_t448", "mxfp4"), (0,))
    return [
        row
        for c in load_claims(CLAIMS)[1]
        for row in measure(c, results / "tiny", runs, claim_policies(c, study), BLEND)
    ]


def _tiny_runs(tmp_path, monkeypatch) -> Path:
    results = tmp_path / "results"
    for recipe in ("bf16", "nvfp4", "ue5m3", "ue5m3_t448", "mxfp4"):
        write_run(results, recipe, 0, loss=-0.1 if recipe == "ue5m3" else 0.0, underflow=0.002)
    monkeypatch.chdir(tmp_path)
    return results


def test_a_results_root_without_the_experiments_runs_leaves_the_report_as_it_was(tmp_path, monkeypatch, capsys):
    # issue 42: `fp4repro report --results reslts` (a typo) replaced the report by one of 0 measured lines
    from fp4repro.cli import main

    _tiny_runs(tmp_path, monkeypatch)
    assert main(["report", "--experiment", "tiny"]) == 0
    report = tmp_path / "paper" / "tiny" / "report.md"
    good = report.read_text()
    capsys.readouterr()
    assert main(["report", "--experiment", "tiny", "--results", "reslts"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "fp4repro report: error: no results of experiment 'tiny' under reslts/"
    )
    assert "paper/tiny/report.md was not written" in err and "--allow-empty" in err
    assert report.read_text() == good
    assert main(["report", "--experiment", "tiny", "--results", "reslts", "--allow-empty"]) == 0
    assert "0 measured" in capsys.readouterr().out and report.read_text() != good


def test_a_full_disk_writing_the_report_is_one_line_and_keeps_the_old_report(tmp_path, monkeypatch, capsys, full_disk):
    from fp4repro.cli import main

    _tiny_runs(tmp_path, monkeypatch)
    assert main(["report", "--experiment", "tiny"]) == 0
    report = tmp_path / "paper" / "tiny" / "report.md"
    good = report.read_text()
    capsys.readouterr()
    full_disk("report.md")
    assert main(["report", "--experiment", "tiny", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fp4repro report: error: disk full writing paper/tiny/report.md; ")
    assert err.endswith(" bytes free; nothing was replaced\n")
    assert report.read_text() == good and [p.name for p in report.parent.iterdir()] == ["report.md"]


def test_the_report_sets_the_papers_number_and_scale_beside_ours_with_their_citations(tmp_path, monkeypatch):
    _tiny_runs(tmp_path, monkeypatch)
    write_report(load_study("tiny"), "claims", "paper/tiny/report.md")
    text = (tmp_path / "paper/tiny/report.md").read_text()
    paper, claims = load_claims(CLAIMS)
    where = next(line for line in text.splitlines() if line.startswith("- **Where the paper measured its claims:**"))
    assert (
        "measured by the paper at 8B: final_loss, heldout_nll, downstream, te_settings_final_loss, "
        "te_settings_heldout_nll, gemm_model_final_loss, block_size_final_loss, throughput_no_rht_no_bf16_tail;"
    ) in where
    assert "at 350M only, not at 8B: final_loss_t2048 (the paper has no isolated T ablation at 8B)" in where
    assert "stated only by the paper's summary, not measured in the paper: t2048_underflow" in where
    assert paper["artifact"] in where
    # what tiny can say about the paper's run: tiny's and paper8b's sizes, counted from their configs
    scale = text[text.index("## What this scale can and cannot say about the paper's") :].split("\n## ")[0]
    tiny, paper8b = load_study("tiny"), load_study("paper8b")
    assert f"the paper trained 8,084,075,520 on {30_000 * 768 * 8_192:,} (23.3 per parameter" in scale
    assert f"on {tiny.experiment.train.trained_tokens:,} tokens" in scale and "after 30,000 steps" in scale
    assert paper8b.experiment.train.total_steps == 30_000
    # and the headline pair's reading at tiny's size (fp4repro.report.scale, tests/report/test_scale.py)
    assert "**The headline comparison, ue5m3 − nvfp4, at 1.1M parameters and " in scale
    assert "- final_loss: " in scale and "the paper's direction holds beyond noise on 0 of " in scale
    table = [line for line in text.splitlines() if line.startswith("| ")]
    section = text[text.index("## The paper's own numbers") :]
    for c in claims:
        reported = c.reported
        rows = [line for line in table if line.startswith((f"| {c.id} |", f"| {c.id}: "))]
        assert rows, c.id
        # beside ours: the paper's difference (or why there is none) and where it was measured
        beside = (
            "; ".join(d.text(signed=True) for d in reported.difference) + f" ({reported.measured_at})"
            if reported.difference
            else f"no number: {reported.where}"
        )
        assert all(f"| {beside} | {c.recipe} / {c.baseline} |" in row for row in rows), c.id
        entry = section[section.index(f"### {c.id}: {reported.where}\n") :].split("\n### ")[0]
        assert f"**Paper's scale:** {reported.scale}." in entry, c.id
        for d in reported.difference:
            assert f"- **Paper's difference:** {d.text(signed=True)} ({d.source})" in entry, (c.id, d.of)
        for v in reported.values:
            assert f"- {v.text(signed=' − ' in v.of)} ({v.source})" in entry, (c.id, v.of)
        assert reported.note in entry
        if reported.setup is not None:
            assert f"- **Paper's setup:** {reported.setup.text()} ({reported.setup.source})" in entry, c.id
    assert "- **Paper's setup:** 1 x 1,024 tokens on one NVIDIA GB200, linears FP4+BF16 nvfp4 96+16" in text
    assert "- **Paper's difference:** ue5m3 − nvfp4: -0.0384 (docs/technical_report/main.tex, table tab:results" in text
    assert "- ue5m3_te_settings − nvfp4: -0.02217 [-0.02501, -0.01951] (reproduce/reference_results/" in text
