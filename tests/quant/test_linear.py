import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fp4repro.config.recipe import load_recipe
from fp4repro.quant import LinearSpecs, QuantLinear, QuantSpec, QuantState, quantize_dequantize, quantized_operand

#: A model's layers as recipes resolve them (``ModelConfig.layer_linears``): 8 MLP layers. Recipes
#: may select layers by a share among those with a given linear, which needs the layers themselves.
LAYERS = (("fc1", "fc2"),) * 8


def _layer(specs, bias=True, seed=0):
    torch.manual_seed(seed)
    return QuantLinear(64, 48, bias=bias, specs=specs, state=QuantState(), name="l")


def test_bf16_recipe_is_exactly_f_linear():
    assert load_recipe("bf16").linear_specs(0, LAYERS[:4]) is None
    lin = _layer(None)
    x = torch.randn(3, 10, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y = lin(x)
    y_ref = F.linear(x2, lin.weight, lin.bias)
    assert torch.equal(y, y_ref)
    g = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, (x, lin.weight, lin.bias), g)
    dx_ref, dw_ref, db_ref = torch.autograd.grad(y_ref, (x2, lin.weight, lin.bias), g)
    assert torch.equal(dx, dx_ref) and torch.equal(dw, dw_ref) and torch.equal(db, db_ref)


def _rne(specs: LinearSpecs) -> LinearSpecs:
    from dataclasses import replace

    return LinearSpecs.from_operands({n: (replace(s, rounding="rne") if s else None) for n, s in specs.items()})


@pytest.mark.parametrize("recipe", ["nvfp4", "ue5m3", "ue5m3_t2048_all_dy", "mxfp4", "nvfp4_no_rht"])
def test_outputs_and_grads_are_matmuls_of_dequantized_operands(recipe):
    specs = _rne(load_recipe(recipe).linear_specs(0, LAYERS))
    lin = _layer(specs, bias=False)
    x = torch.randn(4, 20, 64, requires_grad=True)
    y = lin(x)
    x2, w = x.detach().reshape(-1, 64), lin.weight.detach()
    y_ref = quantize_dequantize(x2, specs.fprop_x) @ quantize_dequantize(w, specs.fprop_w).T
    assert torch.allclose(y.reshape(-1, 48), y_ref, rtol=1e-5, atol=1e-6)
    dy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, lin.weight), dy)
    dy2 = dy.reshape(-1, 48)
    dx_ref = quantize_dequantize(dy2, specs.dgrad_dy) @ quantize_dequantize(w.T, specs.dgrad_w).T
    dw_ref = quantize_dequantize(dy2.T, specs.wgrad_dy) @ quantize_dequantize(x2.T, specs.wgrad_x).T
    assert torch.allclose(dx.reshape(-1, 64), dx_ref, rtol=1e-5, atol=1e-6)
    assert torch.allclose(dw, dw_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recipe", ["nvfp4", "ue5m3", "mxfp4"])
def test_only_sr_operands_are_stochastic(recipe):
    specs = load_recipe(recipe).linear_specs(0, LAYERS)
    t = torch.randn(40, 64)
    for name, spec in specs.items():
        torch.manual_seed(1)
        a, _ = quantized_operand(t, spec, None, "l", name)
        torch.manual_seed(2)
        b, _ = quantized_operand(t, spec, None, "l", name)
        assert torch.equal(a, b) == (spec.rounding == "rne"), name
    # end to end: the forward pass never depends on the seed, the gradients do
    lin = _layer(specs)
    x = torch.randn(2, 20, 64, requires_grad=True)
    outs, grads = [], []
    for seed in (1, 2):
        torch.manual_seed(seed)
        y = lin(x)
        outs.append(y.detach())
        grads.append(torch.autograd.grad(y.square().sum(), (x, lin.weight)))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(grads[0][0], grads[1][0]) and not torch.equal(grads[0][1], grads[1][1])


def test_fp4_differs_from_bf16_but_is_close():
    lin = _layer(load_recipe("ue5m3").linear_specs(0, LAYERS))
    x = torch.randn(8, 64)
    y, ref = lin(x), F.linear(x, lin.weight, lin.bias)
    rel = ((y - ref).norm() / ref.norm()).item()
    assert 0.01 < rel < 0.3


def test_periodic_scaling_and_telemetry_flow_through_the_layer():
    state = QuantState()
    lin = QuantLinear(64, 48, specs=load_recipe("ue5m3").linear_specs(0, LAYERS), state=state, name="blk0.fc1")
    x = torch.randn(16, 64, requires_grad=True)
    state.telemetry = True
    lin(x).sum().backward()
    rows = state.pop_telemetry()
    assert {r["operand"] for r in rows} == {"fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x"}
    assert all(r["layer"] == "blk0.fc1" and r["blocks"] > 0 for r in rows)
    held = state.state_dict()["held"]
    assert set(held) == {
        f"blk0.fc1.{op}" for op in ("fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x")
    }
    # a second call before the refresh uses the held amax: a 10x larger input is clamped
    state.advance()
    lin(x * 10).sum().backward()
    rows = state.pop_telemetry()
    fx = next(r for r in rows if r["operand"] == "fprop.x")
    assert fx["amax_ratio"] == pytest.approx(0.1, rel=1e-6)


def test_describe_lists_every_operand():
    lin = QuantLinear(32, 32, specs=load_recipe("nvfp4").linear_specs(0, LAYERS))
    d = lin.describe()
    assert d["wgrad.dy"] == "e2m1/e4m3 1x16 T=448 SR current RHT"
    assert QuantLinear(32, 32).describe() == {k: "bf16" for k in d}


def test_state_dict_keys_match_nn_linear():
    assert QuantLinear(8, 4, bias=True).state_dict().keys() == torch.nn.Linear(8, 4).state_dict().keys()


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["nvfp4", "ue5m3", "mxfp4"])
def test_cuda_bf16_matches_cpu_reference(recipe):
    specs = _rne(load_recipe(recipe).linear_specs(0, LAYERS))
    lin = _layer(specs, bias=True)
    x = torch.randn(4, 32, 64)
    y_cpu = lin(x)
    lin_gpu = _layer(specs, bias=True).cuda()
    xg = x.cuda().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin_gpu(xg)
    assert y.dtype == torch.bfloat16
    # operands are bit-identical (q·s exact in BF16); the difference is the final BF16 cast
    assert torch.allclose(y.float().cpu(), y_cpu, rtol=2**-7, atol=1e-3)
    y.float().sum().backward()
    assert xg.grad.shape == x.shape and lin_gpu.weight.grad.dtype == torch.float32


@pytest.mark.gpu
def test_cuda_quantizer_equals_cpu_reference():
    x = torch.randn(256, 512) * torch.exp(2 * torch.randn(256, 512))
    for spec in (
        QuantSpec(),
        QuantSpec(block=(16, 16)),
        QuantSpec(rht=True),
        QuantSpec(scale="ue5m3"),
        QuantSpec(scale="ue8m0", block=(1, 32), target=None, scale_rounding="up"),
    ):
        assert torch.equal(quantize_dequantize(x.cuda(), spec).cpu(), quantize_dequantize(x, spec)), str(spec)


def _decode_scale_by_numpy(amax: float, target: float | None) -> float:
    """d = 1 / min(Emax·T / A, FLT_MAX) in IEEE float32 arithmetic (numpy), 1 without a target or amax."""
    if target is None or amax == 0:
        return 1.0
    with np.errstate(over="ignore", divide="ignore"):
        g = np.float32(6.0 * target) / np.float32(amax)
    return float(np.float32(1.0) / min(g, np.finfo(np.float32).max))


@pytest.mark.parametrize("amax", [0.0, 1e-45, 3e-39, 1e-30, 0.37, 1.0, 448.0, 6.5e4, 3e38])
@pytest.mark.parametrize("target", [448.0, 2048.0, None])
def test_host_decode_scale_equals_the_kernels_and_float32_arithmetic(amax, target):
    # the cuBLAS-alpha epilogue takes d from the host: it must be the very float32 the kernel
    # computes on the device (in Triton's interpreter here) from the same held amax
    from fp4repro.kernels import quantize_2d
    from fp4repro.quant.linear import host_decode_scale

    spec = (
        QuantSpec(scale="ue5m3", target=target)
        if target is not None
        else QuantSpec(scale="ue8m0", block=(1, 32), target=None)
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, interpreted on a CPU
    held = torch.tensor(amax, dtype=torch.float32)
    kernel_d = float(quantize_2d(torch.ones(1, 32, device=device), spec, amax=held.to(device))["decode_scale"])
    assert host_decode_scale(float(held), 6.0, target) == kernel_d == _decode_scale_by_numpy(float(held), target)


def test_periodic_state_reads_the_held_amax_back_once_per_sample():
    from fp4repro.quant import TensorScaling

    state, scaling = QuantState(), TensorScaling("periodic", 2)
    state.hold("k", torch.tensor(3.5), scaling)
    assert state.held_amax_value("k") == 3.5
    state._held["k"] = torch.tensor(7.0)  # a cached value is not read again ...
    assert state.held_amax_value("k") == 3.5
    state.hold("k", torch.tensor(5.0), scaling)  # ... until the next sample replaces it
    assert state.held_amax_value("k") == 5.0


def test_the_first_held_amax_read_after_a_refresh_reads_every_operand_in_one_transfer(monkeypatch):
    from fp4repro.quant import TensorScaling

    state, scaling = QuantState(), TensorScaling("periodic", 2)
    amaxes = {f"l{i}.fprop.x": 0.1 * 3**i for i in range(5)}
    for key, a in amaxes.items():
        state.hold(key, torch.tensor(a, dtype=torch.float32), scaling)
    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.numel()) or tolist(t))
    got = {key: state.held_amax_value(key) for key in reversed(amaxes)}
    assert reads == [5]
    assert got == {key: float(torch.tensor(a, dtype=torch.float32)) for key, a in amaxes.items()}
    state.hold("l2.fprop.x", torch.tensor(9.0), scaling)  # one resampled: only it is read again
    assert state.held_amax_value("l4.fprop.x") == got["l4.fprop.x"] and reads == [5]
    assert state.held_amax_value("l2.fprop.x") == 9.0 and reads == [5, 1]


@pytest.mark.gpu
def test_cublas_alpha_epilogue_equals_the_fp32_epilogue_bit_for_bit():
    # integer-valued operands accumulate exactly in any order, so the two epilogues (cuBLAS alpha
    # on host-known scales, cuBLASLt's device alpha on device scales) must agree bit for bit
    from fp4repro.quant.gemm import emulated_gemm

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randint(-8, 9, (512, 1024), device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randint(-8, 9, (768, 1024), device="cuda", generator=g).to(torch.bfloat16)
    for da, db in ((0.37109375 / 3, 1 / 2688.0), (1.0, 1.0), (1e-3, None), (2.0**-20, 3.3e-5)):
        host = emulated_gemm(a, da, b, db, torch.bfloat16)
        dev = emulated_gemm(
            a,
            torch.tensor(float(torch.tensor(da)), device="cuda"),
            b,
            None if db is None else torch.tensor(float(torch.tensor(db)), device="cuda"),
            torch.bfloat16,
        )
        assert host.dtype == dev.dtype == torch.bfloat16
        assert torch.equal(host, dev), (da, db)


def _count_quantized_operands(monkeypatch, reuse: bool) -> list[str]:
    """The operands QuantLinear quantizes from now on, in order (until ``monkeypatch.undo()``);
    with ``reuse`` False, dgrad never takes the forward's Q(W)ᵀ."""
    import fp4repro.quant.linear as linear

    calls = []
    original = linear.quantized_operand

    def counting(t, spec, state, layer, operand, *args):
        calls.append(operand)
        return original(t, spec, state, layer, operand, *args)

    monkeypatch.setattr(linear, "quantized_operand", counting)
    if not reuse:
        monkeypatch.setattr(linear, "transposable_weight_spec", lambda specs: False)
    return calls


@pytest.mark.parametrize("recipe", ["ue5m3", "nvfp4"])
def test_dgrad_reuses_the_transposed_fprop_weight_exactly(recipe, monkeypatch):
    # 16x16 RNE weights: Q(Wᵀ) = Q(W)ᵀ under the same amax, so dgrad takes the forward's operand
    # (ue5m3: held amaxes, from the second step on; nvfp4: current amax, every step). The
    # gradients equal those of quantizing Wᵀ afresh, bit for bit.
    import fp4repro.quant.linear as linear

    specs = _rne(load_recipe(recipe).linear_specs(0, LAYERS))
    assert linear.transposable_weight_spec(specs)

    def run(reuse: bool):
        calls = _count_quantized_operands(monkeypatch, reuse)
        lin = _layer(specs, bias=False)
        grads = []
        for step in range(3):
            x = torch.randn(4, 20, 64, generator=torch.Generator().manual_seed(step), requires_grad=True)
            dx, dw = torch.autograd.grad(lin(x).square().sum(), (x, lin.weight))
            grads += [dx, dw]
            with torch.no_grad():
                lin.weight -= 0.01 * dw
            lin.state.advance()
        monkeypatch.undo()
        return grads, calls.count("dgrad.w")

    reused, fresh = run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(reused[0], fresh[0]))
    assert fresh[1] == 3
    assert reused[1] == (1 if recipe == "ue5m3" else 0)  # ue5m3 samples dgrad.w's amax on step 0


@pytest.mark.parametrize("recipe", ["ue5m3", "nvfp4"])
def test_a_telemetry_step_records_the_reused_weight_as_quantizing_it_afresh_would(recipe, monkeypatch):
    # on telemetry steps too, dgrad takes Q(W)ᵀ from the forward (no second quantization of W),
    # and its dgrad.w row has the counts a quantization of Wᵀ records (sums equal to rounding)
    specs = _rne(load_recipe(recipe).linear_specs(0, LAYERS))

    def rows(reuse: bool):
        calls = _count_quantized_operands(monkeypatch, reuse)
        lin = _layer(specs, bias=False)
        out = []
        for step in range(3):
            x = torch.randn(4, 20, 64, generator=torch.Generator().manual_seed(step), requires_grad=True)
            lin.state.telemetry = True
            lin(x).square().sum().backward()
            out += [r for r in lin.state.pop_telemetry() if r["operand"] == "dgrad.w"]
            with torch.no_grad():  # W moves away from its held amax: the rows differ step to step
                lin.weight.mul_(1.5)
            lin.state.advance()
        monkeypatch.undo()
        return out, calls.count("dgrad.w")

    (reused, reused_calls), (fresh, fresh_calls) = rows(True), rows(False)
    assert fresh_calls == 3 and reused_calls == (1 if recipe == "ue5m3" else 0)
    assert len(reused) == len(fresh) == 3
    if recipe == "ue5m3":  # held: the ratio falls as W grows
        assert [r["amax_ratio"] for r in reused] == pytest.approx([1.0, 1 / 1.5, 1 / 2.25], rel=1e-6)
    for a, b in zip(reused, fresh):
        floats = {"sq_error", "sq_norm", "rel_error"}
        assert {k: v for k, v in a.items() if k not in floats} == {k: v for k, v in b.items() if k not in floats}
        assert all(a[k] == pytest.approx(b[k], rel=1e-12) for k in floats)


@pytest.mark.parametrize("forward, backward", [(True, False), (False, True)])
def test_the_backward_records_dgrad_w_exactly_when_its_own_telemetry_is_on(forward, backward):
    # the forward's Q(W) carries stats only when the forward recorded telemetry: a backward whose
    # telemetry differs quantizes Wᵀ itself (recording it when on), so its rows are its own
    lin = _layer(_rne(load_recipe("ue5m3").linear_specs(0, LAYERS)), bias=False)
    x = torch.randn(4, 20, 64, requires_grad=True)
    lin(x).sum().backward()  # step 0 samples every amax
    lin.state.advance()
    lin.state.telemetry = forward
    y = lin(x).sum()
    lin.state.telemetry = backward
    y.backward()
    rows = lin.state.pop_telemetry()
    assert [r["operand"] for r in rows if r["operand"].startswith("dgrad")] == (
        ["dgrad.dy", "dgrad.w"] if backward else []
    )


def test_a_gemm_instrument_replaces_the_three_gemms_and_the_backward_keeps_the_forwards_choice():
    """Within ``gemm_instrument(g)`` each quantized GEMM calls g with the operands the emulation
    would multiply; the backward, run after the context has closed (as autograd may run it on a
    thread of its own), still calls g; outside, the emulated GEMM again."""
    from fp4repro.quant.gemm import emulated_gemm, gemm_instrument

    calls = []

    def doubled(a, da, b, db, out_dtype):
        calls.append((tuple(a.shape), tuple(b.shape)))
        return 2 * emulated_gemm(a, da, b, db, out_dtype)

    lin = _layer(load_recipe("ue5m3").linear_specs(0, LAYERS[:4]), bias=False)
    x = torch.randn(3, 10, 64, requires_grad=True)
    torch.manual_seed(5)
    want = lin(x)
    want_dx, want_dw = torch.autograd.grad(want, (x, lin.weight), torch.ones_like(want))
    lin.state = QuantState()
    with gemm_instrument(doubled):
        torch.manual_seed(5)
        got = lin(x)
    assert calls == [((30, 64), (48, 64))] and torch.equal(got, 2 * want)
    dx, dw = torch.autograd.grad(got, (x, lin.weight), torch.ones_like(got))
    assert calls[1:] == [((30, 48), (64, 48)), ((48, 30), (64, 30))]
    assert torch.equal(dx, 2 * want_dx) and torch.equal(dw, 2 * want_dw)
    lin.state = QuantState()
    torch.manual_seed(5)
    assert torch.equal(lin(x), want) and len(calls) == 3


def test_every_quantized_operand_is_asked_in_the_gemms_compute_dtype(monkeypatch):
    """Every quantization of a step writes its operand in the GEMM's compute dtype, so that on a
    GPU none is converted after the kernel wrote it (``scaled_operand``). On the CPU the layer
    computes in float32; the autograd function is called here with BF16 to tell the two apart."""
    import fp4repro.quant.linear as linear

    operands = _count_quantized_operands(monkeypatch, reuse=False)
    asked = []

    def spy(t, spec, **kw):
        asked.append(kw["out_dtype"])
        return real(t, spec, **kw)

    real = linear.scaled_operand
    monkeypatch.setattr(linear, "scaled_operand", spy)
    specs = _rne(load_recipe("ue5m3").linear_specs(0, LAYERS))
    weight = torch.randn(48, 64, requires_grad=True)
    x = torch.randn(30, 64, requires_grad=True)
    y = linear._QuantLinearFunction.apply(x, weight, None, specs, QuantState(), "l", torch.bfloat16, {}, True)
    y.float().sum().backward()
    assert len(operands) == 6 and asked == [torch.bfloat16] * 6


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["nvfp4", "ue5m3"])
def test_on_a_gpu_the_three_gemms_get_bf16_operands_of_float32_tensors(recipe):
    # float32 activations and parameters under BF16 autocast (the residual stream's norms and the
    # FP32 master weights): every quantized operand arrives in BF16, none converted by the GEMM
    from fp4repro.quant.gemm import emulated_gemm, gemm_instrument

    dtypes = []

    def recording(a, da, b, db, out_dtype):
        dtypes.append((a.dtype, b.dtype, out_dtype))
        return emulated_gemm(a, da, b, db, out_dtype)

    specs = _rne(load_recipe(recipe).linear_specs(0, LAYERS))
    lin = _layer(specs, bias=False).cuda()
    x = torch.randn(4, 32, 64, device="cuda", requires_grad=True)
    with gemm_instrument(recording), torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(x)
    y.float().sum().backward()
    assert dtypes == [(torch.bfloat16, torch.bfloat16, torch.bfloat16)] * 3


def _steps_with_and_without_shared_amaxes(recipe: str, monkeypatch, device="cpu", telemetry=False, float32_x=False):
    """Outputs and gradients of three steps of a layer under ``recipe`` with X's and dY's current
    amaxes taken together and with each quantization taking its own, and how many times the
    layer asked for them together (``operand_amaxes``). ``float32_x``: X in float32 on a GPU too,
    as a norm hands it under autocast."""
    import fp4repro.quant.linear as linear

    specs = load_recipe(recipe).linear_specs(0, LAYERS)
    calls = []
    original = linear.operand_amaxes

    def counting(t, row_spec, col_spec):
        calls.append(t.shape)
        return original(t, row_spec, col_spec)

    def run(shared: bool):
        monkeypatch.setattr(linear, "operand_amaxes", counting)
        if not shared:
            monkeypatch.setattr(linear, "shared_current_amaxes", lambda t, *args: (None, None, t))
        lin = _layer(specs, bias=False).to(device)
        lin.state.telemetry = telemetry
        out = []
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            # BF16 on a GPU, as the layer before hands it under autocast (wgrad quantizes X in BF16)
            x = torch.randn(4, 20, 64, generator=g).to(
                device, torch.bfloat16 if device == "cuda" and not float32_x else None
            )
            x.requires_grad_()
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                y = lin(x)
            dx, dw = torch.autograd.grad(y.float().square().sum(), (x, lin.weight))
            out += [y, dx, dw]
            lin.state.advance()
        monkeypatch.undo()
        return out

    shared, own = run(True), run(False)
    return shared, own, calls


@pytest.mark.parametrize("recipe", ["nvfp4", "nvfp4_no_rht", "ue5m3"])
def test_x_and_dy_take_their_two_current_amaxes_together_and_nothing_else_changes(recipe, monkeypatch):
    # nvfp4: fprop.x and wgrad.x (with the RHT) of X, dgrad.dy and wgrad.dy of dY, each pair taken
    # together once in the forward and once in the backward; ue5m3 holds periodic amaxes: never
    shared, own, calls = _steps_with_and_without_shared_amaxes(recipe, monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(shared, own))
    assert calls == ([] if recipe == "ue5m3" else [(80, 64), (80, 48)] * 3)


def test_a_telemetry_step_takes_every_amax_on_its_own(monkeypatch):
    # telemetry tells a given amax from a current one: on its steps nothing is taken together
    shared, own, calls = _steps_with_and_without_shared_amaxes("nvfp4", monkeypatch, telemetry=True)
    assert all(torch.equal(a, b) for a, b in zip(shared, own)) and calls == []


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["nvfp4", "nvfp4_no_rht"])
def test_on_a_gpu_the_shared_amaxes_change_no_bit(recipe, monkeypatch):
    # the kernel's one read of X (and of dY) for both amaxes, against each quantization's own pass
    import fp4repro.kernels as kernels

    reads = []
    original = kernels.operand_amax_with_rht_triton
    monkeypatch.setattr(kernels, "operand_amax_with_rht_triton", lambda x: reads.append(x.shape) or original(x))
    shared, own, calls = _steps_with_and_without_shared_amaxes(recipe, monkeypatch, device="cuda")
    assert all(torch.equal(a, b) for a, b in zip(shared, own))
    assert calls == [(80, 64), (80, 48)] * 3
    assert reads == ([] if recipe == "nvfp4_no_rht" else [(80, 64), (80, 48)] * 3)


@pytest.mark.gpu
@pytest.mark.parametrize("telemetry", [False, True], ids=["plain", "telemetry"])
@pytest.mark.parametrize("recipe", ["nvfp4", "nvfp4_no_rht"])
def test_on_a_gpu_a_float32_xs_amaxes_and_bf16_cast_from_one_read_change_no_bit(recipe, telemetry, monkeypatch):
    # the kernel's one read of a float32 X for its amax, its BF16 cast and the cast's amax after
    # the RHT, against the cast in the backward and each quantization's own pass; a telemetry
    # step takes every amax on its own and casts X in the backward, as before
    import fp4repro.kernels as kernels

    reads = []
    original = kernels.operand_amax_with_rht_and_bf16_triton
    monkeypatch.setattr(
        kernels, "operand_amax_with_rht_and_bf16_triton", lambda x: reads.append(x.shape) or original(x)
    )
    shared, own, calls = _steps_with_and_without_shared_amaxes(
        recipe, monkeypatch, device="cuda", telemetry=telemetry, float32_x=True
    )
    assert all(torch.equal(a, b) for a, b in zip(shared, own))
    if telemetry:
        assert calls == [] and reads == []
    else:
        assert calls == [(80, 48)] * 3  # dY's pair; X's is operand_amaxes_and_bf16's
        assert reads == ([] if recipe == "nvfp4_no_rht" else [(80, 64)] * 3)


def test_a_backward_that_records_telemetry_takes_x_transposed_amax_afresh(monkeypatch):
    # a forward without telemetry took X's two amaxes together; a backward with it (the state
    # turned telemetry on in between) records wgrad.x as its own quantization would: with an inf
    # in X, the ratio of a given amax to the current one is not a current amax's
    import fp4repro.quant.linear as linear

    specs = load_recipe("nvfp4").linear_specs(0, LAYERS)

    def rows(shared: bool):
        if not shared:
            monkeypatch.setattr(linear, "shared_current_amaxes", lambda t, *args: (None, None, t))
        lin = _layer(specs, bias=False)
        x = torch.randn(4, 20, 64, generator=torch.Generator().manual_seed(5))
        x[0, 3, 5] = float("inf")
        y = lin(x.requires_grad_()).square().sum()
        lin.state.telemetry = True
        y.backward()
        monkeypatch.undo()
        return [r for r in lin.state.pop_telemetry() if r["operand"] == "wgrad.x"]

    shared, own = rows(True), rows(False)
    assert len(own) == 1 and shared == own


def _counting_shared_amaxes(monkeypatch) -> list:
    """The shapes of the tensors whose two amaxes QuantLinear takes together from now on."""
    import fp4repro.quant.linear as linear

    calls = []
    original = linear.operand_amaxes
    monkeypatch.setattr(linear, "operand_amaxes", lambda t, *specs: calls.append(t.shape) or original(t, *specs))
    return calls


@pytest.mark.parametrize("recipe", ["nvfp4", "nvfp4_no_rht"])
def test_float32_x_computed_in_bf16_takes_its_amaxes_and_its_cast_together(recipe, monkeypatch):
    # fprop.x quantizes float32 X, wgrad.x its BF16 cast: both amaxes and the cast in the forward
    # (operand_amaxes_and_bf16), the backward keeping X in BF16, and nothing else changes; the
    # autograd function is called with BF16, as under autocast on a GPU
    import fp4repro.quant.linear as linear

    specs = _rne(load_recipe(recipe).linear_specs(0, LAYERS))

    def run(shared: bool):
        calls = _counting_shared_amaxes(monkeypatch)
        original = linear.operand_amaxes_and_bf16
        monkeypatch.setattr(
            linear, "operand_amaxes_and_bf16", lambda t, *specs: calls.append(("bf16", t.shape)) or original(t, *specs)
        )
        if not shared:
            monkeypatch.setattr(linear, "shared_current_amaxes", lambda t, *args: (None, None, t))
        weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        x = (torch.randn(30, 64, generator=torch.Generator().manual_seed(2)) * 3).requires_grad_()
        x.data[4, 7] = 1.0 + 2.0**-8 + 2.0**-20  # rounds up to BF16, and would set the amax of a truncated cast apart
        x.data[4, 7] *= 40.0
        y = linear._QuantLinearFunction.apply(x, weight, None, specs, QuantState(), "l", torch.bfloat16, {}, True)
        saved = y.grad_fn.saved_tensors[0].dtype
        dx, dw = torch.autograd.grad(y.float().square().sum(), (x, weight))
        monkeypatch.undo()
        return [y, dx, dw], calls, saved

    (shared, calls, saved), (own, none, saved_own) = run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(shared, own))
    assert calls == [("bf16", (30, 64)), (30, 48)] and none == []  # X with its cast, then dY
    assert saved == torch.bfloat16 and saved_own == torch.float32


def test_an_evaluation_forward_and_a_held_amax_take_nothing_together(monkeypatch):
    # under no_grad no backward will quantize Xᵀ; a state holding fprop.x's amax (an evaluation
    # replaying amaxes) quantizes X with it, so X's amaxes are not taken at all
    specs = load_recipe("nvfp4").linear_specs(0, LAYERS)
    calls = _counting_shared_amaxes(monkeypatch)
    lin = _layer(specs, bias=False)
    with torch.no_grad():
        lin(torch.randn(4, 20, 64))
    assert calls == []

    class HoldingX(QuantState):
        def held_amax(self, key, scaling):
            return torch.tensor(7.0) if key == "l.fprop.x" else super().held_amax(key, scaling)

    lin.attach(specs, HoldingX())
    lin(torch.randn(4, 20, 64, requires_grad=True)).sum().backward()
    assert calls == [(80, 48)]  # dY's pair only
