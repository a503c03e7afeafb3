"""The session's megatron parallel state for the CPU builds of ``cpu_build``."""

import pytest
from cpu_build import build, cpu_adaptations


@pytest.fixture(scope="module")
def megatron_cpu():
    """``build``, with megatron's parallel state initialized for one process while the module runs
    (module scope: other tests must not find a process group left open)."""
    from fp4repro.config.parallel import ParallelConfig
    from fp4repro.megatron.distributed import initialize, shutdown

    cpu_adaptations()
    initialize(ParallelConfig(), batch_size=1, seed=1234)
    yield build
    shutdown()
