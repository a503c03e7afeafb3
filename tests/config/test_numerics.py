"""The numerics fingerprint: what it digests, and a guard on the code it stands for."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import fp4repro.config.numerics as numerics
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe, recipe_from_config
from fp4repro.config.study import load_study
from fp4repro.train.runs import run_fingerprint

SRC = Path(numerics.__file__).resolve().parents[1]
#: the modules whose code decides what a recipe computes
NUMERICS_CODE = (
    "formats.py",
    "reference/block.py",
    "reference/gemm.py",
    "reference/geometry.py",
    "reference/rht.py",
    "kernels/quantize.py",
    "kernels/gemm.py",
    "kernels/cublaslt.py",
    "quant/gemm.py",
    "model/head_gemm.py",
    "reference/split.py",
    "kernels/split.py",
)
#: (NUMERICS_VERSION, digest of NUMERICS_CODE) as recorded when the version was last looked at
#: (last: version 3, the LM head's FP32 GEMMs on BF16 tensor cores, model/head_gemm.py; then the
#: gradient's split moved to reference/split.py with a Triton kernel that equals it bit for bit,
#: kernels/split.py: the same values, the version stayed; then the backward's GEMMs became one
#: function the benchmark calls too, head_backward: the same operations; then head_backward makes the
#: gradient contiguous before the split, so that the kernel always serves it: the same values; then
#: the telemetry ratio's current amax became the live amax, inf with a non-finite element: telemetry
#: only, no recipe computes anything else; then the quantization kernel's telemetry counters are
#: stored per tile and summed after the launch instead of added atomically: the same integers; then
#: the amax pass reads several tiles a program and a second amax kernel takes a row-major X's amax
#: and its transpose's after the RHT from one read: maxima, exact in any order, the same values; then
#: the FP32 GEMM model with current scales reads α = d_a·d_b from device memory in cuBLASLt's own
#: epilogue, kernels/cublaslt.py, instead of an FP32 output and a scale-and-cast pass: the same FP32
#: product and rounding, and on an H100 the same values bit for bit at the 8B widths' GEMMs; then
#: its split-K partial sums are kept to FP32 (BF16 ones were allowed) and a size-1 dimension's
#: stride is ignored: the algorithms it chose at those GEMMs stay, the values too; then its plan's
#: key holds the one dtype of operands and output once, and the alignment is a lowest set bit: the
#: same descriptors and algorithms; then the amax pass with the RHT can also write a float32 X's
#: BF16 cast (torch's rounding to nearest even, on the bit pattern) and take the cast's amax, which
#: the backward took from its own cast: the same values)
RECORDED = (3, "8b6d17039126847f")


def code_digest() -> str:
    """A digest of the numerics modules' code: their syntax trees without docstrings, so that
    comments, docstrings and formatting do not count."""
    digest = hashlib.sha256()
    for name in NUMERICS_CODE:
        tree = ast.parse((SRC / name).read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (
                isinstance(body, list)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
        digest.update(ast.dump(tree).encode())
    return digest.hexdigest()[:16]


def test_the_numerics_version_was_looked_at_since_the_numerics_code_last_changed():
    assert (numerics.NUMERICS_VERSION, code_digest()) == RECORDED, (
        "the code of the formats, the reference quantizer, the kernels or a GEMM model changed: if it changes "
        "what any recipe computes, raise NUMERICS_VERSION in fp4repro/config/numerics.py (and say what changed); "
        f"then record ({numerics.NUMERICS_VERSION}, {code_digest()!r}) here"
    )


def test_the_suite_fingerprint_changes_with_the_version(monkeypatch):
    now = numerics.suite_fingerprint()
    numerics.suite_fingerprint.cache_clear()
    monkeypatch.setattr(numerics, "NUMERICS_VERSION", numerics.NUMERICS_VERSION + 1)
    try:
        assert numerics.suite_fingerprint() != now
    finally:
        numerics.suite_fingerprint.cache_clear()


def test_a_runs_numerics_are_its_resolved_linears_not_its_name():
    layers = load_model_config("small").layer_linears
    ue5m3 = load_recipe("ue5m3")
    renamed = recipe_from_config({**ue5m3.config, "name": "mine"}, "mine")
    fingerprint = numerics.run_numerics_fingerprint
    assert fingerprint(renamed, layers) == fingerprint(ue5m3, layers)
    others = {name: fingerprint(load_recipe(name), layers) for name in ("ue5m3_t448", "ue5m3_torch_gemm", "nvfp4")}
    assert len({fingerprint(ue5m3, layers), *others.values()}) == 4
    record = numerics.numerics_record(ue5m3, layers)
    assert record["numerics"] == numerics.suite_fingerprint() and record["numerics_version"] == 3


def test_the_suite_fingerprint_enters_the_run_fingerprint(monkeypatch):
    study = load_study("tiny")
    before = run_fingerprint(study, "ue5m3", 0, "data")[1]
    monkeypatch.setattr("fp4repro.train.runs.suite_fingerprint", lambda: "another")
    assert run_fingerprint(study, "ue5m3", 0, "data")[1] != before
