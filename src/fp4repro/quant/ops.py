"""The one front that runs a quantization: the Triton kernel or the torch reference.

``quantize``, ``scaled_operand``, ``quantize_dequantize`` and ``operand_amax`` have the
signatures and results of the reference's ``quantize_reference``, ``scaled_operand_reference``,
``quantize_dequantize_reference`` and ``operand_amax_reference`` (``fp4repro.reference.block``).
A CUDA tensor goes to the Triton kernels (``fp4repro.kernels``), which equal the reference bit
for bit, unless the caller supplies its own random source (``generator``/``rand``: only the
reference takes one) or row groups (``scaled_operand(..., groups=)``: only the reference takes
them), or the reference is forced: by ``FP4REPRO_REFERENCE=1`` in the environment, or within
``with reference_only():`` (a context variable, so it holds for this thread or task only).
Everything else runs the reference. ``split_bf16`` (the FP32 LM head's gradient as three BF16
pieces, ``fp4repro.reference.split``) is chosen the same way, for a contiguous float32 tensor.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

import torch

from fp4repro.config.spec import QuantSpec
from fp4repro.quant.stats import DeviceStats, read_stats
from fp4repro.reference.block import (
    BlockQuantized,
    ScaledOperand,
    check_packable,
    operand_amax_reference,
    quantize_reference,
    scaled_operand_reference,
)
from fp4repro.reference.geometry import rows_cols
from fp4repro.reference.split import split_bf16_reference

_force_reference = contextvars.ContextVar(
    "fp4repro_force_reference", default=os.environ.get("FP4REPRO_REFERENCE", "") not in ("", "0")
)


@contextlib.contextmanager
def reference_only():
    """Within this block, every quantization runs the torch reference, CUDA tensors included."""
    token = _force_reference.set(True)
    try:
        yield
    finally:
        _force_reference.reset(token)


def uses_kernel(x: torch.Tensor, generator=None, rand=None) -> bool:
    """Whether a quantization of ``x`` runs as a Triton kernel (see the module docstring)."""
    if not x.is_cuda or generator is not None or rand is not None or _force_reference.get():
        return False
    from fp4repro.kernels import available

    return available()


def split_bf16(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The float32 ``g`` as three BF16 tensors that sum to it exactly (``fp4repro.reference.split``):
    the Triton kernel for a contiguous float32 tensor that ``uses_kernel``, else the reference."""
    if g.dtype == torch.float32 and g.is_contiguous() and uses_kernel(g):
        from fp4repro.kernels import split_bf16_triton

        return split_bf16_triton(g)
    return split_bf16_reference(g)


def _telemetry_slots(x: torch.Tensor, amax, stats: bool, live: torch.Tensor | None = None) -> torch.Tensor | None:
    """The live-amax slots a kernel quantization folds into: the caller's (an automatic target's),
    else, on a telemetry quantization with a held amax, fresh ones, from which the telemetry
    ratio's current amax is read (``_kernel_stats``) without a pass of its own."""
    if live is not None or not stats or amax is None:
        return live
    from fp4repro.kernels import live_slots

    return live_slots(x.device)


def _kernel_stats(k: dict, x2d: torch.Tensor, spec: QuantSpec, held, own_slots) -> DeviceStats:
    """The kernel's telemetry counters, left on the device (``fp4repro.quant.stats``); with a
    held amax, the current amax of ``x2d`` beside it as the reference's ``live_amax`` gives it
    (inf where an element is not finite): read from ``own_slots``, the live slots this
    quantization alone folded into, or where it had none of its own (an automatic target's slots
    hold its interval) from a pass of its own, finite elements only, made inf where the kernel
    counted a non-finite block. No synchronization either way."""
    from fp4repro.kernels import live_slots_amax, operand_amax_triton

    current = None
    if held is not None and own_slots is not None:
        current = live_slots_amax(own_slots)
    elif held is not None:
        current = torch.where(k["counts"][4] > 0, torch.inf, operand_amax_triton(x2d, spec))
    return DeviceStats(blocks=k["blocks"], counts=k["counts"], sums=k["sums"], held=held, current=current)


def quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    amax: torch.Tensor | float | None = None,
    generator: torch.Generator | None = None,
    rand: torch.Tensor | None = None,
    stats: bool = False,
) -> BlockQuantized:
    """Packed codes and scale codes of x (``fp4repro.reference.block.quantize_reference``)."""
    check_packable(spec)
    if not uses_kernel(x, generator, rand):
        return quantize_reference(x, spec, amax=amax, generator=generator, rand=rand, stats=stats)
    from fp4repro.kernels import quantize_2d

    x2d = x.reshape(rows_cols(x.shape))
    slots = _telemetry_slots(x, amax, stats)
    k = quantize_2d(x2d, spec, amax=amax, write_qs=False, codes=True, stats=stats, live=slots)
    return BlockQuantized(
        codes=k["codes"],
        scale_codes=k["scale_codes"],
        decode_scale=k["decode_scale"],
        amax=k["amax"],
        spec=spec,
        shape=x.shape,
        stats=read_stats([_kernel_stats(k, x2d, spec, amax, slots)])[0] if stats else None,
    )


def operand_amax(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """The current amax (finite elements, after the RHT when spec.rht) a quantization of x uses,
    float32 scalar on x's device: the kernel's pass (``operand_amax_triton``), or the
    reference's (``operand_amax_reference``)."""
    from fp4repro.kernels import operand_amax_triton

    if not uses_kernel(x):
        return operand_amax_reference(x, spec)
    return operand_amax_triton(x if x.dim() == 2 else x.reshape(rows_cols(x.shape)), spec)


def operand_amaxes(x: torch.Tensor, row_spec: QuantSpec, col_spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The current amaxes of a 2-D x quantized with ``row_spec`` and of xᵀ (the column-wise view
    wgrad quantizes) with ``col_spec``: ``operand_amax`` of each, float32 scalars on x's device, in
    fewer reads of x. ``row_spec`` has no RHT. Without the RHT on ``col_spec`` both matrices hold
    x's elements (and zero padding): one amax, taken once. With it, the kernel takes both from one
    read of a row-major x (``operand_amax_with_rht_triton``); elsewhere each is taken on its own."""
    if row_spec.rht:
        raise ValueError("operand_amaxes: the row-wise spec takes no RHT")
    if not col_spec.rht:
        amax = operand_amax(x, row_spec)
        return amax, amax
    if uses_kernel(x):
        from fp4repro.kernels import operand_amax_with_rht_triton, row_major

        if row_major(x):
            return operand_amax_with_rht_triton(x)
    return operand_amax(x, row_spec), operand_amax(x.t(), col_spec)


def operand_amaxes_and_bf16(
    x: torch.Tensor, row_spec: QuantSpec, col_spec: QuantSpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For a 2-D float32 x: (amax of x quantized with ``row_spec``, amax of cᵀ with ``col_spec``,
    c) with c = x.to(torch.bfloat16), the tensor wgrad quantizes where the GEMMs compute in BF16.
    With the RHT on ``col_spec`` and a row-major x on the kernels, all three from one read of x
    (``operand_amax_with_rht_and_bf16_triton``); elsewhere the cast and ``operand_amax`` of each.
    ``row_spec`` has no RHT."""
    if row_spec.rht:
        raise ValueError("operand_amaxes_and_bf16: the row-wise spec takes no RHT")
    if col_spec.rht and uses_kernel(x):
        from fp4repro.kernels import operand_amax_with_rht_and_bf16_triton, row_major

        if row_major(x):
            return operand_amax_with_rht_and_bf16_triton(x)
    c = x.to(torch.bfloat16)
    return operand_amax(x, row_spec), operand_amax(c.t(), col_spec), c


def scaled_operand(
    x: torch.Tensor,
    spec: QuantSpec,
    amax: torch.Tensor | float | None = None,
    generator: torch.Generator | None = None,
    rand: torch.Tensor | None = None,
    stats: bool = False,
    groups: torch.Tensor | None = None,
    live: torch.Tensor | None = None,
    seed: int | None = None,
    place=None,
    out_dtype: torch.dtype | None = None,
) -> ScaledOperand:
    """(q · s_b in x's 2-D shape, d, A used, stats, None)
    (``fp4repro.reference.block.scaled_operand_reference``; with row ``groups``, always the
    reference: the kernels take one amax per call). On the kernels, stats is a ``DeviceStats``
    (its counters left on the GPU: ``fp4repro.quant.stats.read_stats`` reads many at once).

    Unlike the reference, ``live`` is not a flag but running live-amax slots
    (``fp4repro.kernels.live_slots`` on x's device): the tensor's current amax is max-folded into
    them, by the kernel as a by-product, or from the reference's ``live_amax``; the ``live`` field
    of the result is None. An automatic target keeps one set of slots per operand and refresh
    interval and reads it once, at the next refresh.

    ``seed`` (stochastic rounding, 0 <= seed < 2^32): the kernels' Philox key, or on the reference
    the seed of a generator of its own; without one, the kernels draw a seed from torch's CPU
    generator and the reference draws from torch's global generator. ``place``
    (``fp4repro.kernels.ShardPlace``): x is a tensor-parallel shard, and the kernels draw the bits
    of its elements' places in the whole tensor (the reference's generator knows no places).
    ``out_dtype``: the dtype of q · s_b (default: the reference's float32, the kernels' x's dtype);
    the kernels write it so, the reference's is cast, both rounding the float32 value to nearest
    even on a GPU (Triton's conversion and torch's; Triton's interpreter truncates instead): the
    same values as a cast of the float32 operand, with no float32 copy written first. For FP4
    elements and scales of at most 4 significant bits (E4M3, UE5M3, UE8M0) q · s_b is exact in
    BF16 and nothing is rounded."""
    from fp4repro.kernels import fold_live_amax, quantize_2d

    if groups is not None or not uses_kernel(x, generator, rand):
        if seed is not None and generator is None and rand is None:
            generator = torch.Generator(device=x.device).manual_seed(seed)
        r = scaled_operand_reference(
            x, spec, amax=amax, generator=generator, rand=rand, stats=stats, groups=groups, live=live is not None
        )
        if live is not None:
            fold_live_amax(live, r.live)
        return r._replace(qs=r.qs if out_dtype is None else r.qs.to(out_dtype), live=None)
    x2d = x if x.dim() == 2 else x.reshape(rows_cols(x.shape))
    slots = _telemetry_slots(x, amax, stats, live)
    k = quantize_2d(x2d, spec, amax=amax, stats=stats, live=slots, seed=seed, place=place, out_dtype=out_dtype)
    stats = _kernel_stats(k, x2d, spec, amax, None if live is not None else slots) if stats else None
    return ScaledOperand(k["qs"], k["decode_scale"], k["amax"], stats, None)


def quantize_dequantize(
    x: torch.Tensor,
    spec: QuantSpec,
    amax: torch.Tensor | float | None = None,
    generator: torch.Generator | None = None,
    rand: torch.Tensor | None = None,
) -> torch.Tensor:
    """x̂ = (q · s_b) · d as float32 in x's shape (in the RHT domain when spec.rht)."""
    qs, d, *_ = scaled_operand(x, spec, amax=amax, generator=generator, rand=rand)
    return (qs.to(torch.float32) * d).reshape(x.shape)
