"""The unquantized megatron linear under autocast (``fp4repro.megatron.main_grad_linear``) against
megatron-core's own ``linear_with_grad_accumulation_and_async_allreduce`` followed by the DDP's add
into ``main_grad``: the same output, input gradient and ``main_grad``, bit for bit."""

import warnings
import zlib

import pytest
import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # megatron-core's notes that Apex and Transformer Engine are absent
    from megatron.core.tensor_parallel.layers import linear_with_grad_accumulation_and_async_allreduce

from fp4repro.megatron.main_grad_linear import linear_into_main_grad, takes

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _operands(device: str, shape=(37, 2, 96, 80)):
    """[sequence, batch, in] input, [out, in] weight, a float32 main_grad holding an earlier
    micro-batch's sum, the loss's weights; values over several binades, so that the BF16 casts and
    the float32 add round."""
    s, b, k, n = shape
    g = torch.Generator().manual_seed(zlib.crc32(b"main_grad_linear"))

    def spread(*size):
        return torch.randn(*size, generator=g) * 2.0 ** torch.randint(-6, 6, size, generator=g)

    tensors = (spread(s, b, k), spread(n, k) * 0.05, spread(n, k), torch.randn(s, b, n, generator=g))
    return [t.to(device) for t in tensors]


def _step(linear, device: str, ddp: bool = True):
    """One forward and backward of ``linear(x, w)`` under BF16 autocast (the backward inside it, as
    megatron's CPU path needs: its backward casts under the autocast of the forward's device), and
    the main_grad the DDP's hook leaves: its own add of ``w.grad`` unless the linear added it."""
    x0, w0, main_grad, r = _operands(device)
    x = x0.clone().requires_grad_()
    w = torch.nn.Parameter(w0.clone())
    if ddp:  # what megatron's DDP gives each parameter
        w.main_grad, w.grad_added_to_main_grad = main_grad.clone(), False
    with torch.autocast(device, dtype=torch.bfloat16):
        y = linear(x, w)
        (y.float() * r).sum().backward()
    if not ddp:
        return y, x.grad, w.grad
    added = w.main_grad if w.grad_added_to_main_grad else w.main_grad + w.grad
    return y, x.grad, added


def _megatrons(x, w):
    return linear_with_grad_accumulation_and_async_allreduce(x, w, None, False, False, False)


def _ours(x, w):
    return linear_into_main_grad(x, w, lambda t: t)


@pytest.mark.parametrize("device", DEVICES)
def test_output_input_gradient_and_main_grad_equal_megatrons_bit_for_bit(device):
    expected, got = _step(_megatrons, device), _step(_ours, device)
    for name, a, b in zip(("output", "input gradient", "main_grad"), expected, got, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    # the main_grad moved: the add happened, and it was not a float32 product's (BF16's rounding kept)
    start = _operands(device)[2]
    assert not torch.equal(got[2], start)


def test_the_ddp_hook_is_told_the_gradient_is_in_main_grad():
    x0, w0, main_grad, r = _operands("cpu")
    w = torch.nn.Parameter(w0.clone())
    w.main_grad, w.grad_added_to_main_grad = main_grad.clone(), False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (linear_into_main_grad(x0, w, lambda t: t).float() * r).sum().backward()
    assert w.grad_added_to_main_grad is True
    assert w.grad is not None and w.grad.shape == w.shape and w.grad.dtype == torch.float32  # the placeholder


def test_without_ddp_the_weight_gradient_is_megatrons():
    expected, got = _step(_megatrons, "cpu", ddp=False), _step(_ours, "cpu", ddp=False)
    for a, b in zip(expected, got, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_it_takes_only_what_it_computes_as_megatron_does():
    x, w = torch.zeros(4, 1, 8), torch.nn.Parameter(torch.zeros(6, 8))
    assert not takes(x, w, None, None)  # no autocast: megatron's FP32 path
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert takes(x, w, None, None)
        assert not takes(x, w, torch.zeros(6), None)  # a bias megatron adds in float32
        assert not takes(x, w, None, [torch.zeros(1)])  # megatron's deferred weight gradients
        assert not takes(x, torch.nn.Parameter(torch.zeros(6, 8), requires_grad=False), None, None)
        assert not takes(x, torch.nn.Parameter(torch.zeros(6, 8, dtype=torch.bfloat16)), None, None)
