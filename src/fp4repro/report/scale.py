"""What a study at this suite's scale can and cannot say about the paper's 8B: the report's
section, its ratios computed from the study's model and tokens and from those of the experiment
that trains the paper's run as the authors did (``paper.experiment`` of the claims file:
``paper8b``, its model ``nemotron_h_8b_paper``), and its reading of the headline comparison (the
claims file's first claim and every claim of the same recipe and baseline) at this scale."""

from __future__ import annotations

from fp4repro.report.claims import Row
from fp4repro.statistics import NO_DIFFERENCE, OPPOSITE, REPRODUCED, SUGGESTIVE, WITHIN_NOISE

# the measures whose paper difference is in our unit (nats per token), so that its size can be set
# against our interval; the downstream aggregates here are offline stand-ins for the paper's OLMES
# benchmarks, whose differences are in points of other tasks
SAME_UNIT_MEASURES = ("final_loss", "heldout_nll")


def _millions(n: int) -> str:
    return f"{n / 1e6:,.0f}M" if n >= 1e8 else f"{n / 1e6:,.1f}M"


def direction_text(row: Row) -> str:
    """Where a measured row's interval lies against the paper's direction, in words."""
    k, verdict = row.comparison, row.verdict
    if verdict == REPRODUCED:
        return "the paper's direction, beyond noise"
    if verdict == SUGGESTIVE:
        return "the paper's direction beyond the test's noise, from one seed"
    if verdict == WITHIN_NOISE:
        return "the paper's sign, within noise"
    if verdict == OPPOSITE:
        beyond = k.low > 0 if row.claim.expect == "lower" else k.high < 0
        return "the other direction, beyond noise" if beyond else "the other sign, within noise"
    assert verdict == NO_DIFFERENCE, verdict
    return "no difference"


def size_text(row: Row) -> str:
    """Whether the paper's 8B difference lies inside a measured row's interval ("" where the paper
    gives no difference in our unit)."""
    reported, k = row.claim.reported, row.comparison
    same_unit = (
        row.claim.measure in SAME_UNIT_MEASURES
        and reported is not None
        and reported.measured_at == "8B"
        and len(reported.difference) == 1
        and reported.difference[0].unit == ""
    )
    if not same_unit:
        return ""
    paper = reported.difference[0].value
    if k.low <= paper <= k.high:
        return f"; the paper's 8B difference, {paper:+.4f}, lies inside the interval"
    return (
        f"; the paper's 8B difference, {paper:+.4f}, lies outside it: a difference of that size is not "
        "there at this scale"
    )


def headline_rows(rows: list[Row]) -> list[Row]:
    """The measured rows of the headline comparison: the recipe and baseline of the first row's claim."""
    if not rows:
        return []
    pair = (rows[0].claim.recipe, rows[0].claim.baseline)
    return [r for r in rows if r.measured and (r.claim.recipe, r.claim.baseline) == pair]


def headline_lines(rows: list[Row], ours: tuple[int, int], papers: tuple[int, int, int]) -> list[str]:
    """The headline comparison at this scale, one line per measure and what they say together:
    whether the paper's direction holds at this size (``ours``: parameters, training tokens) and
    what that does and does not say about the paper's (``papers``: parameters, tokens, steps)."""
    headline = headline_rows(rows)
    if not headline:
        return []
    (parameters, tokens), (p_params, p_tokens, _) = ours, papers
    c = headline[0].claim
    held = sum(r.verdict == REPRODUCED for r in headline)
    size = f"{_millions(parameters)} parameters and {_millions(tokens)} training tokens"
    lines = [
        "",
        f"**The headline comparison, {c.recipe} − {c.baseline}, at {size}:**",
        "",
    ]
    for r in headline:
        k = r.comparison
        lines.append(
            f"- {r.label}: {k.difference:+.4f} [{k.low:+.4f}, {k.high:+.4f}] ({k.test.split(',')[0]}; MDE "
            f"{k.mde:.4f}): {direction_text(r)}{size_text(r)}."
        )
    smaller = f"a model {p_params / parameters:,.0f}x smaller than the paper's, early in training"
    if held == len(headline):
        verdict = f"holds beyond noise on every measure ({held} of {len(headline)})"
        reading = (
            f"For the paper's 8B this is a consistency check: the formats' difference points the paper's way on "
            f"{smaller}; how large it is after {p_tokens:,} tokens only a run at that scale can say."
        )
    else:
        verdict = (
            f"holds beyond noise on {held} of {len(headline)} measures"
            if held
            else f"does not hold beyond noise on any of the {len(headline)} measures"
        )
        reading = (
            f"For the paper's 8B this says that the difference is not one the formats show at every scale and "
            f"training length: on {smaller}, the intervals above bound it. It does not say that the difference "
            f"is absent at 8B after {p_tokens:,} tokens, where the paper measured one run per recipe without an "
            "interval: only a run at that scale can."
        )
    lines += ["", f"At {size} the paper's direction ({c.paper}) {verdict}. {reading}"]
    return lines


def scale_paragraph(
    ours: tuple[int, int], papers: tuple[int, int, int], paper_experiment: str, rows: list[Row] = ()
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
