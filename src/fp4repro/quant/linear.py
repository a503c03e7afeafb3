"""QuantLinear: a linear layer whose three GEMMs run on quantized operands, as a recipe says.

For Y = X·Wᵀ (+ b), with X flattened to (tokens, in) and each operand quantized along the
reduction dimension of its GEMM:

    fprop  Y  = Q(X)      · Q(W)ᵀ        reduce over in_features
    dgrad  dX = Q(dY)     · Q(Wᵀ)ᵀ       reduce over out_features
    wgrad  dW = Q(dYᵀ)    · Q(Xᵀ)ᵀ       reduce over tokens

Emulated GEMM: Q(A) enters as q·s_b (exact in BF16) with its decode scale d_a = 1/g_a; the GEMM
computes from the encoded operands as the recipe's GEMM model says and multiplies by d_a·d_b in
FP32 before the output cast (``fp4repro.quant.gemm``: an FP32 accumulation, or the probe-matched
model of native FP4 tensor cores, in all three GEMMs). An operand whose spec is None enters
unquantized. With no spec at all (the BF16 recipe) the layer is exactly ``F.linear``.

Dtypes: on CPU everything is float32. On CUDA the operands are BF16 (under autocast, the
autocast dtype) with FP32 accumulation; outputs and gradients have the compute dtype.

Q(Wᵀ) for dgrad is Q(W)ᵀ from fprop whenever that is exact (``transposable_weight_spec``: one
16×16 RNE spec for both, the same amax), so the forward's operand is kept and transposed instead
of quantizing W again. Where X's two quantizations (fprop.x, wgrad.x of Xᵀ) both scale by
the current amax, both amaxes come from one read of X (``shared_current_amaxes``), and so do dY's
(dgrad.dy, wgrad.dy): the same values as each pass of its own. A float32 X (a norm's or the
squared ReLU's output under autocast) is quantized as it is for fprop and in the compute dtype for
wgrad; that cast comes from the same read, and the backward keeps X in BF16 (each linear its own
cast: three that read one X, as ``qkv: separate`` does, keep three). The step's host time matters as
much as its kernels (an eager step is issued by Python): no no-op casts or contexts on this path.

Per-sequence activations (inference): when the model's QuantState gives the valid lengths of the
batch's sequences (``QuantState.sequence_lengths``; the evaluation policy's ``CurrentAmaxState``
does, the training state never), fprop.x of a (batch, width, in) input is quantized sequence by
sequence (``sequence_operand``): each sequence's real rows as their own tensor, with their own
amax and decode scale d_x, and all padding rows together as one more group, so that neither
other sequences nor padding change a sequence's operand. W keeps one quantization (it does not
depend on the batch). The GEMM stays one GEMM with a per-row epilogue: row i is multiplied by
its own d_x[i]·d_w (both GEMM models take per-row decode scales).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, NamedTuple

import torch
import torch.distributed
import torch.nn.functional as F

from fp4repro.config.spec import LinearSpecs, QuantSpec
from fp4repro.formats import get_format
from fp4repro.quant.gemm import _as, gemm_function, instrument
from fp4repro.quant.ops import operand_amax, operand_amaxes, operand_amaxes_and_bf16, scaled_operand, uses_kernel
from fp4repro.quant.state import QuantState
from fp4repro.quant.weight_gradient import weight_gradient
from fp4repro.reference.block import global_encode_scale


@functools.lru_cache(maxsize=4096)
def host_decode_scale(amax: float | None, emax: float, target: float | None) -> float:
    """d = 1/g for a host-known amax, the same float32 operations as the kernels and the
    reference (``global_encode_scale``); 1.0 without a tensor scale."""
    if target is None:
        return 1.0
    g = global_encode_scale(torch.tensor(amax, dtype=torch.float32), emax, target)
    return float(torch.reciprocal(g))


@functools.lru_cache(maxsize=4096)
def _with_target(spec: QuantSpec, target: float) -> QuantSpec:
    """The fixed-target spec an automatic spec quantizes with while its T is ``target`` (built
    once per T: a spec is validated when it is made, and the step is bound by host time)."""
    return replace(spec, target=target, auto_target=None)


class Shard(NamedTuple):
    """How an operand's tensor is split over tensor-parallel ranks (``quantized_operand``)."""

    group: Any = None  # the process group its amax is MAX-reduced over (None: the shard's own)
    place: Any = None  # where the shard sits in the whole tensor (``fp4repro.kernels.ShardPlace``)


def quantized_operand(
    t: torch.Tensor,
    spec: QuantSpec | None,
    state: QuantState | None,
    layer: str,
    operand: str,
    shard: Shard | None = None,
    out_dtype: torch.dtype | None = None,
    current_amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | float | None]:
    """(operand for the GEMM as (rows, K), decode scale d or None) for a 2-D tensor t.

    ``current_amax``: t's current amax under ``spec``, taken beforehand together with another
    operand's (``shared_current_amaxes``), used in place of the quantization's own pass.

    ``out_dtype``: the dtype the operand is given in (the GEMM's compute dtype, into which the GEMM
    would cast it): a quantized one is written so (``scaled_operand``), an unquantized one (no
    spec) cast; None: as it is.

    ``shard``: t is this rank's shard of a tensor split over tensor-parallel ranks. With a
    ``group`` (a torch.distributed process group) the amax (current, or the fresh sample of a
    periodic refresh) is MAX-reduced over it before the quantization uses it, so that every shard
    is scaled as the whole tensor is: its blocks then equal the whole tensor's
    (``fp4repro.config.shards`` checks that they tile). A held amax is already the group's (it was
    reduced when sampled). With a ``place``, stochastic rounding draws the random bits of the
    shard's elements' places in the whole tensor (on the kernels; the CPU reference draws from a
    generator of its own). A periodic refresh's sample is MAX-reduced by ``state.reduce_max``
    instead, when the state has one: across the ranks that hold the same tensors, which with a
    ``group`` must include that group (one collective, not two).

    d is a Python float where it is known on the host (a held amax, or no tensor scale) and
    the tensor is on CUDA, else a float32 tensor. Periodic scaling asks ``state`` for the held
    amax and stores a fresh sample when due; telemetry is recorded when ``state.telemetry`` is on.
    An automatic target asks ``state`` for its T (chosen at each refresh, before the fresh
    sample is used) and, between refreshes, folds the live amax of what was quantized into its slots.
    """
    if spec is None:
        return (t if out_dtype is None else _as(t, out_dtype)), None
    key = f"{layer}.{operand}"
    held = state.held_amax(key, spec.tensor_scaling) if state is not None else None
    telemetry = state is not None and state.telemetry
    auto = state is not None and spec.auto_target is not None
    if auto:  # from here on, the fixed-target spec of the T in use
        spec = _with_target(spec, state.choose_target(key, spec) if held is None else state.target(key, spec))
    live = state.live_slots(key, t.device) if auto and held is not None else None
    seed = state.sr_seed(key) if state is not None and spec.stochastic else None
    amax = held if held is not None else current_amax
    refresh = (
        held is None and state is not None and state.reduce_max is not None and spec.tensor_scaling.kind == "periodic"
    )
    group, place = shard or (None, None)
    if spec.target is not None and held is None and (group is not None or refresh):
        amax = operand_amax(t, spec)
        if refresh:  # every rank holding this tensor (the tensor group too) holds one amax
            amax = state.reduce_max(amax)
        elif group is not None:
            torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX, group=group)
    qs, d, amax, stats, _ = scaled_operand(
        t, spec, amax=amax, stats=telemetry, live=live, seed=seed, place=place, out_dtype=out_dtype
    )
    if state is not None:
        if held is None:
            state.hold(key, amax, spec.tensor_scaling)
        if telemetry:
            state.record(layer, operand, stats, spec.target)
    if t.is_cuda:
        emax = get_format(spec.element).max
        if spec.target is None:
            d = 1.0
        elif held is not None:
            d = host_decode_scale(state.held_amax_value(key), emax, spec.target)
    return qs, d


#: Sequences of a batch above which 1-row-block activations are quantized by one grouped
#: reference call instead of one kernel launch per sequence (``sequence_operand``).
KERNEL_GROUPS_MAX = 16


def sequence_operand(
    x: torch.Tensor,
    lengths: tuple[int, ...],
    spec: QuantSpec,
    state: QuantState | None,
    layer: str,
    operand: str = "fprop.x",
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(operand for the GEMM as (batch·width, K), decode scales as float32 (batch·width, 1)) for
    x of shape (batch, width, K) holding sequences of valid ``lengths`` (padding after them).

    Sequence b's rows [0, lengths[b]) are quantized as one tensor, with their own current amax
    and d, the padding rows of all sequences together as one more tensor; each row carries the d
    of its group. A sequence's operand rows and d are therefore those it gets alone, whatever
    else is in the batch. The kernels take one amax per call: there, one quantization per group.
    With 1-row blocks and more than ``KERNEL_GROUPS_MAX`` sequences (a downstream batch holds many
    short items, and a launch per sequence and linear made evaluation on a GPU launch-bound), or
    off the kernels, it is one reference call with row groups (``scaled_operand(..., groups=)``;
    the reference equals the kernels bit for bit). A few long sequences (held-out NLL windows)
    stay on the kernels: the reference's float32 temporaries of a whole batch are GBs at 8B.
    With 16- or 32-row tiles (a tile must not mix sequences), always one quantization per group.
    Telemetry (``state.telemetry``) is recorded per call. ``out_dtype``: as ``quantized_operand``'s.
    """
    batch, width, cols = x.shape
    if len(lengths) != batch or not all(0 <= n <= width for n in lengths):
        raise ValueError(
            f"{layer}.{operand}: sequence lengths {list(lengths)} do not fit a batch of "
            f"{batch} sequences of {width} positions"
        )
    telemetry = state is not None and state.telemetry
    if state is not None and spec.auto_target is not None:
        spec = _with_target(spec, state.target(f"{layer}.{operand}", spec))

    def quantized(t: torch.Tensor, groups: torch.Tensor | None = None):
        qs, d, _, stats, _ = scaled_operand(t, spec, stats=telemetry, groups=groups, out_dtype=out_dtype)
        if telemetry:
            state.record(layer, operand, stats, spec.target)
        return qs, d

    padding = torch.arange(width, device=x.device) >= torch.tensor(lengths, device=x.device)[:, None]
    if spec.block[0] == 1 and (batch > KERNEL_GROUPS_MAX or not uses_kernel(x)):
        # group of each row: its sequence's index for real tokens, ``batch`` for padding
        groups = torch.arange(batch, device=x.device)[:, None].expand(batch, width).masked_fill(padding, batch)
        qs, d = quantized(x.reshape(-1, cols), groups.reshape(-1))
        return qs, torch.as_tensor(d, dtype=torch.float32, device=x.device).expand(batch * width, 1)
    qs = torch.empty((batch, width, cols), dtype=out_dtype or x.dtype, device=x.device)
    d = torch.empty((batch, width, 1), dtype=torch.float32, device=x.device)
    for b, n in enumerate(lengths):
        if n:
            qs[b, :n], d[b, :n] = quantized(x[b, :n])
    if sum(lengths) < batch * width:
        qs[padding], d[padding] = quantized(x[padding])
    return qs.reshape(batch * width, cols), d.reshape(batch * width, 1)


def _grouping_matters(spec: QuantSpec | None, x: torch.Tensor, lengths: tuple[int, ...] | None) -> bool:
    """Whether quantizing x per sequence can differ from quantizing it as one tensor: not without
    lengths, nor for one unpadded sequence, nor when rows are quantized independently anyway
    (no tensor scale, as in MX, and blocks of one row)."""
    if lengths is None or spec is None:
        return False
    if len(lengths) == 1 and lengths[0] == x.shape[1]:
        return False
    return spec.target is not None or spec.block[0] != 1


def transposable_weight_spec(specs: LinearSpecs) -> bool:
    """Whether Q(Wᵀ) for dgrad is Q(W)ᵀ from fprop given the same amax: one spec for both, square
    blocks (a block of Wᵀ is the transpose of a block of W, with the same amax and scale) and
    deterministic element rounding (RNE, no RHT, whose 16-point transform runs along rows). Not
    with an automatic target: fprop.w and dgrad.w are two operands, each with its own T."""
    spec = specs.fprop_w
    return (
        spec is not None
        and spec == specs.dgrad_w
        and spec.block[0] == spec.block[1]
        and spec.rounding == "rne"
        and not spec.rht
        and spec.auto_target is None
    )


def _weight_amax_used(state: QuantState | None, spec: QuantSpec, layer: str, operand: str):
    """What fixes the amax a quantization of W for ``operand`` uses at this point: "current" (the
    current amax of W itself), the held amax as a float, or None when it samples a fresh amax now."""
    if state is None or spec.tensor_scaling.kind == "current":
        return "current"
    key = f"{layer}.{operand}"
    if state.held_amax(key, spec.tensor_scaling) is None:
        return None
    return state.held_amax_value(key)


def shared_current_amaxes(
    t: torch.Tensor,
    row_spec: QuantSpec | None,
    col_spec: QuantSpec | None,
    state: QuantState | None,
    shards: dict,
    layer: str,
    operands: tuple[str, str],
    col_dtype: torch.dtype,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """(amax, amaxᵀ, t_c): the current amaxes of t's two quantizations, t row-wise with
    ``row_spec`` and t_cᵀ with ``col_spec`` (fprop.x and wgrad.x of X, dgrad.dy and wgrad.dy of
    dY), t_c = t in ``col_dtype`` (the compute dtype wgrad quantizes in), taken together
    (``operand_amaxes``: one read of t where each would take one; for a float32 t and BF16
    ``col_dtype``, ``operand_amaxes_and_bf16``: the cast from the same read), or (None, None, t)
    where they are left to each quantization (and the cast to the backward): also for a t in
    another dtype pair, and unless both scale by their current amax with a fixed target (and
    the state holds neither, as an evaluation's replayed amaxes would be), the row-wise one without
    the RHT, on a step without telemetry (whose statistics tell a given amax from a current one) and
    neither amax MAX-reduced over a tensor-parallel group. The second amax is of the tensor as given
    here: a backward that quantizes a recomputed X must recompute it bit for bit (torch's and
    megatron's activation recomputation rerun the forward, and with it this call)."""
    both = (row_spec, col_spec)
    if (
        any(s is None or s.target is None or s.tensor_scaling.kind != "current" or s.auto_target for s in both)
        or row_spec.rht
        or (state is not None and state.telemetry)
        or any((shards.get(op) or Shard()).group is not None for op in operands)
        or (
            state is not None
            and any(state.held_amax(f"{layer}.{op}", s.tensor_scaling) is not None for op, s in zip(operands, both))
        )
    ):
        return None, None, t
    if t.dtype == col_dtype:
        return *operand_amaxes(t, row_spec, col_spec), t
    if t.dtype == torch.float32 and col_dtype == torch.bfloat16:
        return operand_amaxes_and_bf16(t, row_spec, col_spec)
    return None, None, t


class _QuantLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, specs: LinearSpecs, state, layer, compute_dtype, shards, grad_enabled):
        x2 = x.reshape(-1, x.shape[-1])
        # Q(W) is kept for dgrad when its transpose can serve (one quantization fewer per step),
        # with the amax it was made with; in the compute dtype, which holds q·s exactly
        keep_qw = ctx.needs_input_grad[0] and transposable_weight_spec(specs)
        w_amax = _weight_amax_used(state, specs.fprop_w, layer, "fprop.w") if keep_qw else None
        lengths = state.sequence_lengths(x.shape[0], x.shape[1]) if state is not None and x.dim() == 3 else None
        # X's current amaxes for fprop and wgrad, taken together where they can be, and X as wgrad
        # will quantize it (in compute_dtype: a float32 X is cast there where both amaxes are taken)
        amax_x = amax_xt = None
        x_wgrad = x2
        if _grouping_matters(specs.fprop_x, x, lengths):
            qx, dx = sequence_operand(x, lengths, specs.fprop_x, state, layer, "fprop.x", compute_dtype)
        else:
            # a backward will quantize X for wgrad (not under no_grad: evaluation)
            if grad_enabled and ctx.needs_input_grad[1]:
                amax_x, amax_xt, x_wgrad = shared_current_amaxes(
                    x2, specs.fprop_x, specs.wgrad_x, state, shards, layer, ("fprop.x", "wgrad.x"), compute_dtype
                )
            qx, dx = quantized_operand(
                x2, specs.fprop_x, state, layer, "fprop.x", shards.get("fprop.x"), compute_dtype, amax_x
            )
        qw, dw = quantized_operand(weight, specs.fprop_w, state, layer, "fprop.w", shards.get("fprop.w"), compute_dtype)
        # on a telemetry step a reused Q(W)ᵀ is recorded as dgrad.w with fprop.w's stats: the same
        # blocks, amax and codes, so the same counts (no second quantization of W to record it)
        telemetry = w_amax is not None and state is not None and state.telemetry
        w_stats = state.last_stats(layer, "fprop.w") if telemetry else None
        timing = instrument()
        gemm = timing or gemm_function(specs, "fprop")
        y = gemm(qx, dx, qw, dw, compute_dtype)
        if bias is not None:
            y = y + bias.to(compute_dtype)
        ctx.qw = (qw, dw, w_amax, w_stats) if w_amax is not None else None
        ctx.amax_xt = amax_xt
        ctx.save_for_backward(x_wgrad, weight)  # X is only read again by wgrad
        ctx.weight = weight  # the parameter itself, for its main_grad (not a saved tensor: no version check)
        ctx.has_bias, ctx.specs, ctx.state, ctx.layer = bias is not None, specs, state, layer
        ctx.compute_dtype, ctx.x_shape, ctx.x_dtype, ctx.shards = compute_dtype, x.shape, x.dtype, shards
        ctx.instrument = timing
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x_wgrad, weight = ctx.saved_tensors
        specs, state, layer, cdt, shards = ctx.specs, ctx.state, ctx.layer, ctx.compute_dtype, ctx.shards
        dy2 = _as(dy.reshape(-1, dy.shape[-1]), cdt)
        dx = dw = db = None
        amax_dy = amax_dyt = None  # dY's current amaxes for dgrad and wgrad, taken together where they can be
        if ctx.needs_input_grad[0] and ctx.needs_input_grad[1]:
            amax_dy, amax_dyt, _ = shared_current_amaxes(
                dy2, specs.dgrad_dy, specs.wgrad_dy, state, shards, layer, ("dgrad.dy", "wgrad.dy"), cdt
            )
        if ctx.needs_input_grad[0]:
            qdy, ddy = quantized_operand(
                dy2, specs.dgrad_dy, state, layer, "dgrad.dy", shards.get("dgrad.dy"), cdt, amax_dy
            )
            # reused while the amax it was made with still holds, and the forward's telemetry
            # (whether it kept stats to record) is the backward's
            telemetry = state is not None and state.telemetry
            if (
                ctx.qw is not None
                and ctx.qw[2] == _weight_amax_used(state, specs.dgrad_w, layer, "dgrad.w")
                and (ctx.qw[3] is not None) == telemetry
            ):
                qwt, dwt = ctx.qw[0].t(), ctx.qw[1]
                if ctx.qw[3] is not None:
                    state.record(layer, "dgrad.w", ctx.qw[3], specs.dgrad_w.target)
            else:
                qwt, dwt = quantized_operand(
                    weight.t(), specs.dgrad_w, state, layer, "dgrad.w", shards.get("dgrad.w"), cdt
                )
            gemm = ctx.instrument or gemm_function(specs, "dgrad")
            dx = _as(gemm(qdy, ddy, qwt, dwt, cdt).reshape(ctx.x_shape), ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            qdyt, ddyt = quantized_operand(
                dy2.t(), specs.wgrad_dy, state, layer, "wgrad.dy", shards.get("wgrad.dy"), cdt, amax_dyt
            )
            # the forward's amax of Xᵀ unless this backward records telemetry (``shared_current_amaxes``)
            amax_xt = ctx.amax_xt if state is None or not state.telemetry else None
            qxt, dxt = quantized_operand(
                _as(x_wgrad.t(), cdt), specs.wgrad_x, state, layer, "wgrad.x", shards.get("wgrad.x"), cdt, amax_xt
            )
            gemm = ctx.instrument or gemm_function(specs, "wgrad")
            # into the weight's main_grad where megatron's DDP gave it one (its fused linears' protocol)
            dw = weight_gradient(ctx.weight, gemm(qdyt, ddyt, qxt, dxt, cdt))
        ctx.qw = ctx.amax_xt = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.to(torch.float32).sum(0).to(weight.dtype)
        return dx, dw, db, None, None, None, None, None, None


def quantized_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    specs: LinearSpecs,
    state: QuantState | None,
    name: str,
    shards: dict | None = None,
) -> torch.Tensor:
    """y = x · Wᵀ (+ b) with the recipe's quantized GEMMs in forward and backward: the one
    implementation of the emulation, which ``QuantLinear`` and the megatron backend's parallel
    linears both call. The GEMMs compute in autocast's dtype when autocast is on, else in x's
    (float32 on CPU, where the emulation is float32 end to end); the quantization state of this
    linear lives in ``state`` under ``name``. ``shards``: operand -> its ``Shard``, how that
    operand's tensor is split over tensor-parallel ranks (``quantized_operand``); none by default."""
    device_type = x.device.type
    autocast = torch.is_autocast_enabled(device_type)
    compute_dtype = torch.get_autocast_dtype(device_type) if autocast else x.dtype
    if device_type == "cpu":
        compute_dtype = torch.float32
    # grad mode as the caller has it (autograd runs a Function's forward with grad off)
    args = (x, weight, bias, specs, state, name, compute_dtype, shards or {}, torch.is_grad_enabled())
    if not autocast:
        return _QuantLinearFunction.apply(*args)
    with torch.autocast(device_type, enabled=False):
        return _QuantLinearFunction.apply(*args)


def describe_specs(specs: LinearSpecs | None) -> dict[str, str]:
    """Operand name -> spec summary of a linear's specs ("bf16" for unquantized operands)."""
    return {name: (str(spec) if spec is not None else "bf16") for name, spec in (specs or LinearSpecs()).items()}


class QuantLinear(torch.nn.Linear):
    """``nn.Linear`` with recipe-quantized GEMMs (same parameters, init and state_dict keys).

    specs: the LinearSpecs of this layer (None or all-None: plain ``F.linear``)
    state: the model's QuantState (periodic scaling and telemetry); None = current amax, no telemetry
    name:  this layer's name, the key of its state and telemetry

    For an input of shape (batch, width, in), the layer asks ``state.sequence_lengths(batch,
    width)`` whether to quantize fprop.x sequence by sequence (inference: see the module
    docstring and ``fp4repro.quant.state.CurrentAmaxState``); the training state says no.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        specs: LinearSpecs | None = None,
        state: QuantState | None = None,
        name: str = "",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.name = name
        self.attach(specs, state)

    def attach(self, specs: LinearSpecs | None, state: QuantState | None) -> None:
        """Quantize with ``specs`` (None or all-None: plain ``F.linear``) and ``state`` from now on."""
        self.specs = specs if specs is not None and specs.any_quantized else None
        self.state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.specs is None:
            return F.linear(x, self.weight, self.bias)
        return quantized_linear(x, self.weight, self.bias, self.specs, self.state, self.name)

    def describe(self) -> dict[str, str]:
        return describe_specs(self.specs)

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.specs is None else ", quantized")
