"""megatron-core's dataset classes, imported on first use.

Importing ``megatron.core`` takes seconds, warns about Transformer Engine, Apex and deprecated
modules (none of which data needs), and imports Triton as a side effect, which must not happen
before code that selects Triton's interpreter (``TRITON_INTERPRET``) has run. So importing
``fp4repro.data`` stays light, and megatron-core is loaded when a dataset is first written or read.
"""

from __future__ import annotations

import functools
import warnings
from types import SimpleNamespace


@functools.cache
def megatron_datasets() -> SimpleNamespace:
    """The megatron-core dataset classes data preparation and sampling use, by name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import helpers
        from megatron.core.datasets.blended_dataset import BlendedDataset
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder
        from megatron.core.datasets.utils import Split
        from megatron.core.package_info import __version__
    return SimpleNamespace(
        BlendedDataset=BlendedDataset,
        BlendedMegatronDatasetBuilder=BlendedMegatronDatasetBuilder,
        GPTDataset=GPTDataset,
        GPTDatasetConfig=GPTDatasetConfig,
        DType=DType,
        IndexedDataset=IndexedDataset,
        IndexedDatasetBuilder=IndexedDatasetBuilder,
        Split=Split,
        helpers=helpers,
        version=__version__,
    )
