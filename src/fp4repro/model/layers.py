"""Building blocks of the Nemotron-H hybrid: norms, the three mixers, rotary embedding.

Every internal linear is created by a `LinearFactory` (see nemotron_h.py), so that the same mixer
code runs with plain nn.Linear or with the recipe's QuantLinear. Norms, the depthwise conv1d and
the SSD scan are always computed in float32 (float64 for float64 inputs), whatever the input dtype
or autocast setting: they are cheap, and their precision is not what the study varies.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from fp4repro.config.model import LAYER_LINEARS, SEPARATE_QKV, ModelConfig
from fp4repro.model._mamba_ssm import load_mamba_ssm_kernels
from fp4repro.model.head_gemm import fp32_head_linear
from fp4repro.model.ssd import ssd_chunked

#: (in_features, out_features, name within the mixer) -> a bias-free linear module
LinearFactory = Callable[[int, int, str], nn.Module]


def _float32_region(t: torch.Tensor):
    """A context in which autocast is off, so that explicitly float32 ops stay float32."""
    return torch.autocast(device_type=t.device.type, enabled=False)


def _wide_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _wide(t: torch.Tensor) -> torch.Tensor:
    """t in float32, or kept in float64 if it already is."""
    return t.to(_wide_dtype(t.dtype))


class FP32OutputHead(nn.Linear):
    """The LM head as the paper's authors run it in every recipe (their ``FP32OutputLinear``:
    "its BF16 checkpoint parameter is retained and its matrix multiplication is computed in
    FP32"). Under BF16 autocast the input and the weight are rounded to BF16, the copies their
    mixed-precision training holds, and multiplied in FP32 (``fp4repro.model.head_gemm``: FP32
    products and sums on BF16 tensor cores): logits are float32. Without autocast (the CPU's
    float32 runs) it is an ordinary float32 linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = x.device.type
        if not torch.is_autocast_enabled(device_type):
            return F.linear(x, self.weight)
        dtype = torch.get_autocast_dtype(device_type)
        with _float32_region(x):
            return fp32_head_linear(x.to(dtype), self.weight.to(dtype))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x²) + eps) · weight over the last dimension, computed in float32 (float64
    for float64 inputs) whatever the autocast setting, returned in x's dtype."""
    with _float32_region(x):
        x32 = _wide(x)
        y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * _wide(weight)
    return y.to(x.dtype)


@functools.cache
def compiled_rms_norm() -> Callable:
    """``rms_norm`` through ``torch.compile`` (inductor): on a GPU one generated Triton kernel
    forward and a fused backward, where eager torch launches an elementwise kernel or a reduction
    per operation, each reading and writing the whole activation. The same formula; the sum of
    squares is reduced in another order, so the last bits differ from ``rms_norm``'s. Shapes are
    static (a model normalizes a few shapes; ``dynamic=False`` keeps the kernels specialized); past
    dynamo's recompile limit (8 shapes) ``fullgraph`` raises where it would fall back to eager
    ``rms_norm``'s other roundings unannounced."""
    return torch.compile(rms_norm, fullgraph=True, dynamic=False)


def causal_conv1d_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Mamba-2's depthwise causal conv1d and its activation, as one formula over time t and channel c:

        out[b, t, c] = silu(bias[c] + Σ_{k=0}^{K−1} weight[c, k] · x[b, t − K + 1 + k, c]),  x[b, s < 0, c] = 0

    x: (batch, time, channels), any strides (a slice of the in-projection's output); weight
    (channels, K); bias (channels) or None. Computed in float32 (float64 for float64 x) whatever
    the autocast setting: the bias first, then the taps k = 0 … K−1 in order, the SiLU, one rounding
    to x's dtype. ``F.conv1d`` computes the same sum in its kernel's own order."""
    with _float32_region(x):
        x32, w32 = _wide(x), _wide(weight)
        taps, length = w32.shape[-1], x.shape[1]
        padded = F.pad(x32, (0, 0, taps - 1, 0))  # K − 1 zeros before the first step
        acc = 0.0 if bias is None else _wide(bias)
        for k in range(taps):
            acc = acc + padded[:, k : k + length] * w32[:, k]
        out = F.silu(acc)
    return out.to(x.dtype)


def split_causal_conv1d_silu(
    zxbcdt: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    widths: tuple[int, int, int],
    xbc_widths: tuple[int, int, int],
) -> tuple[torch.Tensor, ...]:
    """The Mamba-2 mixer from its in-projection's output to the scan's inputs:

        [z | xBC | dt] = zxbcdt                      widths (d_inner, conv channels, heads)
        [x | B | C]    = causal_conv1d_silu(xBC)     xbc_widths (d_inner, G·N, G·N)

    returned as (z, x, B, C, dt), each a contiguous tensor of its own, not a view. That is the
    point of the function: compiled (``compiled_split_causal_conv1d_silu``), the backward receives
    the five gradients as they are and writes the in-projection's gradient [dz | dxBC | ddt] from
    them in its own kernels, where autograd would join the views' gradients with a copy per split
    (two full passes over the in-projection's output a layer). The values are
    ``causal_conv1d_silu``'s and the inputs' own: a split and a copy round nothing."""
    z, xbc, dt = torch.split(zxbcdt, list(widths), dim=-1)
    x, b, c = torch.split(causal_conv1d_silu(xbc, weight, bias), list(xbc_widths), dim=-1)
    return tuple(t.clone(memory_format=torch.contiguous_format) for t in (z, x, b, c, dt))


@functools.cache
def compiled_split_causal_conv1d_silu() -> Callable:
    """``split_causal_conv1d_silu`` through ``torch.compile``, as ``compiled_causal_conv1d_silu``."""
    return torch.compile(split_causal_conv1d_silu, fullgraph=True, dynamic=False)


@functools.cache
def compiled_causal_conv1d_silu() -> Callable:
    """``causal_conv1d_silu`` through ``torch.compile``: on a GPU one generated kernel forward (the
    K shifted reads of x, the sum, the SiLU, one write) and, backward, one for x's gradient and
    reductions over batch and time for the weight's and bias's, where eager torch runs the
    depthwise convolution's three kernels, a separate SiLU each way and, in the reference's
    channels-last layout, a transposed copy for ``F.conv1d`` each way. The same formula; its sums are rounded in
    another order than ``F.conv1d``'s, so the last bits differ. Static shapes and ``fullgraph`` as
    ``compiled_rms_norm``."""
    return torch.compile(causal_conv1d_silu, fullgraph=True, dynamic=False)


class ConvMixer:
    """A Mamba-2 mixer whose conv1d and SiLU can run as one compiled formula: ``compiled_conv1d``,
    off until ``compile_conv1d`` switches it on."""

    compiled_conv1d = False


class CausalConv1dSiLU(nn.Module):
    """``compiled_causal_conv1d_silu`` as a module without parameters (a mixer passes its conv1d's
    weight and bias), so that a profile labels its kernels, forward and backward, as the conv's."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return compiled_causal_conv1d_silu()(x, weight, bias)


class SplitCausalConv1dSiLU(nn.Module):
    """``compiled_split_causal_conv1d_silu`` as a module without parameters, with the mixer's
    widths, so that a profile labels its kernels, forward and backward, as the conv's."""

    def __init__(self, widths: tuple[int, int, int], xbc_widths: tuple[int, int, int]):
        super().__init__()
        self.widths, self.xbc_widths = widths, xbc_widths

    def forward(
        self, zxbcdt: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, ...]:
        return compiled_split_causal_conv1d_silu()(zxbcdt, weight, bias, self.widths, self.xbc_widths)


class RMSNorm(nn.Module):
    """``rms_norm`` as a module; ``compiled`` (set by ``compile_elementwise``) runs ``compiled_rms_norm``."""

    compiled = False

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (compiled_rms_norm() if self.compiled else rms_norm)(x, self.weight, self.eps)


def compile_elementwise(model: nn.Module) -> int:
    """Every ``RMSNorm`` of ``model`` (megatron's too: ``fp4repro.megatron.norm`` subclasses it)
    computed by ``compiled_rms_norm`` from now on, and every ``SquaredReLUMLP``'s activation by
    ``compiled_squared_relu`` (``train.fused_kernels``); returns how many modules were switched.
    Mamba-2's gated norms are left as they are: on a GPU they are mamba-ssm's fused Triton kernel
    already (and megatron's MLP compiles its squared ReLU itself)."""
    modules = [m for m in model.modules() if isinstance(m, (RMSNorm, SquaredReLUMLP))]
    for module in modules:
        module.compiled = True
    return len(modules)


def compile_conv1d(model: nn.Module) -> int:
    """Every Mamba-2 mixer of ``model`` (``ConvMixer``: the reference's ``Mamba2Mixer`` and
    megatron's, ``fp4repro.megatron.mixer``) runs its conv1d and SiLU as
    ``compiled_causal_conv1d_silu`` from now on (``train.compiled_conv1d``); returns how many."""
    modules = [m for m in model.modules() if isinstance(m, ConvMixer)]
    for module in modules:
        module.compiled_conv1d = True
    return len(modules)


class GatedRMSNorm(nn.Module):
    """Mamba-2's output norm, gate first (mamba-ssm RMSNormGated with norm_before_gate=False).

        u = y · silu(z)
        out = u / sqrt(mean_group(u²) + eps) · weight

    The mean runs over groups of `group_size` consecutive channels (d_inner / n_groups, so that
    the norm never mixes channels of different SSM groups). float32 inside, y's dtype out.
    """

    def __init__(self, dim: int, group_size: int, eps: float = 1e-5):
        super().__init__()
        self.group_size = group_size
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        with _float32_region(y):
            u = _wide(y) * F.silu(_wide(z))
            grouped = u.unflatten(-1, (-1, self.group_size))
            normed = grouped * torch.rsqrt(grouped.square().mean(-1, keepdim=True) + self.eps)
            out = normed.flatten(-2) * _wide(self.weight)
        return out.to(y.dtype)


class Mamba2Mixer(ConvMixer, nn.Module):
    """Mamba-2 mixer, parameter for parameter as mamba-ssm's Mamba2.

        [z | xBC | dt] = in_proj(u)                     z: d_inner, xBC: d_inner + 2·G·N, dt: H
        xBC = silu(causal_depthwise_conv1d(xBC))        kernel K, with bias
        [x | B | C] = xBC
        dt = softplus(dt + dt_bias);  A = −exp(A_log)   per head
        y = SSD(x, dt, A, B, C) + D · x                 (see ssd.py)
        out = out_proj(GatedRMSNorm(y, z))

    Parameters: in_proj (d_model → 2·d_inner + 2·G·N + H), conv1d weight (C, 1, K) and bias (C)
    with C = d_inner + 2·G·N, dt_bias, A_log and D (H each), norm weight (d_inner), out_proj
    (d_inner → d_model). Linears have no bias.

    On CUDA with mamba-ssm installed, the scan and the gated norm run as mamba-ssm's Triton
    kernels (`use_triton_kernels = False` forces the torch path, e.g. to compare the two).
    ``compiled_conv1d``: the two splits, the conv1d and its SiLU as
    ``compiled_split_causal_conv1d_silu``.
    """

    LINEARS = LAYER_LINEARS["mamba"]

    def __init__(self, config: ModelConfig, make_linear: LinearFactory):
        super().__init__()
        self.n_heads = config.mamba_heads
        self.head_dim = config.mamba_head_dim
        self.n_groups = config.mamba_groups
        self.state_size = config.mamba_state_size
        self.d_inner = config.mamba_d_inner
        self.conv_dim = config.mamba_conv_dim
        self.chunk_size = config.mamba_chunk_size
        self.use_triton_kernels = True

        self.in_proj = make_linear(config.hidden_size, config.mamba_in_proj_size, "in_proj")
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            kernel_size=config.mamba_conv_kernel,
            groups=self.conv_dim,
            padding=config.mamba_conv_kernel - 1,
            bias=True,
        )
        # no parameters: the compiled form of _split_conv
        self.conv_silu = SplitCausalConv1dSiLU(
            (self.d_inner, self.conv_dim, self.n_heads),
            (self.d_inner, self.n_groups * self.state_size, self.n_groups * self.state_size),
        )
        self.dt_bias = nn.Parameter(torch.empty(self.n_heads))
        self.A_log = nn.Parameter(torch.empty(self.n_heads))
        self.D = nn.Parameter(torch.empty(self.n_heads))
        self.norm = GatedRMSNorm(self.d_inner, group_size=self.d_inner // self.n_groups, eps=config.norm_eps)
        self.out_proj = make_linear(self.d_inner, config.hidden_size, "out_proj")

    @torch.no_grad()
    def reset_parameters(
        self,
        init_std: float,
        out_std: float,
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_floor: float = 1e-4,
        A_range: tuple[float, float] = (1.0, 16.0),
    ) -> None:
        """mamba-ssm's initialization of the SSM parameters; Megatron-style normal linears.

        dt ~ exp(U(log dt_min, log dt_max)) clamped to >= dt_floor; dt_bias = softplus⁻¹(dt)
        = dt + log(1 − exp(−dt)), so that softplus(0 + dt_bias) starts at dt.
        A ~ U(A_range), stored as A_log = log A. D = 1.
        """
        nn.init.normal_(self.in_proj.weight, std=init_std)
        nn.init.normal_(self.out_proj.weight, std=out_std)
        self.conv1d.reset_parameters()
        device = self.dt_bias.device
        log_dt = torch.rand(self.n_heads, device=device) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
        dt = torch.exp(log_dt).clamp(min=dt_floor)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log.copy_(torch.log(torch.empty(self.n_heads, device=device).uniform_(*A_range)))
        self.D.fill_(1.0)
        self.norm.reset_parameters()

    def _conv(self, xBC: torch.Tensor) -> torch.Tensor:
        """silu(causal depthwise conv1d) over time, in float32: (b, l, C) -> (b, l, C) in xBC's dtype.

        padding = K − 1 on both sides, keeping the first l outputs, makes output t depend on inputs
        t−K+1 … t only.
        """
        length = xBC.shape[1]
        with _float32_region(xBC):
            out = F.conv1d(
                _wide(xBC).transpose(1, 2),
                _wide(self.conv1d.weight),
                _wide(self.conv1d.bias),
                padding=self.conv1d.padding,
                groups=self.conv_dim,
            )[..., :length]
            out = F.silu(out).transpose(1, 2)
        return out.to(xBC.dtype)

    def _split_conv(self, zxbcdt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(z, x, B, C, dt) from the in-projection's output: [z | xBC | dt], xBC through ``_conv``,
        [x | B | C] of its output; views. ``compiled_conv1d``: all of it as
        ``compiled_split_causal_conv1d_silu``'s tensors of their own, whose gradients reach the
        in-projection without a copy per split."""
        if self.compiled_conv1d:
            return self.conv_silu(zxbcdt, self.conv1d.weight.squeeze(1), self.conv1d.bias)
        z, xBC, dt = torch.split(zxbcdt, list(self.conv_silu.widths), dim=-1)
        x, B, C = torch.split(self._conv(xBC), list(self.conv_silu.xbc_widths), dim=-1)
        return z, x, B, C, dt

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        z, x, B, C, dt = self._split_conv(self.in_proj(u))
        x = x.unflatten(-1, (self.n_heads, self.head_dim))
        B = B.unflatten(-1, (self.n_groups, self.state_size))
        C = C.unflatten(-1, (self.n_groups, self.state_size))
        A = -torch.exp(_wide(self.A_log))

        kernels = load_mamba_ssm_kernels() if (u.is_cuda and self.use_triton_kernels) else None
        if kernels is not None:
            y = kernels.chunk_scan_combined(
                x, dt, A, B, C, self.chunk_size, D=self.D, dt_bias=self.dt_bias, dt_softplus=True
            )
            y = kernels.gated_rmsnorm(
                y.flatten(-2),
                self.norm.weight,
                None,
                z=z,
                eps=self.norm.eps,
                group_size=self.norm.group_size,
                norm_before_gate=False,
            )
        else:
            with _float32_region(u):
                dt = F.softplus(_wide(dt) + _wide(self.dt_bias))
            y, _ = ssd_chunked(x, dt, A, B, C, self.chunk_size, D=self.D)
            y = self.norm(y.flatten(-2), z)
        return self.out_proj(y)


def apply_rope(q: torch.Tensor, k: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding, rotate-half layout (GPT-NeoX / Megatron default).

    For head dims split into halves (a, b) and frequencies f_i = theta^(−2i/d), position t:
        (a, b) -> (a·cos(t·f) − b·sin(t·f), b·cos(t·f) + a·sin(t·f)).
    q, k: (batch, heads, time, head_dim); computed in float32 (float64 for float64 inputs),
    returned in the inputs' dtype.
    """
    head_dim, length = q.shape[-1], q.shape[-2]
    dtype = _wide_dtype(q.dtype)
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=q.device, dtype=dtype) / head_dim)
    angles = torch.arange(length, device=q.device, dtype=dtype)[:, None] * inv_freq
    cos, sin = angles.cos(), angles.sin()

    def rotate(t: torch.Tensor) -> torch.Tensor:
        a, b = _wide(t).chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(t.dtype)

    with _float32_region(q):
        return rotate(q), rotate(k)


class CausalSelfAttention(nn.Module):
    """Grouped-query causal self-attention (no position embedding unless config.rope).

    [Q | K | V] = qkv_proj(x)          one fused linear: H·d | H_kv·d | H_kv·d
                                       (config.qkv == "separate": Q = q_proj(x), K = k_proj(x),
                                       V = v_proj(x), each quantized with its own amax)
    y = softmax(Q·Kᵀ / sqrt(d) + causal mask) · V      (PyTorch SDPA; each KV head serves H/H_kv
                                                        query heads)
    out = o_proj(y)
    """

    LINEARS = LAYER_LINEARS["attention"]

    def __init__(self, config: ModelConfig, make_linear: LinearFactory):
        super().__init__()
        self.n_heads = config.attn_heads
        self.n_kv_heads = config.attn_kv_heads
        self.head_dim = config.attn_head_dim
        self.rope_theta = config.rope_theta if config.rope else None
        self.sizes = [self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim, self.n_kv_heads * self.head_dim]
        self.fused_qkv = config.qkv == "fused"
        if self.fused_qkv:
            self.qkv_proj = make_linear(config.hidden_size, config.attn_qkv_size, "qkv_proj")
        else:
            self.LINEARS = SEPARATE_QKV + ("o_proj",)  # this model's, as config.layer_linears names them
            for name, size in zip(SEPARATE_QKV, self.sizes):
                setattr(self, name, make_linear(config.hidden_size, size, name))
        self.o_proj = make_linear(self.n_heads * self.head_dim, config.hidden_size, "o_proj")

    @torch.no_grad()
    def reset_parameters(self, init_std: float, out_std: float) -> None:
        for name in self.LINEARS[:-1]:
            nn.init.normal_(getattr(self, name).weight, std=init_std)
        nn.init.normal_(self.o_proj.weight, std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        if self.fused_qkv:
            q, k, v = torch.split(self.qkv_proj(x), self.sizes, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)  # (b, H, t, d)
        k = k.unflatten(-1, (self.n_kv_heads, self.head_dim)).transpose(1, 2)  # (b, H_kv, t, d)
        v = v.unflatten(-1, (self.n_kv_heads, self.head_dim)).transpose(1, 2)
        if self.rope_theta is not None:
            q, k = apply_rope(q, k, self.rope_theta)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_heads != self.n_kv_heads)
        return self.o_proj(y.transpose(1, 2).flatten(-2))


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    """relu(x)². Under CUDA autocast the square (``pow``) is one of autocast's float32 operations:
    x (BF16) is widened and squared in float32, float32 out, where the product of two BF16 values
    is exact; a quantized next linear reads these float32 values. Its gradient g·2·relu(x) is exact
    in float32 too for BF16-valued g (the next linear's input gradient, BF16 rounded), and is
    rounded once to x's dtype. In float32 (the CPU's runs) each is one rounding of the exact value."""
    return F.relu(x).square()


@functools.cache
def compiled_squared_relu() -> Callable:
    """``squared_relu`` through ``torch.compile``: one generated kernel forward (read x, write the
    float32 square) and one backward, where eager torch runs three (the ReLU, autocast's cast, the
    square) and five (the square's gradient in three, its cast, the ReLU's gradient). The same
    bits: every intermediate is exact (``squared_relu``), so only the final rounding to the output's
    dtype remains, which both make once. Static shapes as in ``compiled_rms_norm``, without its
    ``fullgraph``: past dynamo's recompile limit the eager function gives the same bits."""
    return torch.compile(squared_relu, dynamic=False)


class SquaredReLUMLP(nn.Module):
    """out = fc2(relu(fc1(x))²), no gating, no biases (Nemotron-H's MLP); ``compiled`` (set by
    ``compile_elementwise``) runs ``compiled_squared_relu``."""

    LINEARS = LAYER_LINEARS["mlp"]
    compiled = False

    def __init__(self, config: ModelConfig, make_linear: LinearFactory):
        super().__init__()
        self.fc1 = make_linear(config.hidden_size, config.mlp_hidden_size, "fc1")
        self.fc2 = make_linear(config.mlp_hidden_size, config.hidden_size, "fc2")

    @torch.no_grad()
    def reset_parameters(self, init_std: float, out_std: float) -> None:
        nn.init.normal_(self.fc1.weight, std=init_std)
        nn.init.normal_(self.fc2.weight, std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        activation = compiled_squared_relu() if self.compiled else squared_relu
        return self.fc2(activation(self.fc1(x)))


MIXERS: dict[str, type[nn.Module]] = {"mamba": Mamba2Mixer, "attention": CausalSelfAttention, "mlp": SquaredReLUMLP}
