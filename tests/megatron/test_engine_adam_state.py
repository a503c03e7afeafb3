"""The zero AdamW state the megatron engine gives a fresh optimizer before loading a checkpoint
into it (megatron-core needs a step in it to build the state dict to load into) is the state
torch's AdamW creates at its first step: an optimizer given it steps exactly as a fresh one. And
the switch to fused AdamW (``train.fused_kernels``) of the AdamW that megatron-core builds."""

import copy
from types import SimpleNamespace

import torch

from fp4repro.megatron.engine import _give_adam_a_state, _use_fused_adamw


def test_a_fresh_adamw_given_the_zero_state_steps_as_a_fresh_one():
    gen = torch.Generator().manual_seed(20240601)
    start = [torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen)]
    grads = [[torch.randn_like(p, generator=gen) for p in start] for _ in range(3)]
    params = {name: [torch.nn.Parameter(p.clone()) for p in start] for name in ("fresh", "given")}
    adams = {name: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1) for name, ps in params.items()}

    _give_adam_a_state(SimpleNamespace(optimizer=adams["given"]))
    assert all(float(s["step"]) == 0 for s in adams["given"].state.values()) and len(adams["given"].state) == 2
    for step_grads in grads:
        for name, adam in adams.items():
            for p, g in zip(params[name], step_grads):
                p.grad = g.clone()
            adam.step()
    for fresh, given in zip(params["fresh"], params["given"]):
        assert torch.equal(fresh, given)


def _adamw_steps(adam, params, grads) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        adam.step()


def test_the_adamw_megatron_builds_steps_as_torchs_fused_adamw_once_switched():
    # megatron-core builds torch.optim.AdamW without `fused`; the engine's switch sets it in the
    # param groups, before the first step (a new run) or after steps (a loaded checkpoint's state,
    # whose steps it keeps; on a GPU fused AdamW needs them float32 on the parameter's device, which
    # test_train_gpu.py's resumed runs with fused kernels exercise)
    gen = torch.Generator().manual_seed(20261206)
    start = [torch.randn(64, 32, generator=gen), torch.randn(32, generator=gen), torch.randn(128, 64, generator=gen)]
    grads = [[torch.randn_like(p, generator=gen) for p in start] for _ in range(4)]
    params = {name: [torch.nn.Parameter(p.clone()) for p in start] for name in ("fused", "switched", "plain")}
    adams = {name: torch.optim.AdamW(params[name], lr=1e-2, weight_decay=0.1) for name in ("switched", "plain")}
    adams["fused"] = torch.optim.AdamW(params["fused"], lr=1e-2, weight_decay=0.1, fused=True)
    _use_fused_adamw(SimpleNamespace(optimizer=adams["switched"]))
    assert adams["switched"].param_groups[0]["fused"] is True and adams["switched"].param_groups[0]["foreach"] is False
    for name, adam in adams.items():
        _adamw_steps(adam, params[name], grads)
    assert all(torch.equal(s, f) for s, f in zip(params["switched"], params["fused"]))
    assert any(not torch.equal(s, p) for s, p in zip(params["switched"], params["plain"]))  # another kernel

    # switched after a step of the default kernels: it goes on as a fused AdamW loading that state
    resumed = [torch.nn.Parameter(p.clone()) for p in start]
    later = [torch.nn.Parameter(p.clone()) for p in start]
    adam = torch.optim.AdamW(resumed, lr=1e-2, weight_decay=0.1)
    _adamw_steps(adam, resumed, grads[:1])
    with torch.no_grad():
        for p, q in zip(later, resumed):
            p.copy_(q)
    loading = torch.optim.AdamW(later, lr=1e-2, weight_decay=0.1, fused=True)
    state = copy.deepcopy(adam.state_dict())  # (its tensors are the optimizer's own)
    state["param_groups"] = loading.state_dict()["param_groups"]
    loading.load_state_dict(state)
    _use_fused_adamw(SimpleNamespace(optimizer=adam))
    assert all(float(s["step"]) == 1 for s in adam.state.values())
    _adamw_steps(adam, resumed, grads[1:])
    _adamw_steps(loading, later, grads[1:])
    assert all(torch.equal(r, q) for r, q in zip(resumed, later))
