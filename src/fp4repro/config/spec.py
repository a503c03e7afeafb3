"""What to quantize and how: one frozen QuantSpec per GEMM operand, six per linear layer."""

from __future__ import annotations

from dataclasses import dataclass, fields

from fp4repro.formats import get_format

#: The operands of a linear Y = X·Wᵀ, named "<gemm>.<tensor>", in the order of the recipe table.
#: fprop reduces over in_features, dgrad over out_features, wgrad over tokens.
OPERANDS = ("fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x")
GEMMS = {"fprop": ("fprop.x", "fprop.w"), "dgrad": ("dgrad.dy", "dgrad.w"), "wgrad": ("wgrad.dy", "wgrad.x")}
BLOCKS = ((1, 16), (16, 16), (1, 32))
ROUNDINGS = ("rne", "sr")
SCALE_ROUNDINGS = ("rne", "up")


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
class QuantSpec:
    """Numerics of one GEMM operand (see the numerics contract in the README).

    element:        payload format (signed), e.g. "e2m1"
    scale:          block-scale format with a NaN code, e.g. "e4m3" (used unsigned), "ue5m3", "ue8m0"
    block:          (rows, cols) of a block; cols run along the GEMM's reduction dimension
    target:         T, where the largest block scale lands: g = Emax·T / A; None = no tensor scale
                    (g = 1, MX style)
    rounding:       element rounding, "rne" or "sr"
    scale_rounding: block-scale rounding, "rne" (nearest even) or "up" (toward +inf, MX style)
    rht:            16-point randomized Hadamard transform along the reduction dimension first
    tensor_scaling: current or periodic amax
    """

    element: str = "e2m1"
    scale: str = "e4m3"
    block: tuple[int, int] = (1, 16)
    target: float | None = 448.0
    rounding: str = "rne"
    scale_rounding: str = "rne"
    rht: bool = False
    tensor_scaling: TensorScaling = TensorScaling()

    def __post_init__(self) -> None:
        object.__setattr__(self, "block", tuple(int(b) for b in self.block))
        for name, value, allowed in self.problems():
            raise ValueError(f"QuantSpec field {name!r}: value {value!r}: {allowed}")

    def problems(self) -> list[tuple[str, object, str]]:
        """Every reason this spec is invalid, as (field, value, what is allowed); empty if valid."""
        return spec_problems(**{f.name: getattr(self, f.name) for f in fields(self)})

    def __str__(self) -> str:
        t = "none" if self.target is None else f"{self.target:g}"
        parts = [f"{self.element}/{self.scale}", "x".join(map(str, self.block)), f"T={t}",
                 self.rounding.upper(), str(self.tensor_scaling)]
        if self.rht:
            parts.append("RHT")
        if self.scale_rounding != "rne":
            parts.append(f"scale-{self.scale_rounding}")
        return " ".join(parts)


def spec_problems(element="e2m1", scale="e4m3", block=(1, 16), target=448.0, rounding="rne",
                  scale_rounding="rne", rht=False,
                  tensor_scaling=TensorScaling()) -> list[tuple[str, object, str]]:
    """Why these QuantSpec fields are invalid, as (field, value, what is allowed) triples."""
    out = []
    try:
        element_format = get_format(element)
        if not element_format.signed:
            out.append(("element", element, "must be a signed format such as 'e2m1'"))
        elif not element_format.has_zero:   # q = 0 where s_b == 0, and zero elements stay zero
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
            out.append(("target", target,
                        f"must satisfy 0 < T <= {limit:g} (the max of scale format {scale!r}), or null"))
    if rounding not in ROUNDINGS:
        out.append(("rounding", rounding, f"allowed {list(ROUNDINGS)}"))
    if scale_rounding not in SCALE_ROUNDINGS:
        out.append(("scale_rounding", scale_rounding, f"allowed {list(SCALE_ROUNDINGS)}"))
    if not isinstance(rht, bool):
        out.append(("rht", rht, "true or false"))
    if tensor_scaling.kind not in ("current", "periodic"):
        out.append(("tensor_scaling", tensor_scaling.kind, "allowed 'current' or 'periodic'"))
    elif tensor_scaling.kind == "periodic" and (int(tensor_scaling.interval) < 1 or target is None):
        out.append(("tensor_scaling", str(tensor_scaling), "periodic scaling needs interval >= 1 and a target"))
    return out


@dataclass(frozen=True)
class LinearSpecs:
    """The QuantSpec of each operand of one linear layer; None leaves that operand in high precision."""

    fprop_x: QuantSpec | None = None
    fprop_w: QuantSpec | None = None
    dgrad_dy: QuantSpec | None = None
    dgrad_w: QuantSpec | None = None
    wgrad_dy: QuantSpec | None = None
    wgrad_x: QuantSpec | None = None

    @classmethod
    def from_operands(cls, specs: dict[str, QuantSpec | None]) -> "LinearSpecs":
        return cls(**{name.replace(".", "_"): specs.get(name) for name in OPERANDS})

    def __getitem__(self, operand: str) -> QuantSpec | None:
        return getattr(self, operand.replace(".", "_"))

    def items(self):
        return [(name, self[name]) for name in OPERANDS]

    @property
    def any_quantized(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))
