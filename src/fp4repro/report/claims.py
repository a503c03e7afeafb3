"""The claims file and the report's line: ``Claim`` (one claim of ``configs/claims.yaml``), with the
paper's own numbers for it (``Reported``, each number a ``PaperValue`` cited by a path of the
authors' artifact), ``Row`` (one line of the report: a claim and its outcome), ``ReportError``,
``load_claims`` and ``claim_policies`` (the inference policy each side of a claim is read under)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fp4repro.config.eval import RECIPE_POLICY, resolve_policies
from fp4repro.config.files import read_yaml, schema_error, schema_field
from fp4repro.errors import FP4ReproError
from fp4repro.statistics import NO_DIFFERENCE, OPPOSITE, REPRODUCED, SUGGESTIVE, WITHIN_NOISE, Comparison

VERDICTS = (REPRODUCED, SUGGESTIVE, WITHIN_NOISE, OPPOSITE, NO_DIFFERENCE)


class ReportError(FP4ReproError):
    """A claims file or a results file that cannot be used (file, field, what is wrong)."""


# where the paper measured a claim (claims.schema.json's measured_at), as the report says it
MEASURED_AT = {
    "8B": "measured by the paper at 8B",
    "350M": "measured by the paper at 350M only, not at 8B",
    "summary-only": "stated only by the paper's summary, not measured in the paper",
}
UNITS = {"": "", "%": "%", "pp": " pp", "tokens/s": " tokens/s"}


@dataclass(frozen=True)
class PaperValue:
    """One number of the paper: what it is of, its unit, the authors' 95% interval (if they give
    one) and the artifact file it is read from."""

    value: float
    source: str
    of: str = ""
    unit: str = ""
    interval: tuple[float, float] | None = None

    def text(self, signed: bool = False) -> str:
        """``of value unit [low, high]``; ``signed``: a difference, with its sign."""

        def number(x: float) -> str:
            return f"{x:+g}" if signed else f"{x:g}"

        out = number(self.value) + UNITS[self.unit]
        if self.interval is not None:
            out += f" [{number(self.interval[0])}, {number(self.interval[1])}]"
        return f"{self.of}: {out}" if self.of else out


@dataclass(frozen=True)
class PaperSetup:
    """Where a throughput claim's numbers were timed (``reported.setup``): the body's shape, the GPU
    as the artifact names it and its key in configs/devices.yaml, each recipe's FP4 and BF16
    linears, the artifact files they are read from, and the model whose body was timed (its name
    in configs/models, where the suite has it)."""

    batch: int
    seq_len: int
    gpu: str
    device: str
    source: str
    linears: tuple[tuple[str, int, int], ...] = ()  # (recipe, FP4, BF16)
    model: str | None = None

    @classmethod
    def from_yaml(cls, raw: dict) -> PaperSetup:
        linears = tuple((name, n["fp4"], n["bf16"]) for name, n in raw.get("linears", {}).items())
        return cls(raw["batch"], raw["seq_len"], raw["gpu"], raw["device"], raw["source"], linears, raw.get("model"))

    def text(self) -> str:
        """The setup as the report says it: 1 x 1,024 tokens on one NVIDIA GB200, linears FP4+BF16 ..."""
        out = f"{self.batch} x {self.seq_len:,} tokens on one {self.gpu}"
        if self.linears:
            out += ", linears FP4+BF16 " + ", ".join(f"{name} {fp4}+{bf16}" for name, fp4, bf16 in self.linears)
        return out

    def is_shape_of(self, entry: dict) -> bool:
        """Whether a body-throughput entry was timed at this shape."""
        return (entry["batch"], entry["seq_len"]) == (self.batch, self.seq_len)


@dataclass(frozen=True)
class Reported:
    """The paper's own numbers for a claim (``reported`` in the claims file): where it measured
    them, at what scale, its recipe − baseline (one per aggregate), the numbers behind them, and a
    note (why there is no number or no interval)."""

    measured_at: str  # 8B | 350M | summary-only
    scale: str
    difference: tuple[PaperValue, ...] = ()
    values: tuple[PaperValue, ...] = ()
    note: str = ""
    setup: PaperSetup | None = None  # throughput claims: the shape and GPU the paper timed

    @property
    def where(self) -> str:
        return MEASURED_AT[self.measured_at]

    @classmethod
    def from_yaml(cls, raw: dict) -> Reported:
        def values(key: str) -> tuple[PaperValue, ...]:
            return tuple(
                PaperValue(**{**v, "interval": tuple(v["interval"]) if "interval" in v else None})
                for v in raw.get(key, ())
            )

        setup = PaperSetup.from_yaml(raw["setup"]) if "setup" in raw else None
        return cls(raw["measured_at"], raw["scale"], values("difference"), values("values"), raw.get("note", ""), setup)


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
    policy: str = "quantized"  # or recipe: each side under its own (claim_policies)
    event: str | None = None
    operands: tuple[str, ...] = ()
    at_target: float | None = None  # telemetry: only the layers the recipe quantizes at this T
    mechanism: str = ""  # why the measure should move as the paper says (telemetry claims)
    reported: Reported | None = None  # the paper's own numbers (the claims file requires them)


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
    planned_seeds: int = 0  # the plan's paired seeds, where more than the row's: its MDE is projected to them

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
    claims = [
        Claim(**{**c, "operands": tuple(c.get("operands", ())), "reported": Reported.from_yaml(c["reported"])})
        for c in raw["claims"]
    ]
    return raw["paper"], claims


@dataclass(frozen=True)
class ClaimPolicies:
    """The inference policy each recipe of a claim is read under, and the sides whose own policy
    (``policy: recipe``) this experiment did not evaluate, read under the current amax instead."""

    of: dict[str, str]
    not_evaluated: dict[str, str]  # recipe -> its own policy and why it is not read

    @classmethod
    def same(cls, claim: Claim) -> ClaimPolicies:
        """Both sides under the claim's policy."""
        return cls({r: claim.policy for r in (claim.recipe, claim.baseline)}, {})

    def under_current_amax(self, recipe: str, why: str) -> ClaimPolicies:
        """``recipe`` read under the current amax instead of its own policy (``why``: the reason)."""
        return ClaimPolicies(
            {**self.of, recipe: "quantized"}, {**self.not_evaluated, recipe: f"{self.of[recipe]}: {why}"}
        )

    def text(self, claim: Claim) -> str:
        a, b = self.of[claim.recipe], self.of[claim.baseline]
        said = f"{a} policy" if a == b else f"{claim.recipe} under {a}, {claim.baseline} under {b}"
        if self.not_evaluated:
            missed = ", ".join(f"{r}'s own, {why}" for r, why in self.not_evaluated.items())
            said += f" (not evaluated under {missed})"
        return said


def claim_policies(claim: Claim, study) -> ClaimPolicies:
    """Which policy's rows each side of ``claim`` is read from in ``study``: the claim's policy for
    both, or with ``policy: recipe`` each recipe's own (``Recipe.inference_policy``, as the authors
    evaluate B16 under the cold D = 50 replay and NVFP4 under the current amax) where the experiment
    evaluated it (``eval.policies`` names recipe or that policy), else the current amax."""
    if claim.policy != RECIPE_POLICY:
        return ClaimPolicies.same(claim)
    sides = (claim.recipe, claim.baseline)
    own = {r: study.recipes[r].inference_policy if r in study.recipes else "quantized" for r in sides}
    policies = ClaimPolicies(own, {})
    for r, policy in own.items():
        if policy not in resolve_policies(study.experiment.eval.policies, policy):
            policies = policies.under_current_amax(r, "eval.policies lacks recipe")
    return policies
