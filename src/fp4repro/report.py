"""``fp4repro report``: each claim of the claims file (``configs/claims.yaml``) beside what one
experiment measured, written to ``paper/<experiment>/report.md``.

For every claim the report gives the paper's value, ours (recipe, baseline, difference and, where
the measure has one, the standard error of the difference), whether the direction reproduced,
whether the difference is larger than its noise (|diff| > 2·SE), and the scale it was measured at.
A claim whose inputs the experiment lacks (a recipe it does not train, a measure that no rule of
the DAG produces yet) is listed as "not measured" with the reason, never silently dropped.

Inputs, all in the results layout:
    results/<exp>/eval/<recipe>/final_loss.json, nll.parquet, downstream.parquet
    results/<exp>/train/<recipe>/telemetry.parquet
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fp4repro.results import (DOWNSTREAM_COLUMNS, EVENT_COLUMNS, NLL_COLUMNS, TELEMETRY_COLUMNS, block_rates,
                               last_checkpoint, read_json, read_table)
from fp4repro.config.files import claims_path, read_yaml, schema_error, schema_field
from fp4repro.errors import FP4ReproError
from fp4repro.util import atomic_write_text


class ReportError(FP4ReproError):
    """A claims file or a results file that cannot be used (file, field, what is wrong)."""


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    measure: str
    recipe: str
    baseline: str
    expect: str                  # lower | higher
    paper: str
    policy: str = "quantized"
    event: str | None = None
    operands: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    """One line of the report: a claim (or one aggregate of a downstream claim) and its outcome."""

    claim: Claim
    label: str
    recipe_value: float | None = None
    baseline_value: float | None = None
    stderr: float = math.nan                   # standard error of the difference (nan: none)
    note: str = ""                             # why not measured, or what the values are

    @property
    def measured(self) -> bool:
        return self.recipe_value is not None and self.baseline_value is not None

    @property
    def difference(self) -> float:
        return self.recipe_value - self.baseline_value

    @property
    def reproduced(self) -> bool:
        return self.difference < 0 if self.claim.expect == "lower" else self.difference > 0

    @property
    def beyond_noise(self) -> bool | None:
        return None if math.isnan(self.stderr) else abs(self.difference) > 2 * self.stderr


# ------------------------------------------------------------------------------------ claims

def load_claims(path: str | Path) -> tuple[dict, list[Claim]]:
    """The paper section and the claims of a claims YAML, validated against its schema."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"{path}: no such claims file")
    raw = read_yaml(path, ReportError)
    error = schema_error(raw, "claims.schema.json")
    if error is not None:
        raise ReportError(f"{path}: field '{schema_field(error)}': value {error.instance!r}: {error.message}")
    ids = [c["id"] for c in raw["claims"]]
    if len(set(ids)) != len(ids):
        raise ReportError(f"{path}: field 'claims': ids must be unique, got {ids}")
    claims = [Claim(**{**c, "operands": tuple(c.get("operands", ()))}) for c in raw["claims"]]
    return raw["paper"], claims


# ---------------------------------------------------------------------------------- measures

# the file of each measure, under results/<exp>/
MEASURE_FILES = {"final_loss": "eval/{}/final_loss.json", "heldout_nll": "eval/{}/nll.parquet",
                 "downstream": "eval/{}/downstream.parquet", "telemetry": "train/{}/telemetry.parquet"}


def final_loss(path: Path) -> tuple[float, float]:
    """Final-window training loss and its standard error."""
    raw = read_json(path, ("loss",), "a final-window loss summary (fp4repro evaluate)", ReportError)
    return raw["loss"], raw.get("loss_stderr", math.nan)


def _at_last_checkpoint(path: Path, columns: tuple[str, ...], what: str, policy: str) -> pd.DataFrame:
    table = read_table(path, columns, what, ReportError)
    return last_checkpoint(table[table["policy"] == policy], [])


def heldout_nll(path: Path, policy: str) -> tuple[int, float]:
    """(step, NLL of the final-stage blend) at the last checkpoint (no standard error: one fixed split)."""
    rows = _at_last_checkpoint(path, NLL_COLUMNS, "a held-out NLL table (fp4repro evaluate)", policy)
    blend = rows[rows["source"] == "blend"]
    if blend.empty:
        raise ReportError(f"{path}: no blend row for policy {policy!r}")
    return int(blend["step"].iloc[0]), float(blend["nll"].iloc[0])


def downstream(path: Path, policy: str) -> tuple[int, dict[str, tuple[float, float]]]:
    """(step, aggregate -> (value, stderr)) at the last checkpoint."""
    rows = _at_last_checkpoint(path, DOWNSTREAM_COLUMNS, "a downstream results table (fp4repro evaluate)", policy)
    rows = rows[rows["level"] == "aggregate"]
    step = int(rows["step"].iloc[0]) if len(rows) else -1
    return step, {r.aggregate: (float(r.value), float(r.stderr)) for r in rows.itertuples()}


def _same_step(claim: Claim, a: int, b: int) -> Row | None:
    if a != b:
        return Row(claim, claim.id, note=f"not measured: last evaluated checkpoints differ (step {a} vs {b})")
    return None


def event_rate(path: Path, event: str, operands: tuple[str, ...]) -> tuple[float, int, int]:
    """Share of quantized blocks with ``event`` over the whole run, summed over layers and the
    listed operands: (rate, events, blocks)."""
    table = read_table(path, TELEMETRY_COLUMNS, "a quantization telemetry table (fp4repro train)", ReportError)
    total = block_rates(table[table["operand"].isin(operands)], []).iloc[0]
    return float(total[event]), int(total[EVENT_COLUMNS[event]]), int(total["blocks"])


def measure(claim: Claim, root: Path, recipes: tuple[str, ...]) -> list[Row]:
    """The report lines of one claim against the results under ``root`` (results/<exp>)."""
    absent = [r for r in (claim.recipe, claim.baseline) if r not in recipes]
    if absent:
        return [Row(claim, claim.id, note=f"not measured: recipe(s) {', '.join(absent)} not in this experiment")]
    if claim.measure == "throughput":
        return [Row(claim, claim.id, note="not measured: needs native FP4 GEMMs; the throughput ablations are "
                                          "not part of this DAG yet")]
    path, base_path = (root / MEASURE_FILES[claim.measure].format(r) for r in (claim.recipe, claim.baseline))
    missing = [str(p) for p in (path, base_path) if not p.is_file()]
    if missing:
        return [Row(claim, claim.id, note=f"not measured: {', '.join(missing)} missing")]
    if claim.measure == "final_loss":
        (a, sa), (b, sb) = final_loss(path), final_loss(base_path)
        return [Row(claim, claim.id, a, b, math.hypot(sa, sb), "final-window mean loss ± SE of the steps")]
    if claim.measure == "heldout_nll":
        (sa, a), (sb, b) = heldout_nll(path, claim.policy), heldout_nll(base_path, claim.policy)
        return [_same_step(claim, sa, sb) or
                Row(claim, claim.id, a, b, note=f"blend NLL (nats/token) at step {sa}, {claim.policy} policy")]
    if claim.measure == "downstream":
        (sa, ours), (sb, base) = downstream(path, claim.policy), downstream(base_path, claim.policy)
        mismatch = _same_step(claim, sa, sb)
        if mismatch:
            return [mismatch]
        return [Row(claim, f"{claim.id}: {agg}", ours[agg][0], base[agg][0], math.hypot(ours[agg][1], base[agg][1]),
                    f"accuracy at step {sa}, {claim.policy} policy")
                for agg in sorted(set(ours) & set(base))] or \
            [Row(claim, claim.id, note="not measured: no aggregate rows in downstream.parquet")]
    # telemetry: the claims schema allows no other measure
    a, ea, na = event_rate(path, claim.event, claim.operands)
    b, eb, nb = event_rate(base_path, claim.event, claim.operands)
    note = (f"{claim.event} blocks of {', '.join(claim.operands)}: {ea:,} of {na:,} vs {eb:,} of {nb:,}")
    if ea == eb == 0:
        return [Row(claim, claim.id, note=f"not resolved: no {claim.event} events in either run ({note})")]
    # binomial SE of each rate (blocks treated as independent: an underestimate)
    se = math.hypot(math.sqrt(a * (1 - a) / na), math.sqrt(b * (1 - b) / nb))
    return [Row(claim, claim.id, a, b, se, note)]


# ------------------------------------------------------------------------------------ render

def _fmt(row: Row, value: float) -> str:
    return f"{value:.3e}" if row.claim.measure == "telemetry" else f"{value:.4f}"


def render(paper: dict, rows: list[Row], exp, scale: str, figures: list[Path], out: Path) -> str:
    """The report as Markdown (figure links relative to the report's folder)."""
    lines = [f"# Reproduction report: {paper['title']}", "",
             f"Generated by `fp4repro report` from experiment `{exp.name}`; rerun the workflow to refresh it.", "",
             f"- **Paper's scale:** {paper['scale']}.",
             f"- **This run's scale:** {scale}.",
             "- **Reading it:** *direction* says whether our difference (recipe − baseline) has the sign the "
             "paper reports; *beyond noise* whether it exceeds twice its standard error. A direction seen "
             "at a scale this far below the paper's is a consistency check, not a confirmation.", "",
             "| claim | paper | recipe | baseline | ours (recipe / baseline) | difference | direction | beyond noise |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        c = row.claim
        if not row.measured:
            status = row.note.split(":")[0]
            lines.append(f"| {row.label} | {c.paper} | {c.recipe} | {c.baseline} | {row.note} | | {status} | |")
            continue
        se = "" if math.isnan(row.stderr) else f" ± {_fmt(row, row.stderr)}"
        noise = {None: "n/a (no SE)", True: "yes", False: "no"}[row.beyond_noise]
        lines.append(f"| {row.label} | {c.paper} | {c.recipe} | {c.baseline} | {_fmt(row, row.recipe_value)} / "
                     f"{_fmt(row, row.baseline_value)} | {row.difference:+.4g}{se} | "
                     f"{'reproduced' if row.reproduced else 'not reproduced'} | {noise} |")
    lines += ["", "## Claims", ""]
    for row in rows:
        lines.append(f"- **{row.label}** — {row.claim.claim}. {row.note}".rstrip() + ("." if row.note else ""))
    if figures:
        lines += ["", "## Figures", ""]
        for fig in figures:
            rel = os.path.relpath(fig, out.parent)
            lines += [f"### {fig.stem}", "", f"![{fig.stem}]({Path(rel).as_posix()})", ""]
    return "\n".join(lines).rstrip() + "\n"


def run_scale(study) -> str:
    import torch

    from fp4repro.model import NemotronH

    exp, config = study.experiment, study.model
    with torch.device("meta"):
        params = NemotronH(config, None).num_parameters()
    stages = ", ".join(f"{s.name} {s.tokens:,}" for s in exp.train.stages)
    return (f"model `{exp.model}` ({params:,} parameters, pattern {config.pattern}), "
            f"{exp.train.total_tokens:,} training tokens ({stages}), backend {exp.backend}")


def write_report(study, claims: str | Path, out: str | Path, results: str | Path = "results",
                 figures: list[str | Path] = ()) -> list[Row]:
    """Write the report of ``study``'s results against ``claims`` to ``out``; its lines."""
    paper, claim_list = load_claims(claims_path(claims))
    root = Path(results) / study.name
    rows = [row for claim in claim_list for row in measure(claim, root, list(study.recipes))]
    out = Path(out)
    text = render(paper, rows, study.experiment, run_scale(study), [Path(f) for f in figures], out)
    atomic_write_text(out, text)
    return rows
