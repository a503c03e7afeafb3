"""What a study at this suite's scale can and cannot say about the paper's 8B: the report's
section, its ratios computed from the study's model and tokens and from those of the experiment
that trains the paper's run as the authors did (``paper.experiment`` of the claims file:
``paper8b``, its model ``nemotron_h_8b_paper``), and its reading of the headline comparison (the
claims file's first claim and every claim of the same recipe and baseline) at this scale."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fp4repro.report.claims import Row
from fp4repro.report.numbers import difference_text, value_text
from fp4repro.statistics import NO_DIFFERENCE, OPPOSITE, REPRODUCED, SUGGESTIVE, WITHIN_NOISE

# the measures whose paper difference is in our unit (nats per token), so that its size can be set
# against our interval; the downstream aggregates here are offline stand-ins for the paper's OLMES
# benchmarks, whose differences are in points of other tasks
SAME_UNIT_MEASURES = ("final_loss", "heldout_nll")


def _millions(n: int) -> str:
    return f"{n / 1e6:,.0f}M" if n >= 1e8 else f"{n / 1e6:,.1f}M"


def direction_text(row: Row) -> str:
    """Where a measured row's interval lies against the paper's direction, in words."""
    verdict = row.verdict
    if verdict == REPRODUCED:
        return "the paper's direction, beyond noise"
    if verdict == SUGGESTIVE:
        return "the paper's direction beyond the test's noise, from one seed (suggestive)"
    if verdict == WITHIN_NOISE:
        return "the paper's sign, within noise"
    if verdict == OPPOSITE:
        return "the other direction, beyond noise" if _against(row) else "the other sign, within noise"
    assert verdict == NO_DIFFERENCE, verdict
    return "no difference"


def _against(row: Row) -> bool:
    """Whether a measured row's interval lies wholly on the other side of 0 than the paper's."""
    k = row.comparison
    return k.low > 0 if row.claim.expect == "lower" else k.high < 0


def paper_size(row: Row) -> float | None:
    """The paper's 8B difference where it is in our unit and can be set against a measured row's
    interval (a loss or an NLL, one number, over seeds: not a one-run interval), else None."""
    reported = row.claim.reported
    if (
        row.claim.measure not in SAME_UNIT_MEASURES
        or row.capped
        or reported is None
        or reported.measured_at != "8B"
        or len(reported.difference) != 1
        or reported.difference[0].unit != ""
    ):
        return None
    return reported.difference[0].value


def size_reading(row: Row) -> str:
    """Where the paper's 8B difference lies against a measured row's interval: "inside", "rejected"
    (the interval lies wholly between it and 0: a difference that large is rejected at the 5%
    level), "exceeded" (the interval lies wholly beyond it, away from 0), or "" (no such number)."""
    paper, k = paper_size(row), row.comparison
    if paper is None:
        return ""
    if k.low <= paper <= k.high:
        return "inside"
    beyond = k.low > paper if paper < 0 else k.high < paper  # the interval on 0's side of it
    return "rejected" if beyond else "exceeded"


SIZE_TEXT = {
    "": "",
    "inside": "; the paper's 8B difference, {paper:+.4f}, lies inside the interval",
    "rejected": "; the paper's 8B difference, {paper:+.4f}, lies outside it: a difference that large is rejected "
    "at the 5% level at this scale",
    "exceeded": "; the paper's 8B difference, {paper:+.4f}, lies outside it: ours is larger at the 5% level",
}


def headline_rows(rows: Sequence[Row]) -> list[Row]:
    """The measured rows of the headline comparison: the recipe and baseline of the first row's claim."""
    if not rows:
        return []
    pair = (rows[0].claim.recipe, rows[0].claim.baseline)
    return [r for r in rows if r.measured and (r.claim.recipe, r.claim.baseline) == pair]


def _measure_line(row: Row) -> str:
    k = row.comparison
    if not all(math.isfinite(v) for v in (k.difference, k.low, k.high)):
        return f"- {row.label}: not finite ({k.test.split(',')[0]})."
    reading = size_reading(row)
    return (
        f"- {row.label}: {difference_text(row)} ({k.test.split(',')[0]}; MDE {value_text(row, k.mde)}): "
        f"{direction_text(row)}{SIZE_TEXT[reading].format(paper=paper_size(row))}."
    )


def _labels(rows: list[Row]) -> str:
    return ", ".join(r.label for r in rows)


def headline_lines(rows: Sequence[Row], ours: tuple[int, int], papers: tuple[int, int, int]) -> list[str]:
    """The headline comparison at this scale, one line per measure and what they say together:
    whether the paper's direction holds at this size (``ours``: parameters, training tokens) and
    what that does and does not say about the paper's (``papers``: parameters, tokens, steps)."""
    headline = headline_rows(rows)
    if not headline:
        return []
    (parameters, tokens), (p_params, p_tokens, _) = ours, papers
    c = headline[0].claim
    finite = [r for r in headline if math.isfinite(r.comparison.difference)]
    held = [r for r in finite if r.verdict == REPRODUCED]
    suggestive = [r for r in finite if r.verdict == SUGGESTIVE]
    against = [r for r in finite if r.verdict == OPPOSITE and _against(r)]
    rejected = [r for r in finite if size_reading(r) == "rejected"]
    size = f"{_millions(parameters)} parameters and {_millions(tokens)} training tokens"
    smaller = (
        f"a model {p_params / parameters:,.0f}x smaller than the paper's, trained on "
        f"{p_tokens / tokens:,.0f}x fewer tokens"
    )
    lines = ["", f"**The headline comparison, {c.recipe} − {c.baseline}, at {size}:**", ""]
    lines += [_measure_line(r) for r in headline]
    n = len(headline)
    said = [
        f"At {size} the paper's direction holds beyond noise on {len(held)} of {n} measure{'s' if n > 1 else ''}"
        + (f", and is suggestive on {len(suggestive)} ({_labels(suggestive)})" if suggestive else "")
        + "."
    ]
    if against:
        said.append(f"The other direction holds beyond noise on {_labels(against)}.")
    if rejected:
        said.append(
            f"On {_labels(rejected)} a difference as large as the paper's 8B one is rejected at the 5% level: on "
            f"{smaller}, the gap is smaller than the paper's, if there is one."
        )
    if len(held) == n:
        said.append(
            f"For the paper's 8B this is a consistency check: how large the difference is after {p_tokens:,} "
            "tokens only a run at that scale can say."
        )
    elif not (against or rejected):
        said.append(
            "This is inconclusive at this scale: the intervals contain 0 and, where the paper gives a difference "
            "in our unit, its 8B size."
        )
    else:
        said.append(
            f"It does not say that the difference is absent at 8B after {p_tokens:,} tokens, where the paper "
            "measured one run per recipe without an interval: only a run at that scale can."
        )
    return lines + ["", " ".join(said)]


def scale_paragraph(
    ours: tuple[int, int], papers: tuple[int, int, int], paper_experiment: str, rows: Sequence[Row] = ()
) -> list[str]:
    """The section's Markdown lines: ``ours`` is (parameters, training tokens), ``papers``
    (parameters, training tokens, optimizer steps), ``rows`` the report's lines (``headline_lines``)."""
    (parameters, tokens), (p_params, p_tokens, p_steps) = ours, papers
    ours_per_param, paper_per_param = tokens / parameters, p_tokens / p_params
    return [
        "",
        "## What this scale can and cannot say about the paper's",
        "",
        f"This study trains {parameters:,} parameters on {tokens:,} tokens ({ours_per_param:.2f} tokens per "
        f"parameter); the paper trained {p_params:,} on {p_tokens:,} ({paper_per_param:.1f} per parameter, as "
        f"experiment `{paper_experiment}` trains them): {p_params / parameters:,.0f}x the parameters and "
        f"{p_tokens / tokens:,.0f}x the tokens. It can say whether a recipe's numerics move the training "
        "loss, the held-out NLL and the offline downstream aggregates in the paper's direction on the same "
        "family of hybrid models early in training, beyond the seed-to-seed noise it measures, and how often "
        "each quantization event happens per operand, where a held amax or a raised T acts. It cannot say "
        f"how large any difference is at the paper's scale after {p_steps:,} steps: FP4 training effects "
        "grow or shrink with width and training length, and a model this far from the paper's tokens per "
        "parameter is early in training where the paper reads its results at the end. Nor can it speak for "
        "the paper's OLMES benchmarks (the aggregates here are offline stand-ins), or for native FP4 speed "
        "where the throughput row says it was not measured natively. A verdict here is a consistency check "
        "of direction, not a confirmation of size.",
        *headline_lines(list(rows), ours, papers),
    ]
