"""The kernel's two hooks for an automatic target T: T as a runtime argument (a new T compiles
nothing, and rounds Emax·T to float32 as the reference does), and the live tensor amax the
quantization kernel max-folds into running slots as a by-product (``live=``), bit for bit the
reference's current amax, and across calls their maximum. Without CUDA the kernels run in Triton's
interpreter (conftest.py sets TRITON_INTERPRET)."""

import zlib

import pytest
import torch

from fp4repro.kernels import (
    _quantize_plan,
    emax_target,
    fold_live_amax,
    live_slots,
    live_slots_amax,
    operand_amax_triton,
    operand_amax_with_rht_and_bf16_triton,
    operand_amax_with_rht_triton,
    philox_uniforms,
    quantize_2d,
    quantize_launch,
)
from fp4repro.kernels.launch import _arg_key
from fp4repro.quant import QuantSpec, TensorScaling
from fp4repro.reference.block import global_encode_scale, scaled_operand_reference
from fp4repro.reference.geometry import pad_to_blocks
from fp4repro.reference.rht import rht

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
FLT_MAX = torch.finfo(torch.float32).max

SPECS = {
    "1x16 RNE current": QuantSpec(),
    "1x16 SR": QuantSpec(rounding="sr"),
    "1x16 RHT+SR": QuantSpec(rounding="sr", rht=True),
    "16x16 RNE": QuantSpec(block=(16, 16)),
    "16x16 RHT": QuantSpec(block=(16, 16), rht=True),
    "ue5m3 held": QuantSpec(scale="ue5m3", tensor_scaling=TensorScaling("periodic", 50)),
    "ue5m3 T2048 SR": QuantSpec(scale="ue5m3", target=2048, rounding="sr"),
    "1x32 MX": QuantSpec(scale="ue8m0", block=(1, 32), target=None, scale_rounding="up"),
}


def _seed(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def _x(kind: str, shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape, generator=g))
    rows, cols = shape
    if kind == "nan-inf":
        x[rows // 2, cols // 3] = float("nan")
        x[0, cols - 1] = float("inf")
        x[rows - 1, 0] = -float("inf")
        x[1 % rows, :] = float("nan")  # a whole row: all-NaN blocks
    elif kind == "inf-beside-max":  # the largest finite |x| shares a block with inf
        x[3 % rows, 4 % cols] = -1e6
        x[3 % rows, 5 % cols] = float("inf")
    elif kind == "all-nonfinite":
        x = torch.where(torch.rand(shape, generator=g) < 0.5, float("nan"), float("inf")) * x.sign()
    elif kind == "zero":
        x = torch.zeros(shape)
    elif kind == "subnormal":  # float32 subnormals only
        x = torch.randint(-(2**20), 2**20, shape, generator=g).float() * 2.0**-149
    elif kind == "huge":  # near float32's max, some at it
        x = torch.sign(x) * FLT_MAX * torch.rand(shape, generator=g).clamp(0.5, 1.0)
        x[0, 0] = -FLT_MAX
    return x


def _expected(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """max |x| of the padded (and RHT'd) matrix with NaN counted as inf, computed independently."""
    xp = pad_to_blocks(x.float(), spec)
    if spec.rht:
        xp = rht(xp)
    return torch.nan_to_num(xp.abs(), nan=float("inf"), posinf=float("inf")).max()


def _device_x(x: torch.Tensor, columnwise: bool) -> torch.Tensor:
    xd = x.to(DEVICE)
    if columnwise:  # a transposed view, memory down the rows, as wgrad hands Xᵀ
        xd = xd.t().contiguous().t()
        assert xd.stride() == (1, x.shape[0])
    return xd


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal float32 bit patterns (so +0 and -0, or two NaNs, are told apart)."""
    return (
        a.reshape(()).to(torch.float32).view(torch.int32).item()
        == b.reshape(()).to(torch.float32).view(torch.int32).item()
    )


KINDS = ["normal", "nan-inf", "inf-beside-max", "all-nonfinite", "zero", "subnormal", "huge"]


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("columnwise", [False, True], ids=["rows", "columns"])
def test_live_amax_equals_finite_max_of_padded_rht_input(name, kind, columnwise):
    spec = SPECS[name]
    shape = (37, 72) if columnwise else (40, 70)  # ragged: padding to 16 rows or columns
    x = _x(kind, shape, _seed(name, kind, columnwise) % 10_000)
    held = torch.tensor(3.0) if spec.tensor_scaling.kind == "periodic" or "SR" in name else None
    slots = live_slots(DEVICE)
    k = quantize_2d(_device_x(x, columnwise), spec, amax=held, seed=5, out_dtype=torch.float32, live=slots)
    live = live_slots_amax(slots)
    assert live.dtype == torch.float32 and live.dim() == 0 and live.device.type == torch.device(DEVICE).type
    expected = _expected(x, spec)
    assert _same(live.cpu(), expected), (float(live), float(expected))
    # the reference's live amax, bit for bit
    assert _same(live.cpu(), scaled_operand_reference(x, spec, amax=held if held is not None else 1.0, live=True).live)
    if kind == "zero":
        assert float(live) == 0.0
    if kind in ("nan-inf", "inf-beside-max", "all-nonfinite"):
        assert float(live) == float("inf")
    # live= changes nothing else
    plain = quantize_2d(_device_x(x, columnwise), spec, amax=held, seed=5, out_dtype=torch.float32)
    torch.testing.assert_close(k["qs"], plain["qs"], rtol=0, atol=0, equal_nan=True)
    assert _same(k["decode_scale"], plain["decode_scale"]) and k.keys() == plain.keys()


@pytest.mark.parametrize("name", ["1x16 RNE current", "1x16 RHT+SR", "16x16 RHT"])
@pytest.mark.parametrize("columnwise", [False, True], ids=["rows", "columns"])
def test_live_amax_with_current_amax_equals_the_amax_pass(name, columnwise):
    # no held amax: the launcher's own amax pass (operand_amax_triton) gave A, and the live amax of a
    # finite tensor is A
    spec = SPECS[name]
    x = _x("normal", (48, 96), _seed("current", name, columnwise) % 10_000)
    xd = _device_x(x, columnwise)
    slots = live_slots(DEVICE)
    k = quantize_2d(xd, spec, seed=3, live=slots, stats=True, codes=True)
    assert _same(live_slots_amax(slots), k["amax"]) and _same(live_slots_amax(slots), operand_amax_triton(xd, spec))


@pytest.mark.parametrize("shape", [(16, 128), (64, 256), (1024, 16)])
def test_live_amax_on_whole_tiles(shape):
    # shapes the tiles cover exactly: the unmasked (EVEN) kernel variant, rows and columns
    spec = SPECS["ue5m3 held"]
    x = _x("nan-inf", shape, _seed("even", *shape) % 10_000)
    for columnwise in (False, True):
        if columnwise and shape[1] < 2:
            continue
        slots = live_slots(DEVICE)
        quantize_2d(_device_x(x, columnwise), spec, amax=torch.tensor(1.0), live=slots)
        assert _same(live_slots_amax(slots).cpu(), _expected(x, spec))


def test_without_live_no_live_constexprs():
    spec = SPECS["ue5m3 held"]
    plain = dict(_quantize_plan(spec, (32, 64), (64, 1), True, False, False)[3])
    live = dict(_quantize_plan(spec, (32, 64), (64, 1), True, False, False, True)[3])
    assert not any(name.startswith("LIVE") for name in plain)
    assert live.pop("LIVE") is True and live.pop("LIVE_SLOTS") > 1 and live.pop("LIVE_SLOT_STRIDE") >= 1
    live.pop("LIVE_TILES", None)  # row tiles a program folds (a 2x1 grid of 16x128 tiles here)
    live.pop("LIVE_UNROLL", None)
    assert live == plain


@pytest.mark.parametrize("name", ["ue5m3 held", "ue5m3 T2048 SR"])
@pytest.mark.parametrize("rows", [64, 80])
def test_every_row_tile_of_a_program_reaches_the_slots(name, rows):
    # row-wise 1x16 tiles are folded LIVE_TILES to a program (RNE 2 unrolled, SR 4 in a loop) and
    # reduced once after its loop: a single largest element in any one of the 16-row tiles (the
    # last program of 80 rows has one real tile and the rest wholly masked) must be the live amax
    spec = SPECS[name]
    constexprs = dict(_quantize_plan(spec, (rows, 128), (128, 1), True, False, False, True)[3])
    assert constexprs["LIVE_TILES"] > 1 and constexprs["EVEN"] == (rows % (16 * constexprs["LIVE_TILES"]) == 0)
    base = torch.rand((rows, 128), generator=torch.Generator().manual_seed(_seed("tiles", name, rows)))
    for tile in range(rows // 16):
        x = base.clone()
        x[tile * 16 + 7, 93] = -40.0 - tile
        slots = live_slots(DEVICE)
        quantize_2d(x.to(DEVICE), spec, amax=torch.tensor(1.0), seed=2, live=slots)
        assert float(live_slots_amax(slots)) == 40.0 + tile, tile


def test_slots_hold_the_running_maximum_over_calls_and_tiles():
    # many tiles (rows of 16, columns of 128: a 7x3 grid here) spread over the slots, over three
    # calls: the slots' maximum is the largest of the three tensors' amaxes, whichever tile held it
    spec = SPECS["ue5m3 held"]
    shape = (112, 384)
    slots = live_slots(DEVICE)
    amaxes = []
    for i, scale in enumerate((3.0, 7.5, 0.25)):
        x = torch.rand(shape, generator=torch.Generator().manual_seed(_seed("running", i))) * scale
        quantize_2d(x.to(DEVICE), spec, amax=torch.tensor(1.0), live=slots)
        amaxes.append(_expected(x, spec))
        assert _same(live_slots_amax(slots).cpu(), max(amaxes))
    assert int((slots != 0).sum()) > 1  # more than one slot was used
    # a value folded from elsewhere (the reference's live amax) joins the maximum
    fold_live_amax(slots, torch.tensor(1e3))
    assert float(live_slots_amax(slots)) == 1e3
    assert float(live_slots_amax(live_slots(DEVICE))) == 0.0


def test_slots_of_the_wrong_kind_are_refused():
    x = torch.randn(16, 128).to(DEVICE)
    with pytest.raises(ValueError, match="live_slots"):
        quantize_2d(x, SPECS["ue5m3 held"], amax=torch.tensor(1.0), live=torch.zeros((), dtype=torch.int32))


# ----------------------------------------------------------------------- T as a runtime argument


def _launch_key(x, spec, amax):
    """The Launcher's cache key of a launch (what decides whether it compiles anew), less the device."""
    (grid, args, constexprs, warps), _ = quantize_launch(x, spec, amax=amax, seed=1)
    return warps, constexprs, tuple(map(_arg_key, args))


def test_specs_differing_only_in_target_share_one_compiled_kernel():
    x = torch.randn(32, 64).to(DEVICE)
    amax = torch.tensor(2.0, device=DEVICE)
    specs = [QuantSpec(scale="ue5m3", target=t) for t in (448, 2048, 1000.3, 2047.9, 0.37)]
    plans = {_quantize_plan(s, (32, 64), (64, 1), True, False, False)[3] for s in specs}
    assert len(plans) == 1 and not any(name == "EMAX_T" for name, _ in next(iter(plans)))
    assert len({_launch_key(x, s, amax) for s in specs}) == 1
    # ... while the value does reach the kernel
    ds = {float(quantize_2d(x, s, amax=amax)["decode_scale"]) for s in specs}
    assert len(ds) == len(specs)


@pytest.mark.gpu
def test_new_target_compiles_nothing_on_gpu():
    from fp4repro.kernels import _quantize_launcher

    launcher = _quantize_launcher()
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    amax = torch.tensor(2.0, device="cuda")
    quantize_2d(x, QuantSpec(scale="ue5m3", target=448), amax=amax)
    before = len(launcher._compiled), sum(len(c) for c in launcher.jit_fn.device_caches.values() if isinstance(c, dict))
    for t in (2048, 1000.3, 2047.9, 777.77):
        quantize_2d(x, QuantSpec(scale="ue5m3", target=t), amax=amax)
    after = len(launcher._compiled), sum(len(c) for c in launcher.jit_fn.device_caches.values() if isinstance(c, dict))
    assert after == before


@pytest.mark.parametrize("target", [448, 2048, 1000.3, 2047.9, 61439.3, 0.1, 3.3e37])
def test_emax_target_is_float32_of_the_product(target):
    # the reference's global_encode_scale rounds Emax·T once to float32; the runtime argument is
    # that float32 exactly (a Python float that converts to float32 without rounding)
    value = emax_target(6.0, target)
    f32 = torch.tensor(value, dtype=torch.float32)
    assert float(f32) == value
    assert float(global_encode_scale(torch.tensor(1.0), 6.0, target)) == min(value, FLT_MAX)
    assert emax_target(6.0, None) == 1.0


@pytest.mark.parametrize("target", [1000.3, 2047.9, 448.0001, 61439.3])
@pytest.mark.parametrize("columnwise", [False, True], ids=["rows", "columns"])
def test_adversarial_target_equals_reference_bit_for_bit(target, columnwise):
    # T whose Emax·T is not a float32: the kernel must round it as the reference does (once, to
    # nearest); a subnormal held amax makes Emax·T / A overflow float32 (g clamps to FLT_MAX)
    spec = QuantSpec(scale="ue5m3", target=target, rounding="sr")
    x = _x("nan-inf", (40, 72), _seed("T", target, columnwise) % 10_000)
    for amax in (torch.tensor(3.7), torch.tensor(0.0), torch.tensor(1e-40), torch.tensor(FLT_MAX)):
        k = quantize_2d(
            _device_x(x, columnwise), spec, amax=amax, seed=9, out_dtype=torch.float32, live=live_slots(DEVICE)
        )
        rand = philox_uniforms(40 * 80, 9, 0, device=DEVICE).cpu().reshape(40, 80)
        qs, d, *_ = scaled_operand_reference(x, spec, amax=amax, rand=rand)
        torch.testing.assert_close(k["qs"].cpu(), qs, rtol=0, atol=0, equal_nan=True)
        assert _same(k["decode_scale"].cpu(), d)


@pytest.mark.parametrize("kind", ["normal", "nan-inf", "zero", "huge"])
@pytest.mark.parametrize(
    "spec", [SPECS["1x16 RNE current"], SPECS["16x16 RHT"], SPECS["1x16 RHT+SR"]], ids=["1x16", "16x16 RHT", "1x16 RHT"]
)
def test_the_kernels_operand_amax_is_the_references(spec, kind):
    # what shards of a tensor-parallel operand MAX-reduce before they quantize: the amax over
    # finite elements of the padded, transformed matrix, on both paths
    from fp4repro.reference.block import operand_amax_reference

    x = _x(kind, (40, 72), _seed("operand_amax", kind))
    assert _same(
        operand_amax_triton(x.to(torch.bfloat16).to(DEVICE), spec), operand_amax_reference(x.to(torch.bfloat16), spec)
    )


@pytest.mark.parametrize("where", ["first tile", "last tile", "edge"])
@pytest.mark.parametrize("columnwise", [False, True], ids=["row-wise", "column-wise"])
@pytest.mark.parametrize("spec", [SPECS["1x16 RNE current"], SPECS["1x16 RHT+SR"]], ids=["1x16", "1x16 RHT"])
def test_the_amax_pass_reads_every_tile_of_a_program(spec, columnwise, where, monkeypatch):
    # several tiles a program (one program per SM on a device of one SM, so 8 tiles a program):
    # 42 tiles along the long axis are 6 programs, the last reading 6 tiles past M's edge; the
    # largest |x| sits in a program's first or last tile, or in M's last row (column) of tiles
    import fp4repro.kernels as kernels

    monkeypatch.setattr(kernels, "AMAX_PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(kernels, "_streaming_multiprocessors", lambda device: 1)
    long_extent, other = 42 * 16, 40
    shape = (other, long_extent) if columnwise else (long_extent, other)
    x = _x("normal", shape, _seed("tiles", spec.rht, columnwise, where)).clamp(-50, 50)
    at = {"first tile": 8 * 16 + 3, "last tile": 15 * 16 + 9, "edge": long_extent - 1}[where]
    if columnwise:
        x[other // 2, at] = -1.0e4
    else:
        x[at, other // 2] = -1.0e4
    xd = _device_x(x.to(torch.bfloat16), columnwise)
    assert kernels._amax_tiles(42, 1, xd.device) == 8
    assert _same(operand_amax_triton(xd, spec), _expected(x.to(torch.bfloat16), spec))


#: BF16 subnormals only compiled: Triton's interpreter widens them to other float32 values (its
#: ``operand_amax_triton`` of them differs from the reference too)
BF16_KINDS = [k for k in KINDS if k != "subnormal" or DEVICE == "cuda"]


@pytest.mark.parametrize("kind", BF16_KINDS)
@pytest.mark.parametrize("shape", [(40, 72), (16 * 42 + 5, 200)], ids=["one program", "8 tiles a program, ragged"])
def test_the_amax_with_rht_pass_equals_both_passes_it_replaces(shape, kind, monkeypatch):
    # X's amax row-wise without the RHT (fprop.x, dgrad.dy) and Xᵀ's column-wise with it (wgrad.x,
    # wgrad.dy) from one read of X, each bit for bit the reference's; rows not a multiple of 16 are
    # Xᵀ's zero padding; the second shape takes 8 tiles a program (on a device of one SM)
    import fp4repro.kernels as kernels
    from fp4repro.reference.block import operand_amax_reference

    monkeypatch.setattr(kernels, "AMAX_PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(kernels, "_streaming_multiprocessors", lambda device: 1)
    x = _x(kind, shape, _seed("with_rht", kind, *shape)).to(torch.bfloat16)
    if shape[0] > 16 * 40 and kind == "normal":  # the largest |x| in the ragged last row of tiles
        x[-1, 3] = -1.0e4
    rows, rht = operand_amax_with_rht_triton(x.to(DEVICE))
    assert _same(rows, operand_amax_reference(x, SPECS["1x16 RNE current"]))
    assert _same(rht, operand_amax_reference(x.t(), SPECS["1x16 RHT+SR"]))


def _ties_and_carries(x: torch.Tensor) -> torch.Tensor:
    """x with float32 values that test a cast to BF16 in its first row: exact halfway cases with an
    even and an odd kept bit (down and up), one just past halfway, a mantissa of ones that carries
    into the exponent, the largest float32 (past BF16's largest: inf), and a negative of each."""
    bits = [0x3F808000, 0x3F818000, 0x3F808001, 0x3FFFFFFF, 0x7F7FFFFF, 0x00008000, 0x00018000]
    values = torch.tensor(bits, dtype=torch.int32).view(torch.float32)
    values = torch.cat([values, -values])[: x.shape[1]]
    x = x.clone()
    x[0, : len(values)] = values
    return x


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(40, 72), (16 * 42 + 5, 200)], ids=["one program", "8 tiles a program, ragged"])
def test_the_amax_with_rht_pass_with_the_bf16_cast_equals_the_cast_and_both_passes(shape, kind, monkeypatch):
    # a float32 X: its own amax (fprop.x), its BF16 cast as torch rounds it (to nearest even; a NaN
    # stays a NaN) and the cast's transposed amax with the RHT (wgrad.x), from one read of X
    import fp4repro.kernels as kernels
    from fp4repro.reference.block import operand_amax_reference

    monkeypatch.setattr(kernels, "AMAX_PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(kernels, "_streaming_multiprocessors", lambda device: 1)
    x = _x(kind, shape, _seed("with_rht_bf16", kind, *shape))
    if kind in ("normal", "subnormal"):
        x = _ties_and_carries(x)
    rows, rht, cast = operand_amax_with_rht_and_bf16_triton(x.to(DEVICE))
    want = x.to(torch.bfloat16)
    cast = cast.cpu()
    assert cast.dtype == torch.bfloat16 and cast.is_contiguous()
    assert torch.equal(cast.isnan(), want.isnan())
    assert torch.equal(cast.view(torch.int16)[~want.isnan()], want.view(torch.int16)[~want.isnan()])
    assert _same(rows, operand_amax_reference(x, SPECS["1x16 RNE current"]))
    assert _same(rht, operand_amax_reference(want.t(), SPECS["1x16 RHT+SR"]))


def test_the_amax_with_rht_pass_casts_float32_only():
    with pytest.raises(ValueError, match="casts float32 to BF16"):
        operand_amax_with_rht_and_bf16_triton(torch.randn(32, 48).bfloat16().to(DEVICE))


def test_the_amax_with_rht_pass_refuses_a_transposed_view():
    with pytest.raises(ValueError, match="row-major"):
        operand_amax_with_rht_triton(torch.randn(64, 48).t().to(DEVICE))
