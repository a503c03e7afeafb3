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


def _row(claim: Claim, difference: float, low: float, high: float, label: str = "", capped: bool = False) -> Row:
    comparison = Comparison(difference, low, high, 0.005, "paired t over 8 seeds", 8, 0.0165, seed_sd=0.007)
    return Row(claim, label or claim.id, 2.7, 2.7, comparison, capped=capped)


def _text(rows: list[Row]) -> str:
    return "\n".join(headline_lines(rows, SMALL, PAPER))


def test_a_loss_of_the_other_sign_within_noise_that_rejects_the_papers_size():
    text = _text([_row(LOSS, 0.0055, -0.0065, 0.0174)])
    assert "**The headline comparison, ue5m3 − nvfp4, at 134M parameters and 24.6M training tokens:**" in text
    assert (
        "- final_loss: +0.0055 [-0.0065, +0.0174] (paired t over 8 seeds; MDE 0.0165): the other sign, within "
        "noise; the paper's 8B difference, -0.0384, lies outside it: a difference that large is rejected at the 5% "
        "level at this scale."
    ) in text
    assert "the paper's direction holds beyond noise on 0 of 1 measure." in text
    assert "On final_loss a difference as large as the paper's 8B one is rejected at the 5% level" in text
    assert "61x smaller than the paper's, trained on 7,680x fewer tokens" in text
    assert "It does not say that the difference is absent at 8B after 188,743,680,000 tokens" in text


def test_an_interval_holding_both_0_and_the_papers_size_is_inconclusive():
    text = _text([_row(LOSS, -0.01, -0.05, 0.03)])
    assert "the paper's sign, within noise; the paper's 8B difference, -0.0384, lies inside the interval." in text
    assert "This is inconclusive at this scale: the intervals contain 0 and" in text
    assert "rejected" not in text and "absent" not in text


def test_a_loss_beyond_noise_either_way_and_larger_than_the_papers():
    held = _text([_row(LOSS, -0.03, -0.05, -0.01)])
    assert "the paper's direction, beyond noise; the paper's 8B difference, -0.0384, lies inside the interval" in held
    assert "holds beyond noise on 1 of 1 measure." in held and "a consistency check" in held
    larger = _text([_row(LOSS, -0.07, -0.09, -0.05)])
    assert "-0.0384, lies outside it: ours is larger at the 5% level." in larger and "rejected" not in larger
    against = _text([_row(LOSS, 0.02, 0.01, 0.03)])
    assert "the other direction, beyond noise; the paper's 8B difference, -0.0384, lies outside" in against
    assert "The other direction holds beyond noise on final_loss." in against and "inconclusive" not in against


def test_a_one_seed_row_is_suggestive_and_its_interval_is_not_set_against_the_papers_size():
    text = _text([_row(LOSS, -0.03, -0.05, -0.01, capped=True)])
    assert "the paper's direction beyond the test's noise, from one seed (suggestive)." in text
    assert "holds beyond noise on 0 of 1 measure, and is suggestive on 1 (final_loss)." in text
    assert "-0.0384" not in text


def test_a_row_that_is_not_finite_says_so():
    text = _text([_row(LOSS, float("nan"), float("nan"), float("nan"))])
    assert "- final_loss: not finite (paired t over 8 seeds)." in text and "nan" not in text


def test_only_the_first_claims_pair_is_read_and_only_a_loss_is_set_against_the_papers_size():
    cloze = replace(LOSS, id="downstream", measure="downstream", expect="higher", paper="UE5M3 > NVFP4")
    other_pair = replace(LOSS, id="te_settings_final_loss", recipe="ue5m3_te_settings")
    rows = [
        _row(LOSS, -0.03, -0.05, -0.01),
        _row(cloze, 0.01, 0.002, 0.018, label="downstream: cloze"),
        Row(replace(LOSS, id="heldout_nll"), "heldout_nll", note="not measured: no evaluation"),
        _row(other_pair, -0.03, -0.05, -0.01),
    ]
    text = _text(rows)
    assert "- downstream: cloze: +0.0100 [+0.0020, +0.0180] (paired t over 8 seeds; MDE 0.0165): the paper's " in text
    cloze_line = next(line for line in text.splitlines() if line.startswith("- downstream: cloze"))
    assert cloze_line.endswith("the paper's direction, beyond noise.")
    assert "te_settings" not in text and "heldout_nll" not in text
    assert "holds beyond noise on 2 of 2 measures." in text
    mixed = _text([rows[0], _row(cloze, -0.01, -0.02, 0.0, "downstream: cloze")])
    assert "the other sign, within noise" in mixed and "holds beyond noise on 1 of 2 measures." in mixed
    assert headline_lines([rows[2]], SMALL, PAPER) == []
