"""The report as Markdown: ``render`` (the claims' table, each claim's note and mechanism, the
sections beyond the paper, the figures), its helpers (``runs_text``, ``run_scale``, the number
formats), and ``write_report``, which measures every claim of a study and writes the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from fp4repro.config.files import claims_path
from fp4repro.config.study import load_study
from fp4repro.report.claims import ReportError, Row, claim_policies, load_claims
from fp4repro.report.measures import measure
from fp4repro.report.pairing import _divergences, _numerics
from fp4repro.report.paper_numbers import claims_of, measured_where, paper_cell, paper_section
from fp4repro.report.run_spread import spread_section
from fp4repro.report.scale import scale_paragraph
from fp4repro.report.sections import phase_section, target_section
from fp4repro.results import eval_dir, run_dir, study_runs
from fp4repro.util import atomic_write_text

# Said after a telemetry claim's note: how its event arises in the format, and why moving T should
# move it as the claim says (or cannot).
MECHANISMS = {
    "underflow": "a non-zero block whose scale rounds to zero in the scale format (below UE5M3's 2^-17) loses "
    "every element; raising T lifts every block scale by T'/T, so fewer small blocks fall below",
    "saturation": "a block scale clamped at the format's maximum (61,440 for UE5M3) clips the block; raising T "
    "lifts every block scale, so it can only add saturation: the paper's claim needs another reading",
    "clipping": "an element clipped at ±6 although its block scale was not clamped: a block whose scale lands in "
    "the format's subnormal range is rounded down by up to a third, pushing its largest elements past 6 "
    "(with RNE only such blocks clip); raising T moves small blocks out of that range. With stochastic "
    "rounding (dY in every FP4 recipe here) every element above 6 counts, so about half of all blocks, "
    "those whose 3-bit-mantissa scale rounded down, clip their largest element whatever T is: the "
    "T effect is a small change on that base",
}


def _fmt(row: Row, value: float) -> str:
    return f"{value:.3e}" if row.claim.measure == "telemetry" else f"{value:.4f}"


def _signed(row: Row, value: float) -> str:
    return f"{value:+.2e}" if row.claim.measure == "telemetry" else f"{value:+.4f}"


def mde_text(row: Row) -> str:
    """A measured row's MDE, and where the plan pairs more seeds than it has, the MDE projected to
    them from the seed spread so far and from its 80% upper bound ("0.0627; 8 seeds: ~0.0233,
    ≤ 0.0494")."""
    k, n = row.comparison, row.planned_seeds
    projected = k.mde_at(n) if n else None
    if projected is None:
        return _fmt(row, k.mde)
    return f"{_fmt(row, k.mde)}; {n} seeds: ~{_fmt(row, projected)}, ≤ {_fmt(row, k.mde_at(n, upper=True))}"


def difference_text(row: Row) -> str:
    """A measured row's difference with its 95% interval, as the report's table gives it."""
    k = row.comparison
    return f"{_signed(row, k.difference)} [{_signed(row, k.low)}, {_signed(row, k.high)}]"


def numerics_text(root: Path, runs: dict[str, tuple[int, ...]]) -> str:
    """Which numerics the runs were computed with (``fp4repro.config.numerics``), as a clause for
    the report's header: one fingerprint, or the runs of each where they differ (such runs are never
    paired)."""
    if not runs:
        return ""
    by_value: dict[str, list[str]] = {}
    for recipe, seeds in runs.items():
        for run, value in _numerics(root, (recipe,), seeds).items():
            by_value.setdefault(value, []).append(run)
    if len(by_value) == 1:
        return f"; numerics {next(iter(by_value))}"
    return "; numerics " + "; ".join(f"{value}: {', '.join(names)}" for value, names in by_value.items())


def runs_text(runs: dict[str, tuple[int, ...]], planned: dict[str, tuple[int, ...]]) -> str:
    """The seeds of each recipe's runs, and the planned runs that are not there (an imported
    experiment's runs arrive a few at a time)."""
    text = (
        "seeds " + "; ".join(f"{recipe} {', '.join(map(str, seeds))}" for recipe, seeds in runs.items())
        if runs
        else "no runs yet"
    )
    missing = [
        f"{recipe} seed {seed}"
        for recipe, seeds in planned.items()
        for seed in seeds
        if seed not in runs.get(recipe, ())
    ]
    if missing:
        total = sum(map(len, planned.values()))
        text += f" ({total - len(missing)} of {total} planned runs; not there yet: {', '.join(missing)})"
    return text


def render(
    paper: dict,
    rows: list[Row],
    exp,
    scale: str,
    figures: list[Path],
    out: Path,
    beyond: list[str] = (),
    diverged: list[str] = (),
    runs: str = "",
    scale_note: list[str] = (),
) -> str:
    """The report as Markdown (figure links relative to the report's folder); ``beyond``: the lines
    of sections beyond the paper's claims (``target_section``), after the claims; ``diverged``: the
    runs whose loss became non-finite (``_divergences``), results in their own right; ``runs``:
    which runs it reads (``runs_text``); ``scale_note``: what this scale can say about the paper's
    (``fp4repro.report.scale``), after the claims."""
    lines = [
        f"# Reproduction report: {paper['title']}",
        "",
        f"Generated by `fp4repro report` from experiment `{exp.name}`; rerun the workflow to refresh it.",
        "",
        f"- **Paper's scale:** {paper['scale']}.",
        f"- **This run's scale:** {scale}; {runs}.",
        *measured_where(claims_of(rows), paper.get("artifact")),
        "- **Reading it:** *difference* is recipe − baseline on paired units (the same seeds, batches, "
        "documents, items) with its 95% interval; *MDE* is the smallest true difference the test would "
        "detect (80% power, 5% level), and while the plan's seeds are not all made, the MDE they would "
        "give with the seed spread measured so far and with its 80% upper bound (*N seeds: ~point, ≤ "
        "bound*; with a few seeds the spread is poorly known). *reproduced*: the interval lies "
        "wholly on the paper's side of 0; "
        "*same direction, within noise*: the paper's sign but an interval that includes 0; *opposite "
        "direction*: the other sign; *suggestive*: beyond the test's noise, but one seed cannot tell a "
        "recipe's effect on training from the seed's. A direction at a scale this far below the paper's "
        "is a consistency check, not a confirmation.",
        "",
        *(
            [f"- **Diverged runs:** {'; '.join(diverged)}. The claims that involve them are not paired.", ""]
            if diverged
            else []
        ),
        "| claim | paper | paper's difference (scale) | recipe / baseline | ours (recipe / baseline) | "
        "difference [95% interval] | test | MDE | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        c = row.claim
        paper_says = c.paper + (f" ({c.magnitude})" if c.magnitude and c.magnitude not in c.paper else "")
        paper_says += f" | {paper_cell(c)}"
        if not row.measured:
            lines.append(
                f"| {row.label} | {paper_says} | {c.recipe} / {c.baseline} | {row.note} | | | | {row.verdict} |"
            )
            continue
        k = row.comparison
        lines.append(
            f"| {row.label} | {paper_says} | {c.recipe} / {c.baseline} | {_fmt(row, row.recipe_value)} / "
            f"{_fmt(row, row.baseline_value)} | {difference_text(row)} | {k.test} | {mde_text(row)} | "
            f"**{row.verdict}** |"
        )
    lines += list(scale_note)
    lines += ["", "## Claims", ""]
    for row in rows:
        mechanism = f" Mechanism: {MECHANISMS[row.claim.event]}." if row.claim.event in MECHANISMS else ""
        lines.append(
            f"- **{row.label}** — {row.claim.claim}. {row.note}".rstrip() + ("." if row.note else "") + mechanism
        )
    lines += paper_section(claims_of(rows))
    lines += list(beyond)
    if figures:
        lines += ["", "## Figures", ""]
        for fig in figures:
            rel = os.path.relpath(fig, out.parent)
            lines += [f"### {fig.stem}", "", f"![{fig.stem}]({Path(rel).as_posix()})", ""]
    return "\n".join(lines).rstrip() + "\n"


def model_parameters(study) -> int:
    """The parameters of the study's model (built on the meta device: no memory)."""
    import torch

    from fp4repro.model import NemotronH

    with torch.device("meta"):
        return NemotronH(study.model, None).num_parameters()


def run_scale(study, params: int) -> str:
    """The study's scale in words: its model with ``params`` parameters, its tokens and backend."""
    exp, config = study.experiment, study.model
    t = exp.train
    stages = ", ".join(f"{s.name} {steps * t.tokens_per_step:,}" for s, steps in zip(t.stages, t.stage_steps()))
    rounded = (
        f"; budgets of {', '.join(f'{s.name} {budget:,}' for s, budget, _ in t.rounding())} rounded up to whole steps"
        if t.rounding()
        else ""
    )
    return (
        f"model `{exp.model}` ({params:,} parameters, pattern {config.pattern}), "
        f"{t.trained_tokens:,} training tokens ({stages}{rounded}), backend {exp.backend}"
    )


def _scale_note(paper: dict, study, params: int, rows: list[Row]) -> list[str]:
    """``scale_paragraph`` of ``study`` (its model has ``params`` parameters, its report's lines
    ``rows``) against the claims file's ``paper.experiment`` (none without one)."""
    if not paper.get("experiment"):
        return []
    theirs = load_study(paper["experiment"])
    return scale_paragraph(
        (params, study.experiment.train.trained_tokens),
        (model_parameters(theirs), theirs.experiment.train.trained_tokens, theirs.experiment.train.total_steps),
        theirs.name,
        rows,
    )


def check_results_found(study, results: str | Path, out: Path) -> None:
    """A ``ReportError`` when none of ``study``'s runs has a training or evaluation table under
    ``results`` (a mistyped --results, say): a report of nothing must not replace one of something."""
    tables = [
        folder(results, study.name, recipe, seed) / name
        for recipe, seeds in study.runs.items()
        for seed in seeds
        for folder, name in ((run_dir, "metrics.parquet"), (eval_dir, "final_loss.json"))
    ]
    if not any(path.is_file() for path in tables):
        raise ReportError(
            f"no results of experiment {study.name!r} under {results}/ (none of its {len(tables) // 2} runs has "
            f"{Path(results) / study.name}/train/<recipe>/seed<s>/metrics.parquet or eval/<recipe>/seed<s>/"
            f"final_loss.json): {out} was not written; check --results, or give --allow-empty for a report "
            "without measurements"
        )


def write_report(
    study,
    claims: str | Path,
    out: str | Path,
    results: str | Path = "results",
    figures: list[str | Path] = (),
    allow_empty: bool = False,
) -> list[Row]:
    """Write the report of ``study``'s results against ``claims`` to ``out``; its lines. Without
    any result of the study (``check_results_found``) nothing is written unless ``allow_empty``."""
    if not allow_empty:
        check_results_found(study, results, Path(out))
    text, rows = report_text(study, claims, Path(out), results, figures)
    atomic_write_text(Path(out), text)
    return rows


def report_text(
    study, claims: str | Path, out: Path, results: str | Path = "results", figures: list[str | Path] = ()
) -> tuple[str, list[Row]]:
    """The report of ``study``'s results against ``claims`` (figure links relative to ``out``'s
    folder) and its lines."""
    paper, claim_list = load_claims(claims_path(claims))
    root = Path(results) / study.name
    exp = study.experiment
    blend = dict(exp.train.stages[-1].blend)
    runs = study_runs(study, results)
    rows = [
        row
        for claim in claim_list
        for row in measure(claim, root, runs, claim_policies(claim, study), blend, study.model.name, study.runs)
    ]
    out = Path(out)
    beyond = (
        phase_section(root, runs)
        + target_section(root, runs)
        + spread_section(Path(results), root, runs, exp.train.final_window)
    )
    diverged = _divergences(root, runs)
    params = model_parameters(study)
    text = render(
        paper,
        rows,
        study.experiment,
        run_scale(study, params),
        [Path(f) for f in figures],
        out,
        beyond,
        diverged,
        runs_text(runs, study.runs) + numerics_text(root, runs),
        _scale_note(paper, study, params, rows),
    )
    return text, rows
