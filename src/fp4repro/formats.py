"""Minifloat formats: decode, encode and round for any ExMy, signed or unsigned.

A format is fixed by its exponent bits ``e``, mantissa bits ``m``, ``bias``, whether it has a
sign bit, whether it has subnormals, and which codes are special:

* ``specials="none"``      every code is finite (OCP FP4/FP6: e2m1, e3m2, e2m3).
* ``specials="nan"``       only the all-ones code (per sign) is NaN (e4m3 "fn", ue8m0).
* ``specials="ieee"``      the all-ones exponent holds ±inf (mantissa 0) and NaN (others) (e5m2).
* ``specials="reserved"``  the all-ones exponent field is reserved: none of its codes is finite,
                           the all-ones code is the NaN code, and rounding and encoding never
                           produce the others (ue5m3: its largest finite value is
                           1.875 · 2^15 = 61440, as the UE5M3 FP4 paper's authors define it).

Value of a code with exponent field E and mantissa field M (``s`` the sign bit)::

    normal     (E > 0 or no subnormals):  (-1)^s · 2^(E - bias) · (1 + M / 2^m)
    subnormal  (E == 0, subnormals):      (-1)^s · 2^(1 - bias) · (M / 2^m)

Formats without subnormals and with ``m == 0`` (ue8m0) have no zero: code 0 is 2^-bias.

Rounding works on float32 values and returns float32 values on the format's grid::

    a   = min(|x|, max)                          # saturate first: max is on the grid
    e   = max(floor(log2 a), e_min)              # binade; e_min = 1 - bias (subnormal quantum below)
    ulp = 2^(e - m)                              # spacing of the grid in that binade
    rne: q = round_half_even(a / ulp) · ulp
    sr:  q = (floor(a / ulp) + [u < frac(a / ulp)]) · ulp,   u in [0, 1)
    stochastic_fast:  q = (floor(a / ulp) + [0 < frac(a / ulp) and u <= frac(a / ulp)]) · ulp

Every step is exact in float32 (scaling by a power of two, floor, round), so the result is the
correctly rounded value.  Stochastic rounding draws 8 random bits per value, a byte b uniform on
0..255, as the kernels and SR hardware do, and uses u = (255 - b + 1/2) / 256 = (511 - 2b) / 512.
With delta = frac(a / ulp), the two stochastic modes differ only at delta = (2j + 1) / 512:

    sr:               up  iff  u <  delta  iff  delta + (2b + 1) / 512 >  1
    stochastic_fast:  up  iff  u <= delta  iff  delta + (2b + 1) / 512 >= 1

The second is the rule of the UE5M3 FP4 paper's authors (their ``StochasticFast``, with their r = b).
Non-finite inputs are never made finite: NaN stays NaN and ±inf stays ±inf (``encode``
maps them to the format's NaN/inf codes, or raises for formats that have neither).

Where this differs from torch's float8 casts (checked in the tests): torch's ``float8_e5m2`` cast
rounds finite values above 61440 to inf (we saturate at 57344); torch's ``float8_e4m3fn`` cast
maps ±inf to ±448 (we keep ±inf, i.e. NaN when encoded); torch's ``float8_e8m0fnu`` maps inf to
NaN (so do we when encoding) and rounds float32-subnormal inputs in [2^-127, 2^-126) up to 2^-126
(we round them to the nearest of the two).  Everywhere else the values agree bit for bit.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["Minifloat", "get_format", "FORMAT_NAMES", "ROUNDING_MODES", "exp2_exact"]

# A format's definition (fields, range, codes) is plain Python: configs are validated against it
# without loading torch. Rounding, encoding and decoding tensors import torch where they run.
FLT32_MAX = 3.4028234663852886e38

_SPECIALS = ("none", "nan", "ieee", "reserved")
ROUNDING_MODES = ("rne", "sr", "stochastic_fast", "up")


def exp2_exact(e: torch.Tensor, lowest: int = -149) -> torch.Tensor:
    """2**e as float32, exact, for integer tensors e in [lowest, 127], built from the bit pattern.

    ``lowest`` >= -126 (known from the format's range) skips the float32-subnormal branch.
    """
    import torch

    e = e.to(torch.int32)
    if lowest >= -126:
        return ((e + 127) << 23).view(torch.float32)
    normal = (e + 127).clamp(min=1) << 23  # 2^e for e >= -126
    subnormal = torch.ones_like(e) << (e + 149).clamp(0, 22)  # 2^e for -149 <= e < -126
    bits = torch.where(e >= -126, normal, subnormal)
    return bits.view(torch.float32)


@dataclass(frozen=True)
class Minifloat:
    """A minifloat format of at most 8 bits. Values are float32; codes are uint8."""

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    signed: bool = True
    subnormals: bool = True
    specials: str = "none"

    def __post_init__(self) -> None:
        if self.exp_bits < 1 or self.man_bits < 0:
            raise ValueError(f"format {self.name!r}: need exp_bits >= 1 and man_bits >= 0")
        if self.bits > 8:
            raise ValueError(f"format {self.name!r}: {self.bits} bits; at most 8 are supported")
        if self.specials not in _SPECIALS:
            raise ValueError(f"format {self.name!r}: specials={self.specials!r}, allowed: {_SPECIALS}")
        if self.specials == "ieee" and self.man_bits == 0:
            raise ValueError(f"format {self.name!r}: ieee specials need a mantissa bit for NaN")
        if not self.subnormals and self.man_bits > 0:
            raise ValueError(f"format {self.name!r}: formats without subnormals must have m == 0")
        if self.min_positive < 2.0**-149 or self.max > FLT32_MAX:
            raise ValueError(f"format {self.name!r}: range exceeds float32")

    # ----------------------------------------------------------------------------- constants
    @property
    def bits(self) -> int:
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def _top_exp_field(self) -> int:
        """Largest exponent field that holds finite values."""
        all_ones = 2**self.exp_bits - 1
        if self.specials in ("ieee", "reserved") or (self.specials == "nan" and self.man_bits == 0):
            return all_ones - 1
        return all_ones

    @property
    def emax(self) -> int:
        return self._top_exp_field - self.bias

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal binade."""
        return (1 if self.subnormals else 0) - self.bias

    @property
    def max(self) -> float:
        top_mantissa = 2**self.man_bits - 1
        if self.specials == "nan" and self.man_bits > 0 and self._top_exp_field == 2**self.exp_bits - 1:
            top_mantissa -= 1  # the all-ones code is NaN
        return math.ldexp(1.0 + top_mantissa / 2**self.man_bits, self.emax)

    def overflow_threshold(self, mode: str = "rne") -> float:
        """Smallest float32 |x| that rounding (without saturation) would carry above ``max``: the
        values that saturation changes are exactly those with |x| >= it.

        The grid continued past max has its next point max + ulp (ulp of the top binade):

        * "rne": the midpoint m = max + ulp/2 is a tie, which goes to the neighbour with the even
          significand: up when max / ulp is odd (61440 = 15 · 4096 in UE5M3, 6 = 3 · 2 in E2M1,
          2^127 = 1 · 2^127 in UE8M0), so the threshold is m; down to max when it is even
          (448 = 14 · 32 in E4M3), so the threshold is the next float32 above m.
        * "up" (and the stochastic modes, which may round any |x| > max up): the next float32
          above max.
        """
        if mode != "rne":
            return _next_float32(self.max)
        ulp = math.ldexp(1.0, self.emax - self.man_bits)
        midpoint = self.max + ulp / 2
        return midpoint if round(self.max / ulp) % 2 == 1 else _next_float32(midpoint)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (equals min_normal for formats without subnormals)."""
        return math.ldexp(1.0, self.emin - self.man_bits) if self.subnormals else self.min_normal

    min_positive = min_subnormal

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @property
    def has_nan(self) -> bool:
        return self.specials != "none"

    @property
    def has_inf(self) -> bool:
        return self.specials == "ieee"

    @property
    def nan_code(self) -> int:
        if not self.has_nan:
            raise ValueError(f"format {self.name!r} has no NaN code")
        return 2 ** (self.exp_bits + self.man_bits) - 1  # positive all-ones

    @property
    def inf_code(self) -> int:
        if not self.has_inf:
            raise ValueError(f"format {self.name!r} has no inf code")
        return (2**self.exp_bits - 1) << self.man_bits

    @property
    def _sign_bit(self) -> int:
        return 1 << (self.exp_bits + self.man_bits)

    # ----------------------------------------------------------------------------- decode
    @cached_property
    def _table(self) -> torch.Tensor:
        """float32 value of every code 0 .. 2^bits - 1 (NaN codes carry the code's sign bit)."""
        import torch

        bits = []
        for code in range(2**self.bits):
            negative = self.signed and bool(code & self._sign_bit)
            magnitude_code = code & (self._sign_bit - 1)
            exp_field = magnitude_code >> self.man_bits
            man_field = magnitude_code & (2**self.man_bits - 1)
            if self.specials == "ieee" and exp_field == 2**self.exp_bits - 1:
                value = math.inf if man_field == 0 else math.nan
            elif self.specials == "reserved" and exp_field == 2**self.exp_bits - 1:
                value = math.nan  # reserved codes: never produced, decoded as NaN
            elif self.specials == "nan" and magnitude_code == self.nan_code:
                value = math.nan
            elif exp_field == 0 and self.subnormals:
                value = math.ldexp(man_field / 2**self.man_bits, 1 - self.bias)
            else:
                value = math.ldexp(1.0 + man_field / 2**self.man_bits, exp_field - self.bias)
            pattern = 0x7FC00000 if math.isnan(value) else struct.unpack("<I", struct.pack("<f", value))[0]
            bits.append(pattern | (0x80000000 if negative else 0))
        return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """uint8 codes -> float32 values (table lookup)."""
        import torch

        if codes.dtype != torch.uint8:
            raise TypeError(f"decode expects uint8 codes, got {codes.dtype}")
        if self.bits < 8 and codes.numel() and int(codes.max()) >= 2**self.bits:
            raise ValueError(f"codes out of range for {self.bits}-bit format {self.name!r}")
        return self._table.to(codes.device)[codes.long()]

    def values(self) -> torch.Tensor:
        """All finite non-negative values of the format, ascending (float32)."""
        import torch

        t = self._table
        return torch.unique(t[torch.isfinite(t)].abs())

    # ----------------------------------------------------------------------------- round
    def round(
        self,
        x: torch.Tensor,
        mode: str = "rne",
        generator: torch.Generator | None = None,
        rand: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Round float values onto this format's grid; float32 in, float32 out, saturating.

        mode: "rne" (round half to even), "sr" or "stochastic_fast" (stochastic: up with
        probability about frac, see the module docstring) or "up" (toward +inf in magnitude: the
        smallest grid value >= |x|, used for power-of-two block scales so that no element of the
        block exceeds the element format's max).
        For the stochastic modes, ``rand`` (float32 uniforms in [0, 1), x's shape) may be given so
        that a kernel and this reference consume the same random numbers; otherwise they are
        drawn as the kernels draw them, 8 random bits per element: u = (k + 1/2) / 256 with k
        uniform in 0..255 from ``generator`` (hardware SR, Blackwell's ``cvt.rs``, also takes 8
        bits per value; the kernels' byte b is k = 255 - b). With delta = frac(|x| / ulp):

            sr:               up  iff  u <  delta   P(up) = round(256·delta)/256, ties down
            stochastic_fast:  up  iff  u <= delta   (and delta > 0)   ties up

        a bias of at most 2^-9 ulp. The ``delta > 0`` of stochastic_fast only matters for a
        given u off the 8-bit cell midpoints (u = 0 would otherwise move values on the grid).
        Unsigned formats map negative inputs to NaN (they cannot be represented).
        """
        import torch

        x = x.to(torch.float32)
        magnitude = x.abs()
        # NaN or inf anywhere shows in the amax (cheap): only then are non-finite lanes restored
        finite = not magnitude.numel() or bool(torch.isfinite(magnitude.amax()))
        a = magnitude.clamp(max=self.max)
        if not self.has_zero:
            a = a.clamp(min=self.min_positive)
        # floor(log2 a), clamped to e_min, from a's exponent field: exact for a normal float32 a;
        # a zero or float32-subnormal a has field 0 (-127 after the bias), and every format's
        # e_min is >= -127, so the clamp gives e_min exactly as floor(log2 a) < -126 would
        e = ((a.view(torch.int32) >> 23) - 127).clamp(min=self.emin)
        ulp_exp = e - self.man_bits
        lowest_ulp = self.emin - self.man_bits
        t = a * exp2_exact(-ulp_exp, lowest=self.man_bits - self.emax)  # a / ulp, exact
        if mode == "rne":
            n = torch.round(t)  # half to even
        elif mode == "up":
            n = torch.ceil(t)
        elif mode in ("sr", "stochastic_fast"):
            rand = self._uniforms(x, generator, rand)
            floor = torch.floor(t)
            delta = t - floor  # exact
            up = rand < delta if mode == "sr" else (rand <= delta) & (delta > 0)
            n = floor + up.to(torch.float32)
        else:
            raise ValueError(f"rounding mode {mode!r}; allowed: {', '.join(map(repr, ROUNDING_MODES))}")
        q = (n * exp2_exact(ulp_exp, lowest=lowest_ulp)).clamp(max=self.max)  # SR may step one ulp past max
        if not self.has_zero:
            q = q.clamp(min=self.min_positive)
        q = torch.copysign(q, x) if self.signed else torch.where(x < 0, torch.nan, q)
        return q if finite else torch.where(torch.isfinite(x), q, x)

    @staticmethod
    def _uniforms(x: torch.Tensor, generator: torch.Generator | None, rand: torch.Tensor | None) -> torch.Tensor:
        """The u of stochastic rounding: ``rand`` checked against x's shape, or 8-bit cell
        midpoints u = (k + 1/2) / 256, k uniform on 0..255 from ``generator`` (float32)."""
        import torch

        if rand is None:
            # uint8: the same draws as the default int64, in less time and memory
            k = torch.randint(0, 256, x.shape, generator=generator, device=x.device, dtype=torch.uint8)
            return (k.to(torch.float32) + 0.5) / 256
        if rand.shape != x.shape:
            raise ValueError(f"rand has shape {tuple(rand.shape)}, expected {tuple(x.shape)}")
        return rand

    # ----------------------------------------------------------------------------- encode
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """float values -> uint8 codes: RNE onto the grid, then the bit fields.

        NaN -> the NaN code (sign kept for signed formats); ±inf -> the inf code where the format
        has one, else NaN; raises for a non-finite input in a format with no special codes.
        """
        import torch

        q = self.round(x)
        finite = torch.isfinite(q)
        if not self.has_nan and not bool(finite.all()):
            raise ValueError(f"format {self.name!r} has no code for NaN/inf")
        a = q.abs()
        _, frexp_exp = torch.frexp(a)
        e = frexp_exp - 1
        if self.subnormals:
            is_normal = a >= self.min_normal
            exp_field = torch.where(is_normal, e + self.bias, torch.zeros_like(e))
            frac = torch.where(is_normal, a * exp2_exact(-e) - 1.0, a * exp2_exact(torch.full_like(e, -self.emin)))
        else:
            exp_field = e + self.bias
            frac = a * exp2_exact(-e) - 1.0
        man_field = (frac * 2**self.man_bits).to(torch.int32)
        code = (exp_field.to(torch.int32) << self.man_bits) | man_field
        if self.has_nan:
            special = torch.full_like(code, self.nan_code)
            if self.has_inf:
                special = torch.where(torch.isinf(q), torch.full_like(code, self.inf_code), special)
            code = torch.where(finite, code, special)
        if self.signed:
            code = code | (torch.signbit(q).to(torch.int32) << (self.exp_bits + self.man_bits))
        return code.to(torch.uint8)

    def __str__(self) -> str:
        return self.name


def _next_float32(value: float) -> float:
    """The next float32 above a positive finite float32 ``value`` (its bit pattern plus one)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return struct.unpack("<f", struct.pack("<I", bits + 1))[0]


# --------------------------------------------------------------------------------- registry
def _generic(name: str, signed: bool, e: int, m: int) -> Minifloat:
    """Generic ExMy: bias 2^(e-1)-1; signed ones have no special codes (OCP FP4/FP6 style),
    unsigned ones reserve the all-ones code for NaN (like ue4m3 and ue8m0); m == 0 means a
    power-of-two format without zero or subnormals (like ue8m0)."""
    return Minifloat(
        name=name,
        exp_bits=e,
        man_bits=m,
        bias=2 ** (e - 1) - 1,
        signed=signed,
        subnormals=m > 0,
        specials="none" if signed else "nan",
    )


_REGISTRY: dict[str, Minifloat] = {
    "e2m1": Minifloat("e2m1", 2, 1, 1, signed=True, specials="none"),
    "e2m3": Minifloat("e2m3", 2, 3, 1, signed=True, specials="none"),
    "e3m2": Minifloat("e3m2", 3, 2, 3, signed=True, specials="none"),
    "e4m3": Minifloat("e4m3", 4, 3, 7, signed=True, specials="nan"),
    "e5m2": Minifloat("e5m2", 5, 2, 15, signed=True, specials="ieee"),
    "ue4m3": Minifloat("ue4m3", 4, 3, 7, signed=False, specials="nan"),
    "ue5m3": Minifloat("ue5m3", 5, 3, 15, signed=False, specials="reserved"),
    "ue8m0": Minifloat("ue8m0", 8, 0, 127, signed=False, subnormals=False, specials="nan"),
}
_GENERIC = re.compile(r"^(u?)e(\d+)m(\d+)$")
FORMAT_NAMES = tuple(_REGISTRY)


def get_format(name: str) -> Minifloat:
    """Format by name: a registered one (``FORMAT_NAMES``) or a generic ``eXmY`` / ``ueXmY``."""
    if isinstance(name, Minifloat):
        return name
    key = str(name).lower()
    if key in _REGISTRY:
        return _REGISTRY[key]
    match = _GENERIC.match(key)
    if match is None:
        raise ValueError(
            f"unknown format {name!r}; allowed: {', '.join(FORMAT_NAMES)} or a generic "
            "'eXmY' / 'ueXmY' of at most 8 bits"
        )
    unsigned, e, m = match.group(1) == "u", int(match.group(2)), int(match.group(3))
    if e < 1:
        raise ValueError(f"unknown format {name!r}: needs at least one exponent bit")
    _REGISTRY[key] = fmt = _generic(key, not unsigned, e, m)
    return fmt
