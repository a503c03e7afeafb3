"""What a study at this suite's scale can and cannot say about the paper's 8B: the report's
paragraph, its ratios computed from the study's model and tokens and from those of the
experiment that trains the paper's run as the authors did (``paper.experiment`` of the claims
file: ``paper8b``, its model ``nemotron_h_8b_paper``)."""

from __future__ import annotations


def scale_paragraph(ours: tuple[int, int], papers: tuple[int, int, int], paper_experiment: str) -> list[str]:
    """The section's Markdown lines: ``ours`` is (parameters, training tokens), ``papers``
    (parameters, training tokens, optimizer steps)."""
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
    ]
