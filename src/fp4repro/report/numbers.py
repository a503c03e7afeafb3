"""How the report writes a row's numbers: its values, a difference with its 95% interval and its
MDE, one format per measure (telemetry rates in exponent notation, everything else to 4 decimals);
the table, the headline reading (``fp4repro.report.scale``) and the README's block use them alike."""

from __future__ import annotations

from fp4repro.report.claims import Row


def value_text(row: Row, value: float) -> str:
    """A row's value as the report writes it: 4 decimals, a telemetry rate in exponent notation."""
    return f"{value:.3e}" if row.claim.measure == "telemetry" else f"{value:.4f}"


def signed_text(row: Row, value: float) -> str:
    """A difference of a row, with its sign, as the report writes it."""
    return f"{value:+.2e}" if row.claim.measure == "telemetry" else f"{value:+.4f}"


def mde_text(row: Row) -> str:
    """A measured row's MDE, and where the plan pairs more seeds than it has, the MDE projected to
    them from the seed spread so far and from its 80% upper bound ("0.0627; 8 seeds: ~0.0233,
    ≤ 0.0494")."""
    k, n = row.comparison, row.planned_seeds
    projected = k.mde_at(n) if n else None
    if projected is None:
        return value_text(row, k.mde)
    bound = k.mde_at(n, upper=True)
    return f"{value_text(row, k.mde)}; {n} seeds: ~{value_text(row, projected)}, ≤ {value_text(row, bound)}"


def difference_text(row: Row) -> str:
    """A measured row's difference with its 95% interval, as the report's table gives it."""
    k = row.comparison
    return f"{signed_text(row, k.difference)} [{signed_text(row, k.low)}, {signed_text(row, k.high)}]"
