"""The BF16 split kernel against the torch reference (fp4repro.reference.split), bit for bit, on
random and adversarial inputs (without CUDA in Triton's interpreter, as the other kernel tests)."""

import zlib

import pytest
import torch

from fp4repro.kernels import split_bf16_triton
from fp4repro.quant.ops import reference_only, split_bf16
from fp4repro.reference.split import split_bf16_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

#: values a split must get right: RNE ties at BF16 (1 + 2⁻⁸ to even 1, 1 + 3·2⁻⁸ to even 1 + 2⁻⁶),
#: one float32 ulp either side of a tie, signed zeros, float32 and BF16 subnormals, the largest
#: float32, and the binade below which the split stops being exact
ADVERSARIAL = [
    1.0 + 2**-8,
    1.0 + 3 * 2**-8,
    -(1.0 + 2**-8),
    1.0 + 2**-8 + 2**-23,
    1.0 + 2**-8 - 2**-23,
    0.0,
    -0.0,
    2.0**-149,
    2.0**-130 * 1.5,
    2.0**-110 * (1 + 2**-23),
    3.4028234663852886e38,
    -3.4028234663852886e38,
    2.0**-126 * (1 - 2**-23),
]


def _gradient(n: int, name: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-120, 120, (n,), generator=g).float())
    k = min(n, len(ADVERSARIAL))
    x[:k] = torch.tensor(ADVERSARIAL[:k])
    return x


def _same(got, want) -> bool:
    """Every piece bit for bit, but any NaN for a NaN (their payloads are not part of the contract:
    the largest float32 rounds up to inf, and inf − inf is a NaN of either sign)."""
    for a, b in zip(got, want):
        a, b = a.cpu(), b.cpu()
        nan = b.isnan()
        if not (torch.equal(a.isnan(), nan) and torch.equal(a[~nan].view(torch.int16), b[~nan].view(torch.int16))):
            return False
    return True


@pytest.mark.parametrize("shape", [(4096 * 3,), (4096 + 13,), (37, 257), (5,)], ids=str)
def test_the_kernel_equals_the_reference_bit_for_bit(shape):
    g = _gradient(int(torch.tensor(shape).prod()), f"split {shape}").reshape(shape).to(DEVICE)
    got, want = split_bf16_triton(g), split_bf16_reference(g)
    assert all(p.shape == g.shape and p.dtype == torch.bfloat16 for p in got)
    assert _same(got, want)


def test_non_finite_entries_give_non_finite_pieces_where_the_reference_does():
    g = torch.tensor([float("inf"), -float("inf"), float("nan"), 1.0, 3e38], device=DEVICE)
    assert _same(split_bf16_triton(g), split_bf16_reference(g))


def test_the_front_takes_the_kernel_only_where_it_applies():
    g = _gradient(64, "front").reshape(8, 8).to(DEVICE)
    if DEVICE == "cuda":  # CPU tensors take the reference, which is what the kernel equals anyway
        assert _same(split_bf16(g), split_bf16_triton(g))
    with reference_only():
        assert _same(split_bf16(g.t()), split_bf16_reference(g.t()))
    with pytest.raises(TypeError, match="contiguous float32"):
        split_bf16_triton(g.t())
    with pytest.raises(TypeError, match="float32"):
        split_bf16(g.double())


@pytest.mark.gpu
def test_on_a_gpu_the_kernel_equals_the_reference_at_a_logits_gradients_size():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    g = _gradient(16384 * 4096, "split on gpu").reshape(16384, 4096).cuda()
    assert _same(split_bf16_triton(g), split_bf16_reference(g))
