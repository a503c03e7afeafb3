"""What to quantize and how: one frozen QuantSpec per GEMM operand, six per linear layer."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from fp4repro.formats import get_format

#: The operands of a linear Y = X·Wᵀ, named "<gemm>.<tensor>", in the order of the recipe table.
#: fprop reduces over in_features, dgrad over out_features, wgrad over tokens.
OPERANDS = ("fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x")
GEMMS = {"fprop": ("fprop.x", "fprop.w"), "dgrad": ("dgrad.dy", "dgrad.w"), "wgrad": ("wgrad.dy", "wgrad.x")}
#: The matrix each operand is, (rows, columns) in the linear's dimensions (X: tokens × K, W: N × K,
#: dY: tokens × N), its columns along its GEMM's reduction dimension. Where the rows and columns are
#: the transpose of the tensor the operand comes from (Wᵀ, dYᵀ, Xᵀ), the operand is a transposed view
#: of it (``transposed_operand``).
OPERAND_MATRIX = {
    "fprop.x": ("tokens", "K"),
    "fprop.w": ("N", "K"),
    "dgrad.dy": ("tokens", "N"),
    "dgrad.w": ("K", "N"),
    "wgrad.dy": ("N", "tokens"),
    "wgrad.x": ("K", "tokens"),
}
TENSOR_MATRIX = {"x": ("tokens", "K"), "w": ("N", "K"), "dy": ("tokens", "N")}


def transposed_operand(operand: str) -> bool:
    """Whether an operand is the transpose of the tensor it comes from (dgrad.w, wgrad.dy, wgrad.x)."""
    return OPERAND_MATRIX[operand] != TENSOR_MATRIX[operand.split(".")[1]]


BLOCKS = ((1, 16), (16, 16), (1, 32), (32, 32))
#: Element roundings: round half to even, and two stochastic roundings from 8 random bits per
#: element that differ only at ties of the random threshold (``fp4repro.formats``): "sr" (up iff
#: delta + (2b + 1)/512 > 1, Transformer Engine's NVFP4 baseline here) and "stochastic_fast" (up iff
#: delta + (2b + 1)/512 >= 1, the UE5M3 FP4 authors' StochasticFast).
ROUNDINGS = ("rne", "sr", "stochastic_fast")
STOCHASTIC_ROUNDINGS = ("sr", "stochastic_fast")
SCALE_ROUNDINGS = ("rne", "up")
#: What a block whose scale rounds to zero (or an all-zero block) gets as its scale: "flush" keeps
#: s_b = 0 and its elements q = 0 (Transformer Engine's NVFP4 rule for E4M3 scales); "one" gives it
#: s_b = 1.0 before the reciprocal (the UE5M3 FP4 authors' rule), and its elements round to zero all
#: the same with UE5M3 scales, or with RNE: the dequantized values are then equal, the scale codes
#: differ (E4M3 with stochastic rounding is the exception: ``fp4repro.reference.block``).
ZERO_SCALES = ("flush", "one")


@dataclass(frozen=True)
class TensorScaling:
    """Where the tensor amax A comes from.

    current:  A = amax of the tensor being quantized, every time.
    periodic: A is sampled at the first step and every ``interval`` optimizer steps, held between.
    """

    kind: str = "current"
    interval: int = 50

    def __str__(self) -> str:
        return self.kind if self.kind == "current" else f"periodic({self.interval})"


@dataclass(frozen=True)
class AutoTarget:
    """An automatic target T, chosen at each refresh of a held amax (periodic scaling only).

    With the growth G_k = max over interval k of (live amax / held amax) of the operand:

        T = clamp(scale_max / (safety · max(G over the last ``window`` intervals)), min, max)

    a real number (no rounding); the first interval uses ``min``. Why: a block at the held amax A
    gets scale T, leaving scale_max / T of headroom for the tensor to grow before the next refresh;
    the largest T whose headroom still covers ``safety`` times the growth the operand showed
    leaves the most room below for small blocks (``fp4repro.quant.state.QuantState``).
    """

    min: float = 448.0
    max: float = 8192.0
    safety: float = 4.0
    window: int = 4

    def __str__(self) -> str:
        return f"auto[{self.min:g}..{self.max:g}, safety {self.safety:g}, window {self.window}]"


@dataclass(frozen=True)
class QuantSpec:
    """Numerics of one GEMM operand (see the numerics contract, docs/numerics.md).

    element:        payload format (signed), e.g. "e2m1"
    scale:          block-scale format with a NaN code, e.g. "e4m3" (used unsigned), "ue5m3", "ue8m0"
    block:          (rows, cols) of a block; cols run along the GEMM's reduction dimension:
                    1x16, 1x32, or the square tiles 16x16 and 32x32 (weights)
    target:         T, where the largest block scale lands: g = Emax·T / A; None = no tensor scale
                    (g = 1, MX style)
    rounding:       element rounding, "rne", "sr" or "stochastic_fast" (``ROUNDINGS``)
    scale_rounding: block-scale rounding, "rne" (nearest even) or "up" (toward +inf, MX style)
    zero_scale:     "flush" or "one": the scale of a block whose scale rounds to zero
                    (``ZERO_SCALES``)
    rht:            16-point randomized Hadamard transform along the reduction dimension first
    tensor_scaling: current or periodic amax
    auto_target:    None, or how T is chosen at each refresh (``AutoTarget``); ``target`` is then
                    the T of the first interval, ``auto_target.min``, and the run's QuantState
                    holds the T of each operand after that (recipes say ``target: auto``)
    """

    element: str = "e2m1"
    scale: str = "e4m3"
    block: tuple[int, int] = (1, 16)
    target: float | None = 448.0
    rounding: str = "rne"
    scale_rounding: str = "rne"
    rht: bool = False
    tensor_scaling: TensorScaling = TensorScaling()
    auto_target: AutoTarget | None = None
    zero_scale: str = "flush"

    def __post_init__(self) -> None:
        object.__setattr__(self, "block", tuple(int(b) for b in self.block))
        for name, value, allowed in self.problems():
            raise ValueError(f"QuantSpec field {name!r}: value {value!r}: {allowed}")

    def problems(self) -> list[tuple[str, object, str]]:
        """Every reason this spec is invalid, as (field, value, what is allowed); empty if valid."""
        return spec_problems(**{f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def stochastic(self) -> bool:
        """Whether the element rounding draws random bits ("sr" or "stochastic_fast")."""
        return self.rounding in STOCHASTIC_ROUNDINGS

    def __str__(self) -> str:
        t = "none" if self.target is None else str(self.auto_target) if self.auto_target else f"{self.target:g}"
        parts = [
            f"{self.element}/{self.scale}",
            "x".join(map(str, self.block)),
            f"T={t}",
            self.rounding.upper(),
            str(self.tensor_scaling),
        ]
        if self.rht:
            parts.append("RHT")
        if self.scale_rounding != "rne":
            parts.append(f"scale-{self.scale_rounding}")
        if self.zero_scale != "flush":
            parts.append(f"zero-scale-{self.zero_scale}")
        return " ".join(parts)


def spec_problems(
    element="e2m1",
    scale="e4m3",
    block=(1, 16),
    target=448.0,
    rounding="rne",
    scale_rounding="rne",
    rht=False,
    tensor_scaling=TensorScaling(),
    auto_target=None,
    zero_scale="flush",
) -> list[tuple[str, object, str]]:
    """Why these QuantSpec fields are invalid, as (field, value, what is allowed) triples."""
    out = []
    try:
        element_format = get_format(element)
        if not element_format.signed:
            out.append(("element", element, "must be a signed format such as 'e2m1'"))
        elif not element_format.has_zero:  # q = 0 where s_b == 0, and zero elements stay zero
            out.append(("element", element, "must have a zero (a format with a mantissa bit, such as 'e2m1')"))
    except ValueError as err:
        out.append(("element", element, str(err)))
    scale_format = None
    try:
        scale_format = get_format(scale)
        if not scale_format.has_nan:
            out.append(("scale", scale, "needs a NaN code for non-finite blocks, e.g. e4m3, ue5m3, ue8m0"))
    except ValueError as err:
        out.append(("scale", scale, str(err)))
    if tuple(block) not in BLOCKS:
        out.append(("block", list(block), f"allowed {[list(b) for b in BLOCKS]}"))
    if target is not None:
        limit = scale_format.max if scale_format is not None else float("inf")
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= limit:
            out.append(
                ("target", target, f"must satisfy 0 < T <= {limit:g} (the max of scale format {scale!r}), or null")
            )
    if rounding not in ROUNDINGS:
        out.append(("rounding", rounding, f"allowed {list(ROUNDINGS)}"))
    if scale_rounding not in SCALE_ROUNDINGS:
        out.append(("scale_rounding", scale_rounding, f"allowed {list(SCALE_ROUNDINGS)}"))
    if zero_scale not in ZERO_SCALES:
        out.append(("zero_scale", zero_scale, f"allowed {list(ZERO_SCALES)}"))
    if not isinstance(rht, bool):
        out.append(("rht", rht, "true or false"))
    if tensor_scaling.kind not in ("current", "periodic"):
        out.append(("tensor_scaling", tensor_scaling.kind, "allowed 'current' or 'periodic'"))
    elif tensor_scaling.kind == "periodic" and (int(tensor_scaling.interval) < 1 or target is None):
        out.append(("tensor_scaling", str(tensor_scaling), "periodic scaling needs interval >= 1 and a target"))
    if auto_target is not None:
        out += auto_target_problems(auto_target, target, scale_format, scale, tensor_scaling)
    return out


def auto_target_problems(
    auto: AutoTarget, target, scale_format, scale: str, tensor_scaling: TensorScaling
) -> list[tuple[str, object, str]]:
    """Why an automatic target is invalid: its bounds must be valid targets of the scale format,
    and it needs a held amax to measure growth against."""
    out = []
    limit = scale_format.max if scale_format is not None else float("inf")
    for name in ("min", "max"):
        value = getattr(auto, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= limit:
            out.append(
                (f"auto_target.{name}", value, f"must satisfy 0 < T <= {limit:g} (the max of scale format {scale!r})")
            )
    if not out and auto.max < auto.min:
        out.append(("auto_target.max", auto.max, f"must be >= auto_target.min ({auto.min:g})"))
    if isinstance(auto.safety, bool) or not isinstance(auto.safety, (int, float)) or not auto.safety > 0:
        out.append(("auto_target.safety", auto.safety, "must be a number > 0"))
    if isinstance(auto.window, bool) or not isinstance(auto.window, int) or auto.window < 1:
        out.append(("auto_target.window", auto.window, "must be an integer >= 1 (refresh intervals)"))
    if target != auto.min:
        out.append(("target", target, f"an automatic target starts at auto_target.min ({auto.min!r})"))
    if tensor_scaling.kind != "periodic":
        out.append(("auto_target", str(auto), "needs periodic tensor scaling (growth is measured against a held amax)"))
    return out


GEMM_KINDS = ("fp32", "probe_matched")
#: The group sizes the probe-matched model allows: powers of two a GEMM kernel's K tile can be.
GEMM_GROUPS = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class GemmModel:
    """How a GEMM of two quantized operands turns its encoded operands into its output (a recipe's
    ``gemm:``). a (M×K) and b (N×K) are the encoded operands q·s_b (exact in BF16), d_a and d_b
    their float32 decode scales (1/g, 1 without a tensor scale).

    fp32:           y = fl_out(fl32(acc · fl32(d_a · d_b))), acc the FP32 accumulation of a·bᵀ in the
                    GEMM library's own order (cuBLAS on CUDA, torch on the CPU).
    probe_matched:  the model the paper's authors fitted to probes of native FP4 tensor-core GEMM
                    outputs (``fp4repro.reference.gemm``). K is cut into consecutive groups of
                    ``group`` terms (the last one may be shorter), and

                        p_j = rn32(Σ_{k in group j} a_k · b_k)     the exact sum, rounded once
                        acc = rz32(… rz32(rz32(+0 + p_0) + p_1) … + p_{G-1})   in order
                        r   = ℓ · rne(acc / ℓ)                     ℓ = ``lattice`` (None: r = acc)
                        y   = fl_out(fl32(r · fl32(d_a · d_b)))

                    rn32: to nearest-even FP32; rz32: toward zero; rne: to the nearest integer,
                    ties to even. ``lattice`` is a power of two (the authors' 1/1024).
    """

    kind: str = "fp32"
    group: int = 64
    lattice: float | None = 2.0**-10

    def __post_init__(self) -> None:
        for name, value, allowed in gemm_problems(self.kind, self.group, self.lattice):
            raise ValueError(f"GemmModel field {name!r}: value {value!r}: {allowed}")

    def __str__(self) -> str:
        if self.kind == "fp32":
            return "fp32"
        lattice = (
            "none"
            if self.lattice is None
            else f"1/{round(1 / self.lattice)}"
            if self.lattice < 1
            else f"{self.lattice:g}"
        )
        return f"{self.kind}(group {self.group}, lattice {lattice})"


def gemm_problems(kind, group, lattice) -> list[tuple[str, object, str]]:
    """Why these GemmModel fields are invalid, as (field, value, what is allowed) triples."""
    out = []
    if kind not in GEMM_KINDS:
        out.append(("model", kind, f"allowed {list(GEMM_KINDS)}"))
    if isinstance(group, bool) or group not in GEMM_GROUPS:
        out.append(("group", group, f"allowed {list(GEMM_GROUPS)} (terms summed exactly before each FP32 add)"))
    if lattice is not None and (
        isinstance(lattice, bool)
        or not isinstance(lattice, (int, float))
        or not lattice > 0
        or math.frexp(lattice)[0] != 0.5
        or not 2.0**-24 <= lattice <= 1
    ):
        out.append(("lattice", lattice, "a power of two from 2^-24 to 1, such as 1/1024, or none"))
    return out


@dataclass(frozen=True)
class LinearSpecs:
    """The QuantSpec of each operand of one linear layer (None leaves that operand in high
    precision), and the model of its GEMMs whose two operands are both quantized (``GemmModel``;
    a GEMM with an operand in high precision is an ordinary FP32-accumulating GEMM)."""

    fprop_x: QuantSpec | None = None
    fprop_w: QuantSpec | None = None
    dgrad_dy: QuantSpec | None = None
    dgrad_w: QuantSpec | None = None
    wgrad_dy: QuantSpec | None = None
    wgrad_x: QuantSpec | None = None
    gemm: GemmModel = GemmModel()

    @classmethod
    def from_operands(cls, specs: dict[str, QuantSpec | None], gemm: GemmModel = GemmModel()) -> LinearSpecs:
        return cls(**{name.replace(".", "_"): specs.get(name) for name in OPERANDS}, gemm=gemm)

    def __getitem__(self, operand: str) -> QuantSpec | None:
        return getattr(self, operand.replace(".", "_"))

    def items(self):
        return [(name, self[name]) for name in OPERANDS]

    @property
    def any_quantized(self) -> bool:
        return any(spec is not None for _, spec in self.items())
