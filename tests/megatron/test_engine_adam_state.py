"""The zero AdamW state the megatron engine gives a fresh optimizer before loading a checkpoint
into it (megatron-core needs a step in it to build the state dict to load into) is the state
torch's AdamW creates at its first step: an optimizer given it steps exactly as a fresh one."""

from types import SimpleNamespace

import torch

from fp4repro.megatron.engine import _give_adam_a_state


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
