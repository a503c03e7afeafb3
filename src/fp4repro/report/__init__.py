"""``fp4repro report``: each claim of the claims file (``configs/claims.yaml``) beside what one
experiment measured, judged with paired statistics, written to ``paper/<experiment>/report.md``.

Each line gives the paper's claim (and magnitude, where the paper states one), the paper's own
difference and where it measured it (8B, 350M, or only its summary states the claim), ours (recipe /
baseline), the difference with its 95% interval, the test, its minimum detectable effect (MDE)
and the verdict; a section gives, per claim, the paper's scale and every number it reports, each
cited by its path in the authors' artifact. A claim whose inputs the experiment lacks (a recipe it
does not train, a measure no rule produces yet) says "not measured" and why, never silently dropped.

Inputs, per recipe and seed in the results layout (``fp4repro.results``):
    eval/<recipe>/seed<seed>/final_loss.json, nll.parquet, nll_documents.parquet, downstream.parquet,
                             downstream_items.parquet
    train/<recipe>/seed<seed>/metrics.parquet, telemetry.parquet

The modules, by job:
    claims              the claims file (``load_claims``), ``Claim`` with the paper's numbers (``Reported``,
                        ``PaperValue``), the report's ``Row``, ``ReportError``
    pairing             which runs a comparison reads and whether they pair (seeds, divergence, corpora)
    measures            the measures of training and evaluation, and ``measure``, which picks one per claim
    throughput_measure  throughput claims against the body-throughput benchmark files
    paper_numbers       the paper's numbers in the report: the table's cell, where each claim was measured,
                        the section with their scale and citations
    sections            the sections beyond the claims: events by refresh phase, the automatic target T
    numbers             how a row's numbers are written (its values, difference with interval, MDE)
    rendering           the Markdown (``render``, ``report_text``) and ``write_report``

Every public name is importable from here, as it was from the single module this package replaced.
"""

from __future__ import annotations

from fp4repro.report.claims import VERDICTS, Claim, PaperValue, Reported, ReportError, Row, load_claims
from fp4repro.report.measures import downstream, final_loss, heldout_nll, measure, telemetry
from fp4repro.report.numbers import difference_text
from fp4repro.report.pairing import shared_seeds
from fp4repro.report.paper_numbers import measured_where, paper_cell, paper_section
from fp4repro.report.rendering import (
    MECHANISMS,
    render,
    report_text,
    run_scale,
    runs_text,
    write_report,
)
from fp4repro.report.sections import (
    AUTO_RECIPE,
    FIXED_RIVALS,
    TARGET_ROLES,
    TargetRow,
    phase_rates,
    phase_section,
    target_comparison,
    target_recipes,
    target_rows,
    target_section,
)
from fp4repro.report.throughput_measure import throughput

__all__ = [
    "AUTO_RECIPE",
    "FIXED_RIVALS",
    "MECHANISMS",
    "TARGET_ROLES",
    "VERDICTS",
    "Claim",
    "PaperValue",
    "ReportError",
    "Reported",
    "Row",
    "TargetRow",
    "downstream",
    "final_loss",
    "heldout_nll",
    "load_claims",
    "measure",
    "measured_where",
    "paper_cell",
    "paper_section",
    "phase_rates",
    "phase_section",
    "difference_text",
    "render",
    "report_text",
    "run_scale",
    "runs_text",
    "shared_seeds",
    "target_comparison",
    "target_recipes",
    "target_rows",
    "target_section",
    "telemetry",
    "throughput",
    "write_report",
]
