"""The claims file and the report's line: ``Claim`` (one claim of ``configs/claims.yaml``), ``Row``
(one line of the report: a claim and its outcome), ``ReportError`` and ``load_claims``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fp4repro.config.files import read_yaml, schema_error, schema_field
from fp4repro.errors import FP4ReproError
from fp4repro.statistics import NO_DIFFERENCE, OPPOSITE, REPRODUCED, SUGGESTIVE, WITHIN_NOISE, Comparison

VERDICTS = (REPRODUCED, SUGGESTIVE, WITHIN_NOISE, OPPOSITE, NO_DIFFERENCE)


class ReportError(FP4ReproError):
    """A claims file or a results file that cannot be used (file, field, what is wrong)."""


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    measure: str
    recipe: str
    baseline: str
    expect: str  # lower | higher
    paper: str
    magnitude: str | None = None  # the paper's number, where its summary gives one
    policy: str = "quantized"
    event: str | None = None
    operands: tuple[str, ...] = ()
    mechanism: str = ""  # why the measure should move as the paper says (telemetry claims)


@dataclass(frozen=True)
class Row:
    """One line of the report: a claim (or one aggregate of a downstream claim) and its outcome."""

    claim: Claim
    label: str
    recipe_value: float | None = None
    baseline_value: float | None = None
    comparison: Comparison | None = None
    capped: bool = False  # one seed on an outcome of training: at most suggestive
    note: str = ""  # what was compared, or why it was not

    @property
    def measured(self) -> bool:
        return self.comparison is not None

    @property
    def verdict(self) -> str:
        if self.comparison is None:
            return self.note.split(":")[0]
        return self.comparison.verdict(self.claim.expect, self.capped)


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
