"""Block quantization (torch reference), RHT, tensor-scaling state, telemetry and QuantLinear."""

from fp4repro.quant.block import (BlockQuantized, OperandStats, quantize, quantize_dequantize, scaled_operand,
                                  tensor_amax)
from fp4repro.quant.linear import QuantLinear, emulated_gemm, quantized_operand
from fp4repro.quant.rht import TE_SIGNS, inverse_rht, rht
from fp4repro.quant.spec import OPERANDS, GEMMS, LinearSpecs, QuantSpec, TensorScaling
from fp4repro.quant.state import QuantState

__all__ = [
    "BlockQuantized", "OperandStats", "quantize", "quantize_dequantize", "scaled_operand", "tensor_amax",
    "QuantLinear", "emulated_gemm", "quantized_operand", "TE_SIGNS", "inverse_rht", "rht",
    "OPERANDS", "GEMMS", "LinearSpecs", "QuantSpec", "TensorScaling", "QuantState",
]
