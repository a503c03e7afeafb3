import importlib.util
import os
import sys
import types

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


def test_deterministic_mode_is_chosen_by_environment_before_mamba_ssm_imports(monkeypatch):
    """mamba-ssm fixes its kernels' configs at import: its deterministic mode must be in the
    environment then, with autotuning results on disk off (with them it keeps autotuning)."""
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    monkeypatch.delenv("MAMBA_DETERMINISTIC", raising=False)
    monkeypatch.delitem(sys.modules, "mamba_ssm.ops.triton.ssd_combined", raising=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing imported yet: no warning
        _mamba_ssm.deterministic_mamba_ssm()
    assert (os.environ["MAMBA_DETERMINISTIC"], os.environ["TRITON_CACHE_AUTOTUNING"]) == ("1", "0")


def test_deterministic_mode_chosen_after_the_import_warns(monkeypatch):
    monkeypatch.delenv("MAMBA_DETERMINISTIC", raising=False)
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.triton.ssd_combined", types.ModuleType("imported"))
    with pytest.warns(RuntimeWarning, match="imported before deterministic mode"):
        _mamba_ssm.deterministic_mamba_ssm()


@pytest.mark.gpu
def test_in_deterministic_mode_each_scan_kernel_has_one_config(monkeypatch):
    """One config chosen without timing, the same in every process (not one autotuned per process)."""
    if importlib.util.find_spec("mamba_ssm") is None:
        pytest.skip("mamba-ssm is not installed")
    monkeypatch.delenv("MAMBA_DETERMINISTIC", raising=False)
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    for name in [m for m in sys.modules if m.startswith("mamba_ssm")]:
        monkeypatch.delitem(sys.modules, name)
    _mamba_ssm.deterministic_mamba_ssm()
    _mamba_ssm.load_mamba_ssm_kernels.cache_clear()
    assert _mamba_ssm.load_mamba_ssm_kernels() is not None
    from mamba_ssm.ops.triton import ssd_chunk_scan, ssd_chunk_state

    for kernel in (ssd_chunk_state._chunk_cumsum_fwd_kernel, ssd_chunk_scan._chunk_scan_bwd_dx_kernel):
        assert len(kernel.configs) == 1
    for name in [m for m in sys.modules if m.startswith("mamba_ssm")]:  # the next test imports it afresh
        monkeypatch.delitem(sys.modules, name)
    _mamba_ssm.load_mamba_ssm_kernels.cache_clear()
