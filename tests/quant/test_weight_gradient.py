"""Where a weight gradient goes (``fp4repro.quant.weight_gradient``): back to autograd, or into
megatron's ``main_grad`` under its protocol, with autograd's and the DDP hook's numbers; and the
quantized linear's weight gradient taking that way."""

from __future__ import annotations

import zlib

import torch

from fp4repro.config.recipe import load_recipe
from fp4repro.quant import QuantState
from fp4repro.quant.linear import quantized_linear
from fp4repro.quant.weight_gradient import weight_gradient


def _generator(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def _weight_and_grads(name: str):
    g = _generator(name)
    weight = torch.nn.Parameter(torch.randn(48, 64, generator=g))
    dw = torch.randn(48, 64, generator=g).to(torch.bfloat16)
    earlier = torch.randn(48, 64, generator=g)  # main_grad holding an earlier micro-batch's gradient
    return weight, dw, earlier


def test_without_main_grad_the_gradient_goes_back_in_the_weights_dtype():
    weight, dw, _ = _weight_and_grads("no main_grad")
    out = weight_gradient(weight, dw)
    assert out.dtype == torch.float32 and torch.equal(out, dw.float())


def test_under_megatrons_protocol_the_gradient_is_added_into_main_grad_as_the_hook_would():
    weight, dw, earlier = _weight_and_grads("protocol")
    weight.main_grad, weight.grad_added_to_main_grad = earlier.clone(), False
    out = weight_gradient(weight, dw)
    # the DDP hook's numbers: main_grad += grad, grad = float32(dW) as autograd gives it
    assert torch.equal(weight.main_grad, earlier + dw.float())
    assert weight.grad_added_to_main_grad is True  # the hook skips its add
    assert out is not None and out.shape == weight.shape  # a placeholder, so that the hook runs
    # a main_grad without the flag: added, and nothing back to autograd
    plain = torch.nn.Parameter(weight.detach().clone())
    plain.main_grad = earlier.clone()
    assert weight_gradient(plain, dw) is None and torch.equal(plain.main_grad, earlier + dw.float())


def test_the_quantized_linears_weight_gradient_goes_into_main_grad_with_autograds_numbers():
    specs = load_recipe("ue5m3").linear_specs(0, (("fc1", "fc2"),))
    assert specs is not None and specs.any_quantized
    g = _generator("quantized linear")
    x = torch.randn(2, 32, 64, generator=g)
    w0 = torch.randn(48, 64, generator=g) * 0.05
    dy = torch.randn(2, 32, 48, generator=g)
    earlier = torch.randn(48, 64, generator=g)

    def backward(weight):
        # a fresh state each time: the same amaxes, and the same SR seed draws from torch's generator
        torch.manual_seed(zlib.crc32(b"sr"))
        y = quantized_linear(x, weight, None, specs, QuantState(), "fc1")
        y.backward(dy)

    autograds = torch.nn.Parameter(w0.clone())
    backward(autograds)
    ddp = torch.nn.Parameter(w0.clone())
    ddp.main_grad, ddp.grad_added_to_main_grad = earlier.clone(), False
    backward(ddp)
    assert ddp.grad_added_to_main_grad is True
    assert torch.equal(ddp.main_grad, earlier + autograds.grad)
    assert not torch.equal(autograds.grad, torch.zeros_like(w0))
