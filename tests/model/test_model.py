import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fp4repro.config.model import load_model_config
from fp4repro.config.spec import OPERANDS
from fp4repro.model import NemotronH
from fp4repro.model.layers import FP32OutputHead, GatedRMSNorm, Mamba2Mixer


def assert_causal(model: NemotronH, length: int, positions: list[int]) -> None:
    """Changing the token at t leaves every logit before t bit for bit unchanged, and changes t's."""
    model.eval()
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (2, length))
    with torch.no_grad():
        logits = model(tokens)
        for t in positions:
            changed = tokens.clone()
            changed[:, t] = (changed[:, t] + 1 + torch.randint(0, vocab - 1, (2,))) % vocab
            new_logits = model(changed)
            torch.testing.assert_close(new_logits[:, :t], logits[:, :t], rtol=0, atol=0)
            assert not torch.allclose(new_logits[:, t], logits[:, t])


@pytest.mark.parametrize("pattern", ["M", "*", "-", "M-M*-"])
def test_causality_per_layer_type_and_hybrid(make_config, pattern):
    # Length 21 with Mamba chunks of 8: changes at chunk starts, inside chunks and in the last,
    # partial chunk.
    assert_causal(NemotronH(make_config(pattern=pattern)), length=21, positions=[0, 3, 8, 12, 16, 20])


def test_causality_with_rope(make_config):
    assert_causal(NemotronH(make_config(pattern="*M", rope=True)), length=12, positions=[1, 6, 11])


def test_forward_shapes_and_backward(make_config):
    model = NemotronH(make_config())
    tokens = torch.randint(0, 64, (3, 17))
    logits = model(tokens)
    assert logits.shape == (3, 17, 64)
    F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_bfloat16_autocast_keeps_norms_conv_and_scan_in_float32(make_config):
    model = NemotronH(make_config())
    tokens = torch.randint(0, 64, (2, 10))
    reference = model(tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
    assert logits.dtype == torch.float32  # the LM head multiplies in FP32 (FP32OutputHead)
    torch.testing.assert_close(logits, reference, rtol=0.05, atol=0.05)


def test_the_lm_head_multiplies_bf16_copies_in_fp32_as_the_authors_do(make_config):
    model = NemotronH(make_config())
    h = torch.randn(3, 5, model.config.hidden_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model.lm_head(h)
    w = model.lm_head.weight.detach()
    want = (h.to(torch.bfloat16).double() @ w.to(torch.bfloat16).double().t()).float()
    assert logits.dtype == torch.float32
    # an FP32 GEMM of the BF16 copies: within float32 rounding of the exact products' sum, far
    # from a BF16 GEMM's output (which rounds to 8 bits)
    assert torch.allclose(logits, want, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(logits, logits.to(torch.bfloat16).float(), rtol=1e-6, atol=1e-6)
    assert torch.equal(model.lm_head(h), h @ w.t())  # without autocast: the float32 linear


def test_tiny_model_runs_a_training_step():
    model = NemotronH(load_model_config("tiny"))
    tokens = torch.randint(0, model.config.vocab_size, (2, 129))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(torch.log(torch.tensor(2048.0)).item(), rel=0.05)
    assert losses[-1] < losses[0]


def test_without_recipe_every_linear_is_plain_and_bf16(make_config):
    model = NemotronH(make_config())
    description = model.describe()
    assert list(description) == [
        "layers.0.mixer.in_proj",
        "layers.0.mixer.out_proj",
        "layers.1.mixer.fc1",
        "layers.1.mixer.fc2",
        "layers.2.mixer.in_proj",
        "layers.2.mixer.out_proj",
        "layers.3.mixer.qkv_proj",
        "layers.3.mixer.o_proj",
        "layers.4.mixer.fc1",
        "layers.4.mixer.fc2",
        "lm_head",
    ]
    assert all(ops == {op: "bf16" for op in OPERANDS} for ops in description.values())
    internal = [module for name, module in model.linears() if name != "lm_head"]
    assert all(type(module) is nn.Linear and module.bias is None for module in internal)
    assert type(model.lm_head) is FP32OutputHead and model.lm_head.bias is None
    assert type(model.embedding) is nn.Embedding


def test_initialization(make_config):
    config = make_config(pattern="M-" * 4)
    mixer = NemotronH(config).layers[0].mixer.requires_grad_(False)
    dt = F.softplus(mixer.dt_bias)
    assert ((dt >= 1e-4) & (dt <= 0.1 + 1e-6)).all()
    A = torch.exp(mixer.A_log)
    assert ((A >= 1) & (A <= 16)).all()
    assert (mixer.D == 1).all() and (mixer.norm.weight == 1).all()
    # Linears that write into the residual stream start smaller, by 1/sqrt(2 · n_layers).
    ratio = mixer.out_proj.weight.std() / mixer.in_proj.weight.std()
    assert ratio == pytest.approx((2 * config.n_layers) ** -0.5, rel=0.2)


def test_gated_rmsnorm_normalizes_each_group_after_gating():
    norm = GatedRMSNorm(12, group_size=4, eps=0.0)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 13.0))
    y, z = torch.randn(5, 12), torch.randn(5, 12)
    out = norm(y, z)
    gated = (y * F.silu(z)).view(5, 3, 4)
    expected = (gated / gated.square().mean(-1, keepdim=True).sqrt()).view(5, 12) * norm.weight
    torch.testing.assert_close(out, expected.detach())


def test_mamba_mixer_matches_step_by_step_definition(make_config):
    """The whole mixer (conv, softplus, scan, D, gated norm) against an explicit per-step loop."""
    config = make_config(pattern="M")
    mixer = Mamba2Mixer(config, lambda i, o, name: nn.Linear(i, o, bias=False)).double()
    mixer.reset_parameters(0.2, 0.2)
    u = torch.randn(2, 11, config.hidden_size, dtype=torch.float64)
    with torch.no_grad():
        out = mixer(u)
        d_inner, gn, h, p, n = (
            config.mamba_d_inner,
            config.mamba_groups * config.mamba_state_size,
            config.mamba_heads,
            config.mamba_head_dim,
            config.mamba_state_size,
        )
        z, xBC, dt = mixer.in_proj(u).split([d_inner, d_inner + 2 * gn, h], -1)
        w, k = mixer.conv1d.weight[:, 0], config.mamba_conv_kernel
        padded = F.pad(xBC, (0, 0, k - 1, 0))
        xBC = F.silu(torch.stack([(padded[:, t : t + k] * w.T).sum(1) for t in range(11)], 1) + mixer.conv1d.bias)
        x, B, C = xBC.split([d_inner, gn, gn], -1)
        x, B, C = x.view(2, 11, h, p), B.view(2, 11, -1, n), C.view(2, 11, -1, n)
        dt = F.softplus(dt + mixer.dt_bias)
        A = -torch.exp(mixer.A_log)
        group = torch.arange(h) // (h // config.mamba_groups)
        state = torch.zeros(2, h, p, n, dtype=torch.float64)
        ys = []
        for t in range(11):
            state = (
                torch.exp(dt[:, t] * A)[..., None, None] * state
                + dt[:, t, :, None, None] * x[:, t, :, :, None] * B[:, t, group, None, :]
            )
            ys.append((state * C[:, t, group, None, :]).sum(-1) + mixer.D[:, None] * x[:, t])
        y = torch.stack(ys, 1).reshape(2, 11, d_inner)
        expected = mixer.out_proj(mixer.norm(y, z))
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_attention_matches_explicit_grouped_query_softmax(make_config):
    config = make_config(pattern="*")
    attn = NemotronH(config).layers[0].mixer
    x = torch.randn(2, 9, config.hidden_size)
    with torch.no_grad():
        out = attn(x)
        q, k, v = attn.qkv_proj(x).split([32, 16, 16], -1)
        q = q.view(2, 9, 4, 8).transpose(1, 2)
        k = k.view(2, 9, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)  # KV head j serves q heads 2j, 2j+1
        v = v.view(2, 9, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
        scores = (q @ k.transpose(-1, -2)) / 8**0.5
        scores = scores.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
        expected = attn.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, 32))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_separate_qkv_computes_what_the_fused_projection_does(make_config):
    """Separate q/k/v whose weights are the fused weight's rows give the fused model's logits, bit
    for bit (FP32 on the CPU); the two differ only in their linears, and so under a recipe in amaxes."""
    fused = NemotronH(make_config())
    separate = NemotronH(make_config(qkv="separate"))
    state = fused.state_dict()
    q, k, v = state.pop("layers.3.mixer.qkv_proj.weight").split([32, 16, 16])  # 4 x 8 | 2 x 8 | 2 x 8
    state.update({f"layers.3.mixer.{name}.weight": w for name, w in zip(("q_proj", "k_proj", "v_proj"), (q, k, v))})
    separate.load_state_dict(state)  # strict: the same parameters but for the split
    assert [n.split(".")[-1] for n, _ in separate.linears()][6:10] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    tokens = torch.randint(0, fused.config.vocab_size, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(separate(tokens), fused(tokens), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.slow  # Triton compiles and autotunes its kernels on first use (about 2 minutes)
def test_triton_kernels_match_torch_ssd_on_cuda(make_config):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from fp4repro.model._mamba_ssm import load_mamba_ssm_kernels

    if load_mamba_ssm_kernels() is None:
        pytest.skip("mamba-ssm's Triton kernels are not importable")
    config = make_config(
        pattern="M",
        hidden_size=256,
        mamba_heads=16,
        mamba_head_dim=32,
        mamba_state_size=64,
        mamba_groups=2,
        mamba_chunk_size=64,
    )
    mixer = NemotronH(config).layers[0].mixer.cuda()
    u = torch.randn(2, 300, config.hidden_size, device="cuda", requires_grad=True)
    outputs, grads = [], []
    for use_triton in (True, False):
        mixer.use_triton_kernels = use_triton
        mixer.zero_grad()
        out = mixer(u)
        (out * torch.linspace(-1, 1, out.shape[-1], device="cuda")).sum().backward()
        outputs.append(out.detach())
        grads.append([u.grad.clone()] + [p.grad.clone() for p in mixer.parameters()])
        u.grad = None
    torch.testing.assert_close(outputs[0], outputs[1], rtol=2e-3, atol=2e-3)
    for g_triton, g_torch in zip(*grads):
        torch.testing.assert_close(g_triton, g_torch, rtol=1e-2, atol=1e-2)


def test_rope_scores_depend_only_on_relative_position():
    from fp4repro.model.layers import apply_rope

    q = torch.randn(1, 1, 1, 16, dtype=torch.float64).expand(1, 1, 10, 16)
    k = torch.randn(1, 1, 1, 16, dtype=torch.float64).expand(1, 1, 10, 16)
    q_rot, k_rot = apply_rope(q, k, theta=10000.0)
    scores = (q_rot @ k_rot.transpose(-1, -2))[0, 0]
    for offset in range(-9, 10):
        diagonal = torch.diagonal(scores, offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))
    assert not torch.allclose(scores[0, 0], scores[1, 0])
