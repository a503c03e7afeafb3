"""mamba-ssm's Mamba-2 Triton kernels, when they can be used.

mamba-ssm built with MAMBA_SKIP_CUDA_BUILD=TRUE is pure Python: its Mamba-2 kernels are Triton and
run on any recent GPU, but the package's ``__init__`` imports ``selective_scan_cuda``, the compiled
Mamba-1 scan, and so fails to import without it. Registering an empty module under that name lets
the import succeed; only the Mamba-1 op, which this model never calls, would then fail.
"""

from __future__ import annotations

import functools
import importlib.util  # find_spec only: whether mamba-ssm is installed, without importing it
import os
import sys
import types
import warnings
from collections.abc import Callable
from typing import NamedTuple


class MambaSSMKernels(NamedTuple):
    chunk_scan_combined: Callable  # mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined
    gated_rmsnorm: Callable  # mamba_ssm.ops.triton.layernorm_gated.rmsnorm_fn


def prepare_mamba_ssm_import() -> bool:
    """What must hold before anything imports mamba-ssm (ours and megatron-core's import alike).

    An empty ``selective_scan_cuda`` module in sys.modules if the real one cannot be imported;
    returns True if that stand-in was registered (the real extension, when importable, is always
    left in charge). And Triton asked to keep autotuning results on disk: the scan kernels
    autotune over many configs at each new shape in every new process, and Triton reads the
    setting at decoration, i.e. at mamba-ssm's import. A TRITON_CACHE_AUTOTUNING the user set
    still decides (``deterministic_mamba_ssm`` sets it off).
    """
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    try:
        import selective_scan_cuda  # noqa: F401  (imported only to see whether it imports)

        return False
    except ImportError:
        sys.modules["selective_scan_cuda"] = types.ModuleType(
            "selective_scan_cuda", "Empty stand-in for mamba-ssm's Mamba-1 CUDA extension (not built)."
        )
        return True


def deterministic_mamba_ssm() -> None:
    """mamba-ssm's deterministic mode, chosen before its import (``MAMBA_DETERMINISTIC=1``): its
    backward reductions without floating-point atomics, and one fixed launch config per Triton
    kernel, the cheapest of its list, picked at import without timing. Autotuned configs differ
    between processes, and the scan's ``tl.cumsum`` gives other bits at another block size
    (state-spaces/mamba PR 827), so two processes would compute different gradients from the same
    step. Autotuning results on disk are turned off with it (``TRITON_CACHE_AUTOTUNING=0``): with
    them mamba-ssm keeps autotuning. A warning if mamba-ssm's kernels were imported already: their
    configs were fixed then, so a run repeats in this process but not necessarily in another."""
    if os.environ.get("MAMBA_DETERMINISTIC") != "1" and "mamba_ssm.ops.triton.ssd_combined" in sys.modules:
        warnings.warn(
            "mamba-ssm was imported before deterministic mode was chosen: its kernels keep the configs "
            "this process autotuned, so the run repeats here but may not in another process",
            RuntimeWarning,
            stacklevel=2,
        )
    os.environ["MAMBA_DETERMINISTIC"] = "1"
    os.environ["TRITON_CACHE_AUTOTUNING"] = "0"


@functools.cache
def load_mamba_ssm_kernels() -> MambaSSMKernels | None:
    """The Triton SSD scan and gated RMSNorm of mamba-ssm, or None where mamba-ssm is not installed
    or does not import (a warning says why in the latter case)."""
    # find_spec, not an import: whether mamba-ssm is installed, before the stand-in it may need is registered
    if importlib.util.find_spec("mamba_ssm") is None:
        return None
    stubbed = prepare_mamba_ssm_import()
    try:
        from mamba_ssm.ops.triton.layernorm_gated import rmsnorm_fn
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as err:  # a broken install must not stop the torch fallback from running
        if stubbed:
            sys.modules.pop("selective_scan_cuda", None)
        warnings.warn(
            f"mamba-ssm is installed but its Triton kernels do not import ({err!r}); using the torch SSD instead",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return MambaSSMKernels(chunk_scan_combined=mamba_chunk_scan_combined, gated_rmsnorm=rmsnorm_fn)
