"""megatron-core's parallel linears with the recipe's quantized GEMMs.

``QuantColumnParallelLinear`` and ``QuantRowParallelLinear`` keep their parents' constructors,
parameters and ``(output, bias)`` return; they override only ``_forward_impl``, the hook
megatron-core calls for the GEMM (with its autograd function: the sequence-parallel gather and
the tensor-parallel reductions of the gradients live there too). Until a recipe is attached
(``attach``, by ``fp4repro.megatron.model.attach_recipe``), and for linears the recipe leaves
unquantized (BF16 layers, exempt linears), megatron's own path runs unchanged. A quantized linear
runs ``fp4repro.quant.linear.quantized_linear``: the same function, LinearSpecs, QuantState keys,
telemetry and kernels as the reference model's ``QuantLinear``.

Tensor size 1 here: a quantized linear refuses a sequence-parallel input and a data-gradient
all-reduce (tensor size > 1), which need the communication of megatron's autograd function
around the quantized GEMMs and amaxes reduced over the tensor group (``parallel.tp_amax``).
"""

from __future__ import annotations

from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

from fp4repro.config.spec import LinearSpecs
from fp4repro.quant.linear import describe_specs, quantized_linear
from fp4repro.quant.state import QuantState


class _Quantized:
    """The quantized ``_forward_impl`` shared by both parallel linears."""

    specs: LinearSpecs | None = None
    quant_state: QuantState | None = None
    quant_key: str = ""

    def attach(self, specs: LinearSpecs | None, state: QuantState, key: str) -> None:
        """Quantize this linear's GEMMs with ``specs`` (None or all-None: megatron's own GEMM),
        its amaxes and telemetry in ``state`` under ``key``."""
        self.specs = specs if specs is not None and specs.any_quantized else None
        self.quant_state, self.quant_key = state, key

    def _forward_impl(self, input, weight, bias=None, *args, sequence_parallel=False, allreduce_dgrad=False,
                      **kwargs):
        if self.specs is None:
            return super()._forward_impl(input, weight, bias, *args, sequence_parallel=sequence_parallel,
                                         allreduce_dgrad=allreduce_dgrad, **kwargs)
        if sequence_parallel or allreduce_dgrad:
            raise NotImplementedError(f"{self.quant_key}: quantized GEMMs under tensor parallelism (size > 1) "
                                      "are not in this backend yet; run with parallel.tensor: 1")
        if input.dim() == 3 and input.shape[1] > 1:
            # megatron's activations are [sequence, batch, hidden]; the quantization sees the
            # reference's token order, sequence by sequence, so that blocks along tokens (wgrad's
            # column-wise operands) hold 16 tokens of one sequence as they do there
            out = quantized_linear(input.transpose(0, 1), weight, bias, self.specs, self.quant_state, self.quant_key)
            return out.transpose(0, 1)
        return quantized_linear(input, weight, bias, self.specs, self.quant_state, self.quant_key)

    def describe(self) -> dict[str, str]:
        return describe_specs(self.specs)


class QuantColumnParallelLinear(_Quantized, ColumnParallelLinear):
    pass


class QuantRowParallelLinear(_Quantized, RowParallelLinear):
    pass
