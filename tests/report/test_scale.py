"""The report's reading of the headline comparison at the study's scale: per measure where its
interval lies against the paper's direction and whether the paper's 8B difference lies inside it,
and what the measures say together about the paper's 8B."""

from __future__ import annotations

from dataclasses import replace

from fp4repro.report.claims import Claim, PaperValue, Reported, Row
from fp4repro.report.scale import headline_lines
from fp4repro.statistics import Comparison

SMALL = (133_589_920, 24_576_000)  # the small study's parameters and tokens
PAPER = (8_084_075_520, 188_743_680_000, 30_000)
LOSS = Claim(
    id="final_loss",
    claim="UE5M3 ends with a lower loss",
    measure="final_loss",
    recipe="ue5m3",
    baseline="nvfp4",
    expect="lower",
    paper="UE5M3 < NVFP4",
    reported=Reported("8B", "8B", difference=(PaperValue(-0.0384, "main.tex"),)),
)


def _row(claim: Claim, difference: float, low: float, high: float, label: str = "") -> Row:
    comparison = Comparison(difference, low, high, 0.005, "paired t over 8 seeds", 8, 0.0165, seed_sd=0.007)
    return Row(claim, label or claim.id, 2.7, 2.7, comparison)


def test_a_loss_of_the_other_sign_within_noise_and_the_papers_size_outside_the_interval():
    text = "\n".join(headline_lines([_row(LOSS, 0.0055, -0.0065, 0.0174)], SMALL, PAPER))
    assert "**The headline comparison, ue5m3 − nvfp4, at 134M parameters and 24.6M training tokens:**" in text
    assert (
        "- final_loss: +0.0055 [-0.0065, +0.0174] (paired t over 8 seeds; MDE 0.0165): the other sign, within "
        "noise; the paper's 8B difference, -0.0384, lies outside it: a difference of that size is not there"
    ) in text
    assert "(UE5M3 < NVFP4) does not hold beyond noise on any of the 1 measures" in text
    assert "on a model 61x smaller than the paper's" in text and "after 188,743,680,000 tokens" in text
    assert "It does not say that the difference is absent at 8B" in text


def test_a_loss_beyond_noise_either_way_and_the_papers_size_inside_the_interval():
    held = "\n".join(headline_lines([_row(LOSS, -0.03, -0.05, -0.01)], SMALL, PAPER))
    assert "the paper's direction, beyond noise; the paper's 8B difference, -0.0384, lies inside the interval" in held
    assert "holds beyond noise on every measure (1 of 1)" in held and "a consistency check" in held
    against = "\n".join(headline_lines([_row(LOSS, 0.02, 0.01, 0.03)], SMALL, PAPER))
    assert "the other direction, beyond noise; the paper's 8B difference, -0.0384, lies outside" in against


def test_only_the_first_claims_pair_is_read_and_only_a_loss_is_set_against_the_papers_size():
    cloze = replace(LOSS, id="downstream", measure="downstream", expect="higher", paper="UE5M3 > NVFP4")
    other_pair = replace(LOSS, id="te_settings_final_loss", recipe="ue5m3_te_settings")
    rows = [
        _row(LOSS, -0.03, -0.05, -0.01),
        _row(cloze, 0.01, 0.002, 0.018, label="downstream: cloze"),
        _row(other_pair, -0.03, -0.05, -0.01),
        Row(replace(LOSS, id="heldout_nll"), "heldout_nll", note="not measured: no evaluation"),
    ]
    text = "\n".join(headline_lines(rows, SMALL, PAPER))
    assert "- downstream: cloze: +0.0100 [+0.0020, +0.0180] (paired t over 8 seeds; MDE 0.0165): the paper's " in text
    cloze_line = next(line for line in text.splitlines() if line.startswith("- downstream: cloze"))
    assert cloze_line.endswith("the paper's direction, beyond noise.")
    assert "te_settings" not in text and "heldout_nll" not in text
    assert "holds beyond noise on every measure (2 of 2)" in text
    mixed = "\n".join(headline_lines([rows[0], _row(cloze, -0.01, -0.02, 0.0, "downstream: cloze")], SMALL, PAPER))
    assert "the other sign, within noise" in mixed and "holds beyond noise on 1 of 2 measures" in mixed
    assert headline_lines([rows[3]], SMALL, PAPER) == []
