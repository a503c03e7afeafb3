import pytest
import torch

from fp4repro.model import ModelConfig

#: Every layer type at tiny sizes; a Mamba chunk of 8 makes short sequences span several chunks.
TEST_CONFIG = dict(name="test", pattern="M-M*-", hidden_size=32, vocab_size=64, mlp_hidden_size=64,
                   attn_heads=4, attn_kv_heads=2, attn_head_dim=8, mamba_heads=8, mamba_head_dim=8,
                   mamba_state_size=8, mamba_groups=2, mamba_conv_kernel=4, mamba_chunk_size=8)


@pytest.fixture
def make_config():
    def make(**overrides) -> ModelConfig:
        return ModelConfig(**{**TEST_CONFIG, **overrides})
    return make


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
