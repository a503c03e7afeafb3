import torch

from fp4repro.reference.rht import TE_SIGNS, hadamard_matrix, inverse_rht, rht, rht_matrix


def test_te_sign_vector():
    assert TE_SIGNS == (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def test_matrix_is_orthogonal_and_sylvester():
    h = hadamard_matrix()
    assert torch.equal(h @ h.T, 16 * torch.eye(16))
    assert torch.equal(h[:8, :8], h[8:, :8]) and torch.equal(h[8:, 8:], -h[:8, :8])
    r = rht_matrix()
    assert torch.equal(r @ r.T, torch.eye(16))


def test_butterfly_equals_matrix_product():
    x = torch.randn(7, 48, dtype=torch.float64)
    expected = (x.reshape(-1, 16) @ rht_matrix().double()).reshape(7, 48)
    got = rht(x.float()).double()
    assert torch.allclose(got, expected, rtol=0, atol=4e-7 * x.abs().max().item())


def test_inverse_and_gemm_invariance():
    a, b = torch.randn(5, 64), torch.randn(3, 64)
    assert torch.allclose(inverse_rht(rht(a)), a, atol=1e-6)
    assert torch.allclose(rht(a) @ rht(b).T, a @ b.T, atol=1e-4)


def test_spreads_an_outlier():
    x = torch.zeros(1, 16)
    x[0, 5] = 8.0
    y = rht(x)
    assert torch.equal(y.abs(), torch.full((1, 16), 2.0))
