"""The unquantized megatron linear under autocast (``fp4repro.megatron.main_grad_linear``) against
megatron-core's own ``linear_with_grad_accumulation_and_async_allreduce`` followed by the DDP's add
into ``main_grad``: the same output, input gradient and ``main_grad``, bit for bit."""

import warnings
import zlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


class _GEMMs(TorchDispatchMode):
    """The matrix products torch runs while it is active."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default):
            self.seen.append(func)
        return func(*args, **(kwargs or {}))


def _laid_out_batch_first(t: torch.Tensor) -> torch.Tensor:
    """A [s, 1, d] tensor's values as a view of a [1, s, d] one (strides d, s x d, 1): contiguous,
    yet a layout torch.matmul does not fold into one GEMM."""
    return t.squeeze(1)[None].transpose(0, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_first_layout_is_one_gemm_per_product_and_megatrons_numbers(device):
    # batch 1, as the Mamba mixer's "l b d -> b l d" of its in_proj output sends the gradient back:
    # torch.matmul runs one single-row GEMM per token for it unless its second operand requires
    # grad (megatron's cast weight does, the copy kept here does not)
    x0, w0, main_grad, r = _operands(device, shape=(37, 1, 96, 80))

    def step(linear):
        x = _laid_out_batch_first(x0).detach().requires_grad_()
        w = torch.nn.Parameter(w0.clone())
        w.main_grad, w.grad_added_to_main_grad = main_grad.clone(), False
        with _GEMMs() as gemms, torch.autocast(device, dtype=torch.bfloat16):
            y = linear(x, w)
            (y.float() * _laid_out_batch_first(r)).sum().backward()  # the gradient comes back batch-first
        added = w.main_grad if w.grad_added_to_main_grad else w.main_grad + w.grad
        return gemms.seen, y, x.grad, added

    gemms, *ours = step(_ours)
    assert gemms == [torch.ops.aten.mm.default] * 3  # Y, dX and dW, each one GEMM
    _, *megatrons = step(_megatrons)
    for name, a, b in zip(("output", "input gradient", "main_grad"), megatrons, ours, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_the_output_may_be_changed_in_place_as_megatrons_may():
    # a custom function's output that is a view of something it made may not be changed in place
    # while grad is recorded: the output must be a tensor of its own, as torch.matmul's is
    x0, w0, _, r = _operands("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear_into_main_grad(x0.clone().requires_grad_(), torch.nn.Parameter(w0.clone()), lambda t: t)
        (y.mul_(2.0).float() * r).sum().backward()


def test_the_tensor_parallel_mapping_sees_the_input_and_reduces_its_gradient_in_bf16():
    # megatron's function returns its input gradient in BF16 and reduces it over the tensor group
    # there (autograd casts it to a float32 input's dtype after): the mapping must sit after the cast
    seen = []

    class Mapping(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            seen.append(("input", t.dtype))
            return t.view_as(t)

        @staticmethod
        def backward(ctx, grad):
            seen.append(("gradient", grad.dtype))
            return grad

    x0, w0, _, r = _operands("cpu")
    x = x0.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (linear_into_main_grad(x, torch.nn.Parameter(w0.clone()), Mapping.apply).float() * r).sum().backward()
    assert seen == [("input", torch.bfloat16), ("gradient", torch.bfloat16)]
    assert x.grad.dtype == torch.float32


def test_an_unquantized_megatron_linear_under_autocast_takes_this_path(megatron_cpu):
    from fp4repro.config.model import load_model_config

    model = megatron_cpu(load_model_config("tiny"))
    for name in ("decoder.layers.1.mlp.linear_fc1", "decoder.layers.1.mlp.linear_fc2"):
        linear = model.get_submodule(name)  # no recipe attached: BF16, megatron's GEMM
        x0, _, _, _ = _operands("cpu", shape=(37, 2, linear.weight.shape[1], linear.weight.shape[0]))
        w = linear.weight
        w.main_grad, w.grad_added_to_main_grad = torch.zeros_like(w), False
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, _ = linear(x)
            y.float().sum().backward()
        assert w.grad_added_to_main_grad is True, name  # megatron's own function would leave it False
        xm = x0.clone().requires_grad_()
        wm = torch.nn.Parameter(w.detach().clone())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ym = linear_with_grad_accumulation_and_async_allreduce(xm, wm, None, False, False, False)
            ym.float().sum().backward()
        assert torch.equal(y, ym) and torch.equal(x.grad, xm.grad) and torch.equal(w.main_grad, wm.grad), name


def test_it_takes_only_what_it_computes_as_megatron_does():
    x, w = torch.zeros(4, 1, 8), torch.nn.Parameter(torch.zeros(6, 8))
    assert not takes(x, w, None, False, None)  # no autocast: megatron's FP32 path
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert takes(x, w, None, False, None)
        assert not takes(x, w, torch.zeros(6), False, None)  # a bias megatron adds in float32
        assert not takes(x, w, None, True, None)  # sequence parallelism: megatron gathers again
        assert not takes(x, w, None, False, [])  # megatron's deferred weight gradients, none yet
        assert not takes(x, torch.nn.Parameter(torch.zeros(6, 8), requires_grad=False), None, False, None)
        assert not takes(x, torch.nn.Parameter(torch.zeros(6, 8, dtype=torch.bfloat16)), None, False, None)
        w.zero_out_wgrad = True  # megatron returns a zero weight gradient for it
        assert not takes(x, w, None, False, None)
