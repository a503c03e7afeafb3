"""Quantization as training runs it: the front that picks kernel or reference, the run-wide
quantization state (held amaxes, telemetry) and ``QuantLinear``.

The numerics themselves are defined once, by the torch reference (``fp4repro.reference``);
the Triton kernels (``fp4repro.kernels``) equal it bit for bit; ``quantize``, ``scaled_operand``
and ``quantize_dequantize`` here run whichever applies (``reference_only()`` forces the reference).
"""

from fp4repro.config.spec import GEMMS, OPERANDS, LinearSpecs, QuantSpec, TensorScaling
from fp4repro.quant.gemm import emulated_gemm, probe_matched_gemm
from fp4repro.quant.linear import QuantLinear, quantized_operand
from fp4repro.quant.ops import quantize, quantize_dequantize, reference_only, scaled_operand
from fp4repro.quant.state import CurrentAmaxState, QuantState
from fp4repro.reference.block import BlockQuantized, OperandStats

__all__ = [
    "BlockQuantized",
    "OperandStats",
    "quantize",
    "quantize_dequantize",
    "scaled_operand",
    "reference_only",
    "QuantLinear",
    "emulated_gemm",
    "probe_matched_gemm",
    "quantized_operand",
    "OPERANDS",
    "GEMMS",
    "LinearSpecs",
    "QuantSpec",
    "TensorScaling",
    "QuantState",
    "CurrentAmaxState",
]
