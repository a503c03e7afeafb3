"""megatron-core's parallel linears with the recipe's quantized GEMMs.

``QuantColumnParallelLinear`` and ``QuantRowParallelLinear`` keep their parents' constructors,
parameters and ``(output, bias)`` return; they override only ``_forward_impl``, the hook
megatron-core calls for the GEMM (with its autograd function: the sequence-parallel gather and
the tensor-parallel reductions of the gradients live there too). Until a recipe is attached
(``attach``, by ``fp4repro.megatron.model.attach_recipe``), and for linears the recipe leaves
unquantized (BF16 layers, exempt linears), megatron's own GEMM runs: as
``fp4repro.megatron.main_grad_linear`` computes it where that takes it (under autocast, without
sequence parallelism: megatron's numbers, its weight cast once and its gradient added into
``main_grad``), else megatron's own function. A quantized linear
runs ``fp4repro.quant.linear.quantized_linear``: the same function, LinearSpecs, QuantState keys,
telemetry and kernels as the reference model's ``QuantLinear``.

Tensor parallelism: a column-parallel linear's input gradient is all-reduced over the tensor
group (megatron's ``copy_to_tensor_model_parallel_region``, what its own autograd function does
when asked for ``allreduce_dgrad``); with sequence parallelism its input, this rank's part of the
sequence, is all-gathered for the GEMM and its input gradient reduce-scattered back
(``gather_from_sequence_parallel_region``), so the quantized operands are the whole sequence's as
without it; a row-parallel linear's output is reduced (or reduce-scattered along the sequence) by
megatron's ``forward`` around this hook. With ``parallel.tp_amax: group`` the operands
whose tensor is split over the tensor group (those with the split dimension along their block
rows or columns, ``fp4repro.config.shards.ALONG``) scale by the whole tensor's amax, MAX-reduced
over the group, and in either mode their stochastic rounding draws the bits of their elements'
places in the whole tensor (``quantized_operand``).
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import get_pg_size, get_tensor_model_parallel_group_if_none

from fp4repro.config.spec import LinearSpecs
from fp4repro.megatron import main_grad_linear
from fp4repro.megatron.names import SEPARATE_QKV_LINEARS
from fp4repro.model.head_gemm import fp32_head_linear
from fp4repro.quant.linear import describe_specs, quantized_linear
from fp4repro.quant.state import QuantState


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous. The quantized GEMM runs on the
    [batch, sequence] view of megatron's [sequence, batch] activations, so its input gradient
    comes back through a transpose; the modules before it take it in their output's layout, as
    megatron's own GEMMs return it (megatron's all-reduces, for one, reduce ``grad.contiguous()``
    in place and pass ``grad`` on: a strided gradient would go on unreduced)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _tensor_parallel_input(input: torch.Tensor, sequence_parallel: bool, allreduce_dgrad: bool) -> torch.Tensor:
    """The GEMM's input as megatron's own column-parallel GEMM takes it, for a ``_forward_impl``
    that replaces that GEMM: with sequence parallelism, this rank's part of the sequence gathered
    into the whole (its gradient reduce-scattered back over the tensor group); with
    ``allreduce_dgrad``, the input whose gradient is summed over the tensor group."""
    if sequence_parallel:
        return gather_from_sequence_parallel_region(input, tensor_parallel_output_grad=True)
    if allreduce_dgrad:
        return copy_to_tensor_model_parallel_region(input)
    return input


class _Quantized:
    """The quantized ``_forward_impl`` shared by both parallel linears."""

    SPLIT_DIM = ""  # the dimension tensor parallelism splits: N or K
    specs: LinearSpecs | None = None
    quant_state: QuantState | None = None
    quant_key: str = ""
    shards: dict = {}

    def attach(self, specs: LinearSpecs | None, state: QuantState, key: str, shards: dict | None = None) -> None:
        """Quantize this linear's GEMMs with ``specs`` (None or all-None: megatron's own GEMM),
        its amaxes and telemetry in ``state`` under ``key``; ``shards``: operand -> its
        ``fp4repro.quant.linear.Shard`` under tensor parallelism (the group its amax is reduced
        over, its place in the whole tensor: ``fp4repro.megatron.model.attach_recipe``)."""
        self.specs = specs if specs is not None and specs.any_quantized else None
        self.quant_state, self.quant_key = state, key
        self.shards = shards or {}

    def _forward_impl(self, input, weight, bias=None, *args, sequence_parallel=False, allreduce_dgrad=False, **kwargs):
        if self.specs is None and main_grad_linear.takes(
            input, weight, bias, sequence_parallel, kwargs.get("grad_output_buffer")
        ):
            return main_grad_linear.linear_into_main_grad(
                input, weight, lambda x: _tensor_parallel_input(x, False, allreduce_dgrad)
            )
        if self.specs is None:
            return super()._forward_impl(
                input,
                weight,
                bias,
                *args,
                sequence_parallel=sequence_parallel,
                allreduce_dgrad=allreduce_dgrad,
                **kwargs,
            )
        input = _ContiguousGrad.apply(_tensor_parallel_input(input, sequence_parallel, allreduce_dgrad))
        if input.dim() == 3 and input.shape[1] > 1:
            # megatron's activations are [sequence, batch, hidden]; the quantization sees the
            # reference's token order, sequence by sequence, so that blocks along tokens (wgrad's
            # column-wise operands) hold 16 tokens of one sequence as they do there
            out = quantized_linear(
                input.transpose(0, 1), weight, bias, self.specs, self.quant_state, self.quant_key, self.shards
            )
            # contiguous: megatron's output all-reduce (row-parallel) reduces ``input_.contiguous()``
            # in place and returns ``input_``, so a transposed view would go out unreduced
            return out.transpose(0, 1).contiguous()
        return quantized_linear(input, weight, bias, self.specs, self.quant_state, self.quant_key, self.shards)

    def describe(self) -> dict[str, str]:
        return describe_specs(self.specs)


class QuantColumnParallelLinear(_Quantized, ColumnParallelLinear):
    SPLIT_DIM = "N"  # output features: W's rows, dY's columns


class QuantRowParallelLinear(_Quantized, RowParallelLinear):
    SPLIT_DIM = "K"  # input features: W's and X's columns


class SeparateQKVLinear(MegatronModule):
    """megatron-core's ``linear_qkv`` as three column-parallel linears, ``linear_q``, ``linear_k``
    and ``linear_v`` (a model's ``qkv: separate``, the paper's authors' attention): each
    quantizes its GEMMs with its own specs, amax and ``QuantState`` key, as the reference's
    ``q_proj``, ``k_proj`` and ``v_proj``. ``SelfAttention`` builds it where it builds
    ``linear_qkv`` (the same arguments) and reads its output as that of the fused projection, so
    the three outputs are laid out as megatron's fused one (``get_query_key_value_tensors``):

        [s, b, G·(r + 2)·d] = per KV group g of this rank: [Q_g (its r query heads) | K_g | V_g]

    with G the rank's KV groups, r = heads / KV heads. Tensor parallelism splits each linear's
    output features by whole heads (``fp4repro.config.shards``), rank t holding query heads
    t·H/T … and KV heads t·G/T …: the query heads of its own groups, so the rank's groups stay
    whole (KV heads must be a multiple of the tensor size). With sequence parallelism each linear
    gathers the sequence for itself: three gathers of the layer's input where the fused linear
    makes one (four attention layers in the paper's 8B)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        config,
        init_method,
        gather_output: bool,
        bias: bool,
        skip_bias_add: bool,
        is_expert: bool,
        tp_comm_buffer_name: str | None = None,
        tp_group=None,
    ):
        super().__init__(config=config)
        heads, groups, self.head_dim = config.num_attention_heads, config.num_query_groups, config.kv_channels
        if output_size != (heads + 2 * groups) * self.head_dim:
            raise ValueError(
                f"linear_qkv of {output_size} outputs: separate q/k/v make (heads {heads} + 2 x KV heads "
                f"{groups}) x head dim {self.head_dim} (no output gate)"
            )
        tp = get_pg_size(get_tensor_model_parallel_group_if_none(tp_group))  # as ColumnParallelLinear splits
        if groups % tp:
            # megatron's fused path all-gathers a KV group that ranks share; three split linears cannot
            raise ValueError(
                f"separate q/k/v with {groups} KV heads over tensor size {tp}: each rank must hold whole KV "
                "groups (KV heads a multiple of the tensor size)"
            )
        self.queries_per_group = heads // groups
        for name, size in zip(SEPARATE_QKV_LINEARS, (heads, groups, groups)):
            linear = QuantColumnParallelLinear(
                input_size,
                size * self.head_dim,
                config=config,
                init_method=init_method,
                gather_output=gather_output,
                bias=bias,
                skip_bias_add=skip_bias_add,
                is_expert=is_expert,
                tp_group=tp_group,
            )
            self.add_module(name, linear)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, None]:
        """(the fused projection's output, no bias: the three add theirs, if any)."""
        d = self.head_dim
        q, k, v = (getattr(self, name)(hidden_states)[0] for name in SEPARATE_QKV_LINEARS)
        groups = k.shape[-1] // d
        grouped = torch.cat(
            [
                q.unflatten(-1, (groups, self.queries_per_group * d)),
                k.unflatten(-1, (groups, d)),
                v.unflatten(-1, (groups, d)),
            ],
            dim=-1,
        )
        return grouped.flatten(-2), None

    def backward_dw(self) -> None:
        """The three linears' deferred weight gradients (none unless megatron defers them)."""
        for name in SEPARATE_QKV_LINEARS:
            getattr(self, name).backward_dw()


class FP32OutputColumnParallelLinear(ColumnParallelLinear):
    """megatron's output layer computed as the reference's LM head
    (``fp4repro.model.layers.FP32OutputHead``, the paper's authors' FP32 output linear): under
    BF16 autocast, BF16 copies of the input and the weight multiplied in FP32
    (``fp4repro.model.head_gemm``); the weight's gradient flows back to the parameter through the
    copy, and the input's is all-reduced (or reduce-scattered) over the tensor group as for the
    quantized linears. ``build_model`` gives MambaModel's output layer this class (the same
    module, parameters and state_dict keys)."""

    def _forward_impl(self, input, weight, bias=None, *args, sequence_parallel=False, allreduce_dgrad=False, **kwargs):
        device_type = input.device.type
        if not torch.is_autocast_enabled(device_type):
            return super()._forward_impl(
                input,
                weight,
                bias,
                *args,
                sequence_parallel=sequence_parallel,
                allreduce_dgrad=allreduce_dgrad,
                **kwargs,
            )
        input = _tensor_parallel_input(input, sequence_parallel, allreduce_dgrad)
        dtype = torch.get_autocast_dtype(device_type)
        with torch.autocast(device_type, enabled=False):
            out = fp32_head_linear(input.to(dtype), weight.to(dtype))
            return out if bias is None else out + bias.float()
