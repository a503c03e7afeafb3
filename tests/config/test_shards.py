"""A recipe's blocks must tile every tensor-parallel shard (each segment of a fused projection too)."""

import pytest

from fp4repro.config.model import load_model_config
from fp4repro.config.parallel import ParallelConfig
from fp4repro.config.recipe import load_recipe
from fp4repro.config.shards import rank_parts, shard_problems, split_index


def test_the_8b_model_at_its_published_tensor_size_tiles_for_every_recipe():
    model = load_model_config("nemotron_h_8b")
    for recipe in ("nvfp4", "ue5m3", "ue5m3_t448", "ue5m3_b32", "ue5m3_te_settings", "mxfp4", "bf16"):
        assert shard_problems(model, load_recipe(recipe), ParallelConfig(tensor=2)) == []


def test_the_pieces_of_a_rank_follow_the_fused_layouts():
    model = load_model_config("nemotron_h_8b")
    dim, parts = rank_parts(model, "in_proj", 8)
    assert dim == "N" and list(parts.values()) == [8192 // 8, 8192 // 8, 1024 // 8, 1024 // 8, 128 // 8]
    assert rank_parts(model, "qkv_proj", 8) == (
        "N",
        {"queries of a KV group (4 x 128)": 512, "key of a KV group (128)": 128},
    )
    assert rank_parts(model, "o_proj", 8) == ("K", {"heads (32 x 128 / 8)": 512})


def test_a_split_that_cuts_blocks_is_named_with_operand_segment_and_sizes():
    model = load_model_config("nemotron_h_8b")
    # at TP 8 each rank holds 16 of Mamba's dt columns: MXFP4's 32-wide blocks along N straddle them
    problems = shard_problems(model, load_recipe("mxfp4"), ParallelConfig(tensor=8))
    assert {p.field for p in problems} == {"parallel.tensor"} and {p.value for p in problems} == {8}
    assert [p.allowed for p in problems] == [
        f"recipe 'mxfp4' quantizes {operand} of in_proj (first in layer 0) in blocks of 32 along N, and a rank's "
        "piece of it, dt (128 / 8) = 16, is not a whole number of blocks: the split would change the blocks"
        for operand in ("dgrad.dy", "dgrad.w")
    ]
    assert shard_problems(model, load_recipe("nvfp4"), ParallelConfig(tensor=8)) == []


def test_an_experiment_whose_split_cuts_blocks_fails_to_load_naming_file_and_field(tmp_path, make_config):
    import yaml

    from fp4repro.config.experiment import ExperimentError
    from fp4repro.config.study import load_study

    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**make_config(vocab_size=512).to_dict(), "name": "m"}))
    path = tmp_path / "exp.yaml"
    path.write_text(
        f"name: e\nmodel: {tmp_path / 'm.yaml'}\nrecipes: [bf16, nvfp4]\nbackend: megatron\n"
        "parallel: {tensor: 2}\ndata: {sources: {prose: {kind: stdlib_prose}}, tokenizer: {vocab_size: 512}}\n"
        "train: {seq_len: 64, batch_size: 4, stages: [{name: s, tokens: 2560, blend: {prose: 1.0}}]}\n"
    )
    with pytest.raises(ExperimentError) as err:
        load_study(path)
    message = str(err.value)
    assert (
        message.startswith(f"{path}: field 'parallel.tensor': value 2: recipe 'nvfp4' quantizes fprop.w of in_proj")
        and "B (16 / 2) = 8" in message
        and "field 'recipes.1'" in message
    )


def test_a_ranks_indices_split_each_segment_of_in_proj_and_the_others_in_one_part():
    from fp4repro.config.model import ModelConfig

    config = ModelConfig(
        name="m",
        pattern="M*-",
        hidden_size=64,
        vocab_size=64,
        mlp_hidden_size=128,
        attn_heads=4,
        attn_kv_heads=2,
        attn_head_dim=16,
        mamba_heads=8,
        mamba_head_dim=8,
        mamba_state_size=16,
        mamba_groups=2,
        mamba_conv_kernel=4,
        mamba_chunk_size=16,
    )
    # in_proj rows: z 0-63, x 64-127, B 128-159, C 160-191, dt 192-199; rank 1 of 2 holds the
    # second half of each
    assert split_index(config, "in_proj", 2, 1) == [
        *range(32, 64),
        *range(96, 128),
        *range(144, 160),
        *range(176, 192),
        *range(196, 200),
    ]
    # QKV rows (4 query heads + 2 keys + 2 values, 16 each, grouped by KV group): whole groups
    assert split_index(config, "qkv_proj", 2, 0) == list(range(64))
    assert split_index(config, "fc2", 2, 1) == list(range(64, 128))
    assert split_index(config, "o_proj", 1, 0) == list(range(64))
