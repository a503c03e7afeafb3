"""The throughput measure: a throughput claim against the body-throughput files of
``fp4repro bench throughput`` (results/bench/throughput_<device>.json), per device, shape and
measured column the speed-up time(baseline) / time(recipe) with its 95% interval, beside the shape
and GPU the paper timed (the claim's ``reported.setup``: 1 x 1,024 tokens on one GB200), the
paper's shape first and the projection onto the paper's GPU named. Only a native FP4 column decides
a claim; the emulated column, the FP8 analogue and the projections are shown beside it.
"""

from __future__ import annotations

import re
from pathlib import Path

from fp4repro.report.claims import Claim, PaperSetup, ReportError, Row
from fp4repro.results import column_timing, gpu_idle, read_throughput, shape_text, throughput_files, void_column
from fp4repro.statistics import OPPOSITE, REPRODUCED


def _throughput_effect(claim: Claim, measured: dict) -> dict | None:
    """The effect of one measured column that is this claim's: time(nvfp4) / time(recipe)."""
    if claim.baseline != "nvfp4":
        return None
    return next((e for e in measured["effects"].values() if e["versus"] == claim.recipe), None)


def _magnitude(claim: Claim) -> float | None:
    """The paper's relative number of a claim (``magnitude: +21.2% tokens/s`` -> 0.212), if any."""
    found = re.search(r"([+-]?\d+(?:\.\d+)?)\s*%", claim.magnitude or "")
    return float(found.group(1)) / 100 if found else None


def _setup(claim: Claim) -> PaperSetup | None:
    return claim.reported.setup if claim.reported is not None else None


def _gpu_idle(claim: Claim, measured: dict) -> str:
    """For eager steps on a GPU, how much of the claim's two recipes' median steps the GPU spent
    idle (1 − the profiled step's kernel time over the median: a body bound by the host's launches
    shows it), "" for graph replays or without a profile."""
    if column_timing(measured) != "eager":
        return ""
    rows = [measured["recipes"].get(name) for name in (claim.baseline, claim.recipe)]
    shares = [share for row in rows if row and (share := gpu_idle(row)) is not None]
    if not shares:
        return ""
    return f"; eager steps, the GPU idle {min(shares):.0%} to {max(shares):.0%} of them"


def _throughput_effects(claim: Claim, entry: dict) -> list[str]:
    """Per column of one body-throughput entry: the speed-up time(baseline) / time(recipe) with its
    95% interval and what it says of tokens/s (the FP8 analogue as a direction check; eager steps
    with the share of them the GPU idled, ``_gpu_idle``); for a
    projection, its band, whether the paper's number lies inside it ("consistent") and what faster
    GEMMs and quantizers could give with no non-GEMM time (centrally and over the band), the
    projection onto the paper's GPU said to be so."""
    shows = []
    paper = _magnitude(claim)
    setup = _setup(claim)
    for column, measured in entry["columns"].items():
        effect = _throughput_effect(claim, measured)
        if effect is None:
            continue
        void = void_column(column, measured)
        if void:
            shows.append(f"{entry.get('device', 'cpu')} {column.replace('_', ' ')}: {void}")
            continue
        span = f"{effect['speedup'] - 1:+.1%} [{effect['ci_low'] - 1:+.1%}, {effect['ci_high'] - 1:+.1%}]"
        if measured.get("kind") == "projection":
            verdict = (
                ""
                if paper is None
                else (
                    f"; the paper's {paper:+.1%} is "
                    + (
                        "consistent (inside the band)"
                        if effect["ci_low"] - 1 <= paper <= effect["ci_high"] - 1
                        else "not consistent (outside the band)"
                    )
                )
            )
            papers_gpu = " (the paper's GPU)" if setup is not None and column == f"projection_{setup.device}" else ""
            shows.append(
                f"{measured['target']}{papers_gpu} projected from {entry.get('device', 'cpu')}: {span} (band over the "
                f"projection's parameters; with no non-GEMM time {effect['speedup_without_other'] - 1:+.1%} "
                f"[{effect['without_other_low'] - 1:+.1%}, {effect['without_other_high'] - 1:+.1%}]){verdict}"
            )
            continue
        direction = "raises" if effect["ci_low"] > 1 else "lowers" if effect["ci_high"] < 1 else "does not resolve"
        check = ""
        if column == "fp8_analogue":
            verdict = (
                "not resolved"
                if direction == "does not resolve"
                else "as the paper"
                if (direction == "raises") == (claim.expect == "higher")
                else "against the paper"
            )
            check = f"; direction check at FP8's smaller GEMM ratio: {verdict}"
        idle = _gpu_idle(claim, measured)
        shows.append(
            f"{entry.get('device', 'cpu')} {column.replace('_', ' ')}: {span} ({direction} tokens/s{check}{idle})"
        )
    return shows


def _linears(claim: Claim, entry: dict) -> str:
    """The claim's recipes' FP4+BF16 linears as the entry's work recorded them ("" where it did not)."""
    work = entry.get("work", {})
    counted = [
        f"{name} {work[name]['linears']['fp4']}+{work[name]['linears']['bf16']}"
        for name in (claim.baseline, claim.recipe)
        if "linears" in work.get(name, {})
    ]
    return f"; linears FP4+BF16 {', '.join(counted)}" if counted else ""


def _at_shapes(claim: Claim, entries: list[dict]) -> str:
    """What each entry shows, grouped by its shape: the paper's shape first (said so), then the
    others by size; where none is the paper's shape, that it was not measured here."""
    setup = _setup(claim)
    ours = sorted(
        entries,
        key=lambda e: (setup is None or not setup.is_shape_of(e), e["batch"] * e["seq_len"], e.get("device", "")),
    )
    groups = []
    for e in ours:
        shows = _throughput_effects(claim, e)
        if not shows:
            continue
        papers = " (the paper's shape)" if setup is not None and setup.is_shape_of(e) else ""
        groups.append(f"at {shape_text(e)}{papers}{_linears(claim, e)}: " + "; ".join(shows))
    if setup is not None and groups and not any(setup.is_shape_of(e) for e in ours):
        groups.append(f"the paper's {setup.batch} x {setup.seq_len:,} tokens not measured here")
    return "; ".join(groups)


def _papers_model(claim: Claim, entries: list[dict], model: str | None) -> str:
    """What the body of the model the paper timed (``reported.setup.model``) shows, beside the
    study's own model's: "" where the setup names none, it is the study's model, or it was not
    timed here."""
    setup = _setup(claim)
    if setup is None or setup.model is None or setup.model == model:
        return ""
    shown = _at_shapes(claim, [e for e in entries if e["model"] == setup.model])
    return f"; the paper's model, {setup.model} body, {shown}" if shown else ""


def throughput(claim: Claim, bench: Path, model: str | None) -> list[Row]:
    """A throughput claim against the body-throughput files in ``bench`` (results/bench/
    throughput_<device>.json, ``fp4repro bench throughput``) for ``model``'s shapes: per device,
    shape and measured column, the speed-up time(baseline) / time(recipe) with its 95% interval,
    beside the shape and GPU the paper timed (the claim's ``reported.setup``), the paper's shape
    first; then, where the study's model is not the one the paper timed (``reported.setup.model``),
    what that model's body shows. Only a native FP4 column of the study's model decides the claim
    (reproduced when every device's native
    interval lies beyond 1 in the claim's direction, opposite when one lies beyond it the other
    way, else not resolved); without one the row says "not measured natively" and what the other
    columns show. Without ``model``'s shapes the row is "not measured" and gives the shapes that
    were."""
    setup = _setup(claim)
    paper = f"paper: {setup.text()}; " if setup is not None else ""
    entries = [e for path in throughput_files(bench) for e in read_throughput(path, ReportError).values()]
    ours = [e for e in entries if e["model"] == model]
    if not ours:
        by_model = {
            m: _at_shapes(claim, [e for e in entries if e["model"] == m]) for m in {e["model"] for e in entries}
        }
        others = "; ".join(f"{m} {shown}" for m, shown in sorted(by_model.items()) if shown)
        return [
            Row(
                claim,
                claim.id,
                note=f"not measured: {paper}no body-throughput file in {bench} has {model}'s shapes "
                "(fp4repro bench throughput on a GPU)" + (f"; measured for other shapes, {others}" if others else ""),
            )
        ]
    shown = _at_shapes(claim, ours)
    if not shown:
        return [
            Row(
                claim,
                claim.id,
                note=f"not measured: {paper}{model}'s shapes were timed without {claim.recipe} and "
                f"{claim.baseline} both in one column",
            )
        ]
    native = [
        effect
        for e in ours
        if "native" in e["columns"]
        for effect in [_throughput_effect(claim, e["columns"]["native"])]
        if effect is not None
    ]
    detail = f"{paper}here, {model} body, {claim.recipe} vs {claim.baseline}, {shown}"
    beside = _papers_model(claim, entries, model)
    if not native:
        why = "; ".join(
            sorted({f"{e.get('device', 'cpu')}: {e.get('not_measured', {}).get('native', 'not run')}" for e in ours})
        )
        return [Row(claim, claim.id, note=f"not measured natively: {detail}; native column, {why}{beside}")]
    higher = claim.expect == "higher"
    beyond = [(e["ci_low"] > 1) if higher else (e["ci_high"] < 1) for e in native]
    against = [(e["ci_high"] < 1) if higher else (e["ci_low"] > 1) for e in native]
    verdict = OPPOSITE if any(against) else REPRODUCED if all(beyond) else "not resolved"
    return [Row(claim, claim.id, note=f"{verdict}: native FP4 on {len(native)} device(s); {detail}{beside}")]
