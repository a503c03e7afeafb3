import pytest
import torch
import torch.nn.functional as F

from fp4repro.model import ssd_chunked, ssd_sequential


def random_inputs(batch=2, length=50, heads=6, head_dim=4, groups=3, state=5, dtype=torch.float64):
    x = torch.randn(batch, length, heads, head_dim, dtype=dtype)
    dt = F.softplus(torch.randn(batch, length, heads, dtype=dtype) - 1.0)
    A = -torch.empty(heads, dtype=dtype).uniform_(0.5, 4.0)
    B = torch.randn(batch, length, groups, state, dtype=dtype)
    C = torch.randn(batch, length, groups, state, dtype=dtype)
    D = torch.randn(heads, dtype=dtype)
    return x, dt, A, B, C, D


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 25, 50, 64])
def test_chunked_equals_sequential_scan_in_float64(chunk_size):
    """Chunk sizes that divide the length 50 and ones that don't (7, 16, 64 > length)."""
    x, dt, A, B, C, D = random_inputs()
    initial = torch.randn(2, 6, 4, 5, dtype=torch.float64)
    y_ref, state_ref = ssd_sequential(x, dt, A, B, C, D, initial_state=initial)
    y, state = ssd_chunked(x, dt, A, B, C, chunk_size, D, initial_state=initial)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, state_ref, rtol=1e-10, atol=1e-10)


def test_float32_inputs_stay_close_to_the_float64_scan():
    x, dt, A, B, C, D = random_inputs(length=200, heads=4, groups=1, state=16)
    y_ref, _ = ssd_sequential(x, dt, A, B, C, D)
    y, _ = ssd_chunked(*(t.float() for t in (x, dt, A, B, C)), 32, D.float())
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-4, atol=1e-4)


def test_heads_use_their_groups_B_and_C():
    """Heads 0, 1 read group 0 and heads 2, 3 group 1: each head run alone with its group's B and C
    must give the same output."""
    x, dt, A, B, C, D = random_inputs(heads=4, groups=2, length=20)
    y, _ = ssd_chunked(x, dt, A, B, C, 8, D)
    for head in range(4):
        group = head // 2
        sl = slice(head, head + 1)
        y_head, _ = ssd_sequential(
            x[:, :, sl], dt[:, :, sl], A[sl], B[:, :, group : group + 1], C[:, :, group : group + 1], D[sl]
        )
        torch.testing.assert_close(y[:, :, sl], y_head, rtol=1e-10, atol=1e-10)


def test_gradients_match_the_sequential_scan():
    inputs = [t.requires_grad_() for t in random_inputs(length=13, heads=2, groups=1, state=3)]
    y, _ = ssd_chunked(*inputs[:5], 4, inputs[5])
    grads = torch.autograd.grad(y.square().sum(), inputs)
    y_ref, _ = ssd_sequential(*inputs)
    grads_ref = torch.autograd.grad(y_ref.square().sum(), inputs)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9)
