import os

import pytest
import torch

# Without CUDA, Triton kernels run in Triton's interpreter. The variable must be set before
# anything imports triton (megatron-core does, and the kernels read it when they are defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
