"""fp4repro.util's atomic writers on a full disk (issue 42: `fp4repro plot` on a full disk ended in
a zlib.error traceback, never saying "disk full")."""

import errno
import os
import zlib

import pytest
import torch

from fp4repro.errors import DiskFullError
from fp4repro.util import atomic_path


def _writer_failing_on_a_full_disk():
    """What a PNG writer does on a full disk: its write fails with ENOSPC, and it raises another error
    while handling that one (zlib.error)."""
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise zlib.error("Error -2 while flushing: inconsistent stream state") from None  # its __context__ stays


def test_a_writer_that_fails_on_a_full_disk_with_another_error_is_a_full_disk_and_the_old_file_stays(tmp_path):
    out = tmp_path / "loss.png"
    out.write_bytes(b"old")
    with pytest.raises(DiskFullError, match=rf"^disk full writing {out}; [\d,]+ bytes free; nothing was replaced$"):
        with atomic_path(out) as tmp:
            tmp.write_bytes(b"half a figure")
            _writer_failing_on_a_full_disk()
    assert out.read_bytes() == b"old" and list(tmp_path.iterdir()) == [out]
    with pytest.raises(zlib.error, match="corrupt"):  # not a full disk: the writer's error as it was
        with atomic_path(out):
            raise zlib.error("corrupt")
    assert list(tmp_path.iterdir()) == [out]


def test_deterministic_mode_puts_inductor_in_its_deterministic_mode_too(monkeypatch):
    # the compiled norms of train.fused_kernels: inductor must not pick a reduction's config by
    # timing it, or two processes of one run could sum in other orders
    import torch._inductor.config as inductor

    from fp4repro.util import deterministic_algorithms

    monkeypatch.delenv("TORCHINDUCTOR_DETERMINISTIC", raising=False)
    # set and restored by hand, not by a patching helper: inductor's config is no plain module (its
    # values are context variables, and an entry once deleted is hidden from later compilations)
    was, inductor.deterministic = inductor.deterministic, False
    try:
        deterministic_algorithms()
        assert os.environ["TORCHINDUCTOR_DETERMINISTIC"] == "1" and inductor.deterministic is True
    finally:
        inductor.deterministic = was
        torch.use_deterministic_algorithms(False)
