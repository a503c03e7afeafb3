"""The work of one model-body step under a recipe, counted from the model's shapes: the first
input of the throughput projection (the Blackwell column of ``fp4repro bench throughput``).

For every internal linear y = x·Wᵀ (x: tokens × K, W: N × K) a training step runs three GEMMs,
fprop (M=tokens, N, K), dgrad (M=tokens, N=K, K=N) and wgrad (M=N, N=K, K=tokens), each of
2·M·N·K FLOPs, in FP4 natively when the linear is quantized and in BF16 when the recipe leaves it
in BF16 (``GemmWork``). Each quantized operand costs one pass of a quantization kernel over its
elements (``QuantWork``): its kernel case (block, rounding, RHT; column-wise when the operand is the
transpose of its tensor, Wᵀ, dYᵀ or Xᵀ: ``fp4repro.config.spec.transposed_operand``), and, with a
current amax, one more read of the tensor for its amax (the emulation takes X's and dY's two
current amaxes, row-wise and transposed, from one read where it can:
``fp4repro.quant.linear.shared_current_amaxes``; here, as on the hardware projected to, each
operand's amax is a read of its own, so the calibration GPU's predicted amax part keeps the read
the emulation saves; the amax part's ``parts_vs_step`` shows it with the rest of its error).
dgrad's Q(Wᵀ) is fprop's Q(W) transposed
where that is exact (``fp4repro.quant.linear.transposable_weight_spec``), costing no pass. The
attention core, the Mamba scan, norms and elementwise work are not counted here: the projection
measures them.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

import torch

from fp4repro.config.model import ModelConfig
from fp4repro.config.recipe import Recipe
from fp4repro.config.spec import OPERAND_MATRIX, QuantSpec, transposed_operand
from fp4repro.quant.linear import transposable_weight_spec


@dataclass(frozen=True)
class GemmWork:
    linear: str
    gemm: str  # fprop | dgrad | wgrad
    m: int
    n: int
    k: int
    precision: str  # fp4 | bf16

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True)
class QuantWork:
    linear: str
    operand: str
    rows: int  # the matrix the kernel quantizes along its rows (OPERAND_MATRIX)
    cols: int
    spec: QuantSpec
    columnwise: bool  # a transposed view of its tensor (Wᵀ, dYᵀ, Xᵀ)
    amax_pass: bool  # current amax: one more read of the tensor

    @property
    def elements(self) -> int:
        return self.rows * self.cols

    @property
    def case(self) -> str:
        """The kernel case, e.g. "1x16 RHT+SR, column-wise" (``kernel_case``)."""
        return kernel_case(self.spec, self.columnwise)


def kernel_case(spec: QuantSpec, columnwise: bool) -> str:
    """The quantization kernel case of an operand: block, element rounding and RHT, row- or
    column-wise (the names of ``fp4repro bench kernels``' cases, without the amax)."""
    rounding = {(True, True): "RHT+SR", (True, False): "RHT", (False, True): "SR", (False, False): "RNE"}[
        (spec.rht, spec.stochastic)
    ]
    name = f"{spec.block[0]}x{spec.block[1]} {rounding}"
    if spec.target is None:
        name += f" {spec.scale.upper()}"
    return name + (", column-wise" if columnwise else "")


@functools.lru_cache(maxsize=8)
def linear_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """Reference name -> (in, out) of every internal linear (from the model built on the meta device)."""
    from fp4repro.model import NemotronH

    with torch.device("meta"):
        model = NemotronH(config, None)
    return {name: (m.in_features, m.out_features) for name, m in model.linears() if name != "lm_head"}


def body_work(config: ModelConfig, recipe: Recipe, tokens: int) -> tuple[list[GemmWork], list[QuantWork]]:
    """The GEMMs and quantizations of one body step of ``tokens`` tokens under ``recipe``."""
    gemms, quants = [], []
    for name, (k, n) in linear_shapes(config).items():
        layer, linear = int(name.split(".")[1]), name.rsplit(".", 1)[1]
        specs = recipe.linear_specs(layer, config.layer_linears, linear=linear)
        quantized = specs is not None and specs.any_quantized
        precision = "fp4" if quantized else "bf16"
        gemms += [
            GemmWork(name, "fprop", tokens, n, k, precision),
            GemmWork(name, "dgrad", tokens, k, n, precision),
            GemmWork(name, "wgrad", n, k, tokens, precision),
        ]
        if not quantized:
            continue
        size = {"tokens": tokens, "K": k, "N": n}
        for operand, spec in specs.items():
            if spec is None or (operand == "dgrad.w" and transposable_weight_spec(specs)):
                continue
            rows, cols = OPERAND_MATRIX[operand]
            quants.append(
                QuantWork(
                    name,
                    operand,
                    size[rows],
                    size[cols],
                    spec,
                    transposed_operand(operand),
                    spec.target is not None and spec.tensor_scaling.kind == "current",
                )
            )
    return gemms, quants


def summary(gemms: list[GemmWork], quants: list[QuantWork]) -> dict:
    """FLOPs by precision, internal linears by precision (the paper's ablation counts them: 96 FP4
    + 16 BF16 against 112 FP4), elements by kernel case, and elements read again for current
    amaxes."""
    flops = Counter()
    for g in gemms:
        flops[g.precision] += g.flops
    cases = Counter()
    for q in quants:
        cases[q.case] += q.elements
    fprops = [g for g in gemms if g.gemm == "fprop"]  # one per linear
    return {
        "gemm_flops": dict(flops),
        "linears": {p: sum(g.precision == p for g in fprops) for p in ("fp4", "bf16")},
        "quantized_elements": dict(cases),
        "amax_elements": sum(q.elements for q in quants if q.amax_pass),
    }
