import pytest
import torch
import yaml

from fp4repro.config.files import PACKAGED
from fp4repro.config.model import ModelConfig, ModelConfigError, load_model_config
from fp4repro.model import NemotronH

MODEL_CONFIG_DIR = PACKAGED / "models"


def count_on_meta(config: ModelConfig, **kwargs) -> int:
    with torch.device("meta"):
        return NemotronH(config).num_parameters(**kwargs)


def count_by_formula(config: ModelConfig, include_embeddings: bool = True) -> int:
    """The parameters of a config, term by term from its sizes (no module built)."""
    c = config
    d, di, g, n, h, k = (
        c.hidden_size,
        c.mamba_d_inner,
        c.mamba_groups,
        c.mamba_state_size,
        c.mamba_heads,
        c.mamba_conv_kernel,
    )
    conv_dim = di + 2 * g * n
    mamba = d * (2 * di + 2 * g * n + h) + conv_dim * k + conv_dim + 3 * h + di + di * d
    attention = d * (c.attn_heads + 2 * c.attn_kv_heads) * c.attn_head_dim + c.attn_heads * c.attn_head_dim * d
    mlp = 2 * d * c.mlp_hidden_size
    layers = {"M": mamba, "*": attention, "-": mlp}
    body = sum(layers[t] + d for t in c.pattern) + d  # each layer's pre-norm, the final norm
    return body + (2 * c.vocab_size * d if include_embeddings else 0)


def test_nemotron_h_8b_parameter_count_is_exact():
    config = load_model_config("nemotron_h_8b")
    assert config.n_layers == 52
    assert (config.pattern.count("M"), config.pattern.count("*"), config.pattern.count("-")) == (24, 4, 24)
    assert count_on_meta(config) == count_by_formula(config) == 8_100_852_736


def test_the_papers_8b_has_4_kv_heads_chunk_256_and_112_separate_linears():
    """The authors' Nemotron-H 8B: NVIDIA's with 4 KV heads, Mamba chunks of 256 and separate q/k/v."""
    paper, nvidia = load_model_config("nemotron_h_8b_paper"), load_model_config("nemotron_h_8b")
    changed = {k: v for k, v in paper.to_dict().items() if v != nvidia.to_dict()[k]}
    assert changed == {"name": "nemotron_h_8b_paper", "attn_kv_heads": 4, "mamba_chunk_size": 256, "qkv": "separate"}
    assert count_by_formula(paper) == 8_084_075_520
    linears = [name for names in paper.layer_linears for name in names]
    assert len(linears) == 112  # 24 Mamba x 2, 4 attention x 4, 24 MLP x 2: every FP4-eligible linear
    assert linears.count("q_proj") == linears.count("k_proj") == linears.count("v_proj") == 4
    assert "qkv_proj" not in linears and sum(map(len, nvidia.layer_linears)) == 104


def test_small_and_tiny_sizes_and_layer_mix():
    small, tiny = load_model_config("small"), load_model_config("tiny")
    assert 100e6 <= count_on_meta(small) <= 150e6
    assert 0.8e6 <= count_on_meta(tiny) <= 1.3e6
    assert 1500 <= tiny.vocab_size <= 4096
    for config in (small, tiny):
        assert set(config.pattern) == {"M", "*", "-"}


@pytest.mark.parametrize("qkv", ["fused", "separate"])
def test_parameter_count_formula(make_config, qkv):
    """Count of one layer of each type, term by term, against the built modules (separate q/k/v
    have the fused projection's parameters)."""
    c = make_config(pattern="M*-", qkv=qkv)
    model = NemotronH(c)
    assert model.num_parameters(include_embeddings=False) == count_by_formula(c, include_embeddings=False)
    assert model.num_parameters() == count_by_formula(c)


def test_mamba_state_dict_keys_follow_mamba_ssm(make_config):
    model = NemotronH(make_config(pattern="M"))
    keys = {k.removeprefix("layers.0.mixer.") for k in model.state_dict() if k.startswith("layers.0.mixer.")}
    assert keys == {
        "in_proj.weight",
        "conv1d.weight",
        "conv1d.bias",
        "dt_bias",
        "A_log",
        "D",
        "norm.weight",
        "out_proj.weight",
    }


@pytest.mark.parametrize("name", ["nemotron_h_8b", "nemotron_h_8b_paper", "small", "tiny"])
def test_shipped_configs_round_trip(name):
    config = load_model_config(name)
    assert config.name == name
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert load_model_config(MODEL_CONFIG_DIR / f"{name}.yaml") == config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(pattern="M-X*"), "pattern = 'M-X*'"),
        (dict(pattern=""), "pattern = ''"),
        (dict(attn_kv_heads=3), "attn_kv_heads = 3: must divide attn_heads = 4"),
        (dict(mamba_groups=3), "mamba_groups = 3: must divide mamba_heads = 8"),
        (dict(hidden_size=0), "hidden_size = 0: must be >= 1"),
        (dict(hidden_size=True), "hidden_size = True: must be of type int"),
        (dict(norm_eps="1e-5"), "norm_eps = '1e-5': must be of type float"),
        (dict(rope=True, attn_head_dim=7), "attn_head_dim = 7: must be even when rope is true"),
        (dict(qkv="split"), "qkv = 'split': must be one of fused, separate"),
    ],
)
def test_invalid_values_name_field_value_and_rule(make_config, overrides, message):
    with pytest.raises(ModelConfigError, match=message.replace("*", r"\*")):
        make_config(**overrides)


def test_unknown_and_missing_fields_list_allowed_fields(tmp_path):
    data = yaml.safe_load((MODEL_CONFIG_DIR / "tiny.yaml").read_text())
    data["hiden_size"] = data.pop("hidden_size")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ModelConfigError) as err:
        load_model_config(path)
    text = str(err.value)
    assert "hiden_size: unknown field" in text
    assert "hidden_size: missing (required)" in text
    assert "allowed fields:" in text


def test_unknown_name_lists_available_configs():
    with pytest.raises(ModelConfigError, match="available: .*tiny"):
        load_model_config("no_such_model")
