"""The front that picks kernel or reference: the switch that forces the reference."""

import os
import subprocess
import sys
import threading

import pytest
import torch

from fp4repro.quant import QuantSpec, quantize, reference_only, scaled_operand
from fp4repro.quant.ops import _force_reference, uses_kernel


@pytest.fixture
def unforced():
    """The switch as it is without FP4REPRO_REFERENCE in the environment."""
    token = _force_reference.set(False)
    yield
    _force_reference.reset(token)


def test_reference_only_is_scoped_and_restored_after_an_error(unforced):
    assert not _force_reference.get()
    with reference_only():
        assert _force_reference.get()
        with reference_only():
            assert _force_reference.get()
        assert _force_reference.get()
    assert not _force_reference.get()
    with pytest.raises(RuntimeError):
        with reference_only():
            raise RuntimeError
    assert not _force_reference.get()


def test_reference_only_holds_for_this_thread_only(unforced):
    seen = []
    with reference_only():
        thread = threading.Thread(target=lambda: seen.append(_force_reference.get()))
        thread.start()
        thread.join()
    assert seen == [_force_reference.get()] == [False]


@pytest.mark.parametrize("value, forced", [("1", True), ("0", False), ("", False)])
def test_environment_variable_forces_the_reference(value, forced):
    out = subprocess.run(
        [sys.executable, "-c", "from fp4repro.quant.ops import _force_reference; print(_force_reference.get())"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "FP4REPRO_REFERENCE": value},
    ).stdout.strip()
    assert out == str(forced)


def test_cpu_tensors_take_the_reference_and_packing_needs_4_bit_elements(unforced):
    assert not uses_kernel(torch.randn(4, 32))
    with pytest.raises(ValueError, match="packed codes need a 4-bit element format, got 'e3m2'"):
        quantize(torch.randn(4, 32), QuantSpec(element="e3m2"))


@pytest.mark.gpu
def test_cuda_tensors_take_the_kernel_unless_the_reference_is_forced(unforced):
    x = torch.randn(512, 1024, device="cuda") * 3
    spec = QuantSpec(block=(16, 16), rht=True)
    assert uses_kernel(x) and not uses_kernel(x, generator=torch.Generator(device="cuda"))
    assert not uses_kernel(x, rand=torch.zeros_like(x))
    fast, d1, *_ = scaled_operand(x, spec)
    with reference_only():
        assert not uses_kernel(x)
        ref, d2, *_ = scaled_operand(x, spec)
    assert torch.equal(fast.float(), ref) and torch.equal(d1, d2)
