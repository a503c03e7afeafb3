import importlib.util
import sys

import pytest

from fp4repro.model import _mamba_ssm


def test_stub_is_registered_only_where_the_extension_is_missing(monkeypatch):
    monkeypatch.delitem(sys.modules, "selective_scan_cuda", raising=False)
    if importlib.util.find_spec("selective_scan_cuda") is not None:
        assert _mamba_ssm.prepare_mamba_ssm_import() is False
        assert getattr(sys.modules["selective_scan_cuda"], "__file__", None)
    else:
        assert _mamba_ssm.prepare_mamba_ssm_import() is True
        stub = sys.modules["selective_scan_cuda"]
        assert not hasattr(stub, "fwd") and getattr(stub, "__file__", None) is None


@pytest.mark.skipif(importlib.util.find_spec("mamba_ssm") is not None, reason="mamba-ssm is installed")
def test_without_mamba_ssm_there_are_no_kernels_and_no_stub(monkeypatch):
    monkeypatch.delitem(sys.modules, "selective_scan_cuda", raising=False)
    _mamba_ssm.load_mamba_ssm_kernels.cache_clear()
    assert _mamba_ssm.load_mamba_ssm_kernels() is None
    assert "selective_scan_cuda" not in sys.modules


@pytest.mark.gpu
def test_the_scan_kernels_keep_their_autotuning_on_disk(monkeypatch):
    """Each new process would otherwise autotune the scan again at every new shape."""
    if importlib.util.find_spec("mamba_ssm") is None:
        pytest.skip("mamba-ssm is not installed")
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    for name in [m for m in sys.modules if m.startswith("mamba_ssm")]:
        monkeypatch.delitem(sys.modules, name)
    _mamba_ssm.load_mamba_ssm_kernels.cache_clear()
    assert _mamba_ssm.load_mamba_ssm_kernels() is not None
    from mamba_ssm.ops.triton.ssd_chunk_state import _chunk_cumsum_fwd_kernel

    assert _chunk_cumsum_fwd_kernel.cache_results
    _mamba_ssm.load_mamba_ssm_kernels.cache_clear()
