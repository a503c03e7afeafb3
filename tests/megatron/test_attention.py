"""megatron's attention layer with the SDPA core computes the reference's attention layer (CPU,
FP32): the same converted weights, the same tokens, outputs and input gradients equal to FP32
rounding; and the core alone against causal grouped-query attention written out by hand."""

import math

import pytest
import torch

from fp4repro.config.model import load_model_config
from fp4repro.megatron.attention import SDPAttention
from fp4repro.megatron.convert import to_megatron
from fp4repro.model import NemotronH


def test_the_core_is_causal_grouped_query_attention(megatron_cpu):
    tiny = load_model_config("tiny")
    core = megatron_cpu(tiny).decoder.layers[tiny.layer_types.index("attention")].self_attention.core_attention
    assert isinstance(core, SDPAttention)
    g = torch.Generator().manual_seed(5)
    s, b, heads, kv, d = 7, 2, tiny.attn_heads, tiny.attn_kv_heads, tiny.attn_head_dim
    q, k, v = (
        torch.randn(s, b, heads, d, generator=g),
        torch.randn(s, b, kv, d, generator=g),
        torch.randn(s, b, kv, d, generator=g),
    )
    got = core(q, k, v, None)
    # by hand: head h reads KV head h // (heads / kv); position i sees positions <= i
    kk, vv = k.repeat_interleave(heads // kv, dim=2), v.repeat_interleave(heads // kv, dim=2)
    scores = torch.einsum("ibhd,jbhd->bhij", q, kk) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.einsum("bhij,jbhd->ibhd", scores.softmax(-1), vv).flatten(2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind, ours, theirs", [("attention", "mixer", "self_attention"), ("mlp", "mixer", "mlp")])
def test_megatron_layers_compute_the_reference_layers(kind, ours, theirs, megatron_cpu):
    tiny = load_model_config("tiny")
    torch.manual_seed(2)
    reference = NemotronH(tiny)
    model = megatron_cpu(tiny)
    model.load_state_dict(to_megatron(reference.state_dict(), tiny), strict=True)
    i = tiny.layer_types.index(kind)
    x = torch.randn(3, 16, tiny.hidden_size, generator=torch.Generator().manual_seed(9))  # [b, s, h]
    xr, xm = x.clone().requires_grad_(), x.transpose(0, 1).clone().requires_grad_()  # megatron: [s, b, h]
    yr = getattr(reference.layers[i], ours)(xr)
    ym = getattr(model.decoder.layers[i], theirs)(xm, *((None,) if kind == "attention" else ()))[0]  # no mask: causal
    torch.testing.assert_close(ym.transpose(0, 1), yr, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(yr)
    yr.backward(g)
    ym.backward(g.transpose(0, 1))
    torch.testing.assert_close(xm.grad.transpose(0, 1), xr.grad, rtol=1e-5, atol=1e-6)
