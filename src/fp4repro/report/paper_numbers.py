"""The paper's own numbers in the report: the table's cell beside ours (``paper_cell``), the
header's line of where the paper measured each claim (``measured_where``), and the section that
gives, per claim, the paper's scale and every number with its interval and the artifact path it is
read from (``paper_section``). Each reads a claim's ``reported`` block (``fp4repro.report.claims``).
"""

from __future__ import annotations

from fp4repro.report.claims import MEASURED_AT, Claim, Row


def paper_cell(claim: Claim) -> str:
    """The table's cell of the paper's number: its recipe − baseline (each aggregate's), with the
    authors' interval where they give one, and where it was measured; a claim without a number says so."""
    reported = claim.reported
    if reported is None:
        return "no paper number in this claims file"
    if not reported.difference:
        return f"no number: {reported.where}"
    numbers = "; ".join(d.text(signed=True) for d in reported.difference)
    return f"{numbers} ({reported.measured_at})"


def claims_of(rows: list[Row]) -> list[Claim]:
    """The claims of the report's lines, once each, in their order (a downstream claim has a line
    per aggregate)."""
    return list({row.claim.id: row.claim for row in rows}.values())


def measured_where(claims: list[Claim], artifact: str | None) -> list[str]:
    """The header's line: which claims the paper measured at 8B, which at 350M only, and which only
    its summary states (Markdown lines)."""
    groups = {
        where: [c.id for c in claims if c.reported is not None and c.reported.measured_at == where]
        for where in MEASURED_AT
    }
    unsaid = [c.id for c in claims if c.reported is None]
    aside = {"350M": " (the paper has no isolated T ablation at 8B)"}
    parts = [f"{MEASURED_AT[where]}: {', '.join(ids)}{aside.get(where, '')}" for where, ids in groups.items() if ids]
    if unsaid:
        parts.append(f"without the paper's numbers in this claims file: {', '.join(unsaid)}")
    cited = f" Every paper number below is cited by its path in the authors' artifact, {artifact}." if artifact else ""
    return [f"- **Where the paper measured its claims:** {'; '.join(parts)}.{cited}"]


def paper_section(claims: list[Claim]) -> list[str]:
    """The section "The paper's own numbers" (Markdown lines): per claim, where and at what scale
    the paper measured it, its recipe − baseline and the numbers behind it, each with the authors'
    interval where they give one and the artifact path it is read from, and the claim's note."""
    lines = [
        "",
        "## The paper's own numbers",
        "",
        "Per claim: where the paper measured it and at what scale, its recipe − baseline (beside ours in the table "
        "above), the numbers behind it with the authors' 95% intervals where they give one, and the file of the "
        "authors' artifact each number is read from.",
    ]
    for claim in claims:
        reported = claim.reported
        lines += ["", f"### {claim.id}: {reported.where if reported else 'no paper number in this claims file'}", ""]
        if reported is None:
            continue
        lines.append(f"- **Paper's scale:** {reported.scale}.")
        if reported.setup is not None:
            lines.append(f"- **Paper's setup:** {reported.setup.text()} ({reported.setup.source})")
        lines += [f"- **Paper's difference:** {d.text(signed=True)} ({d.source})" for d in reported.difference]
        lines += [f"- {v.text(signed=' − ' in v.of)} ({v.source})" for v in reported.values]
        if reported.note:
            lines.append(f"- **Note:** {reported.note}")
    return lines
