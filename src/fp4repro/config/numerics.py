"""The numerics fingerprint: which definition of the numbers a run was computed with.

Two runs are compared step by step, seed by seed, only when they computed with the same
numerics: the same minifloat formats, rounding rules, quantizer and GEMM implementations. A
change of any of these changes what every recipe computes, so results made before and after it
must not be paired by accident. ``NUMERICS_VERSION`` names this suite's definition; it changes
whenever the formats, the reference quantizer, the kernels or a GEMM model change what they
compute (``tests/config/test_numerics.py`` fails on any change to that code until the version and
its recorded digest are looked at):

    1   the suite's readings of the paper's summary: UE5M3 up to 114,688 (only the all-ones code
        reserved), block scales that round to zero flushed, one SR rule (up iff
        (k + 1/2)/256 < frac), FP32 GEMMs only, the LM head under BF16 autocast
    2   the paper's own numerics from the authors' artifact: UE5M3 up to 61,440, the zero-scale
        rule "one", the StochasticFast rule, the probe-matched GEMM model, 32x32 tiles, MX scales
        from the amax's bits, the LM head in FP32
    3   the LM head's FP32 GEMMs on BF16 tensor cores (``fp4repro.model.head_gemm``): the same
        exact products, the output gradient split into three BF16 pieces that sum to it, FP32
        sums in another order than an IEEE FP32 GEMM's

``suite_fingerprint()`` digests the version with every registered format's parameters (a
recipe-independent digest: the one the report pairs runs on). ``run_numerics_fingerprint``
digests that with a recipe resolved on a model's layers, linear by linear (what one run computes;
it enters the run's fingerprint). Runs written before fingerprints were recorded are version 1.
"""

from __future__ import annotations

import functools

from fp4repro.formats import FORMAT_NAMES, ROUNDING_MODES, get_format
from fp4repro.util import json_digest, plain_json

NUMERICS_VERSION = 3
#: what a run folder, table or result that records no numerics was computed with
UNRECORDED = "v1 (before numerics fingerprints were recorded)"


@functools.cache
def suite_fingerprint() -> str:
    """The digest of this suite's numerics definition: its version, every registered format's
    parameters and the rounding modes (16 hex digits)."""
    formats = {name: plain_json(get_format(name)) for name in FORMAT_NAMES}
    return json_digest({"version": NUMERICS_VERSION, "formats": formats, "rounding": list(ROUNDING_MODES)})


def run_numerics_fingerprint(recipe, layers: tuple[tuple[str, ...], ...]) -> str:
    """The digest of what a run of ``recipe`` on a model with these layers (``ModelConfig.
    layer_linears``) computes: the suite's fingerprint and each linear's resolved specs, GEMM model
    included (16 hex digits)."""
    linears = [
        [i, name, plain_json(recipe.linear_specs(i, layers, name))] for i, names in enumerate(layers) for name in names
    ]
    return json_digest({"suite": suite_fingerprint(), "linears": linears})


def numerics_record(recipe, layers) -> dict:
    """What a run folder, its tables and its results record of their numerics."""
    return {
        "numerics_version": NUMERICS_VERSION,
        "numerics": suite_fingerprint(),
        "run_numerics": run_numerics_fingerprint(recipe, layers),
    }
