"""Model configuration: one frozen dataclass, loaded from `configs/models/<name>.yaml` (see
``fp4repro.config.files`` for where a name is looked up).

The layer stack is a *hybrid pattern* string with one character per layer, as in Megatron's
`hybrid_override_pattern`:

    M   Mamba-2 mixer
    *   grouped-query causal self-attention
    -   squared-ReLU MLP

Every layer is pre-norm residual: x + mixer(RMSNorm(x)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fp4repro.config.files import find_config, not_found, read_yaml
from fp4repro.errors import ConfigError

LAYER_TYPES = {"M": "mamba", "*": "attention", "-": "mlp"}
#: The internal linears of each layer type, by the names recipes use (the model's mixers take theirs).
LAYER_LINEARS = {"mamba": ("in_proj", "out_proj"), "attention": ("qkv_proj", "o_proj"), "mlp": ("fc1", "fc2")}
#: The attention's query, key and value projections of a model with ``qkv: separate`` (in place of
#: the fused ``qkv_proj``): three linears, so that each is quantized with its own amax.
SEPARATE_QKV = ("q_proj", "k_proj", "v_proj")
QKV_LAYOUTS = ("fused", "separate")


class ModelConfigError(ConfigError):
    """A model config field is missing, unknown, of the wrong type or out of range."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Nemotron-H hybrid model.

    Mamba-2 sizes follow mamba-ssm's Mamba2: d_inner = mamba_heads · mamba_head_dim, and B, C
    each have mamba_groups · mamba_state_size channels (heads of one group share B and C).
    Attention projects to attn_heads · attn_head_dim queries and attn_kv_heads · attn_head_dim
    keys and values; each KV head serves attn_heads / attn_kv_heads query heads. ``qkv``: one
    fused linear for the three (``fused``: NVIDIA's Nemotron-H, megatron-core's ``linear_qkv``) or
    three (``separate``: q_proj, k_proj, v_proj, the paper's authors' model), with the same
    parameters either way.
    """

    pattern: str
    hidden_size: int
    vocab_size: int
    mlp_hidden_size: int
    attn_heads: int
    attn_kv_heads: int
    attn_head_dim: int
    mamba_heads: int
    mamba_head_dim: int
    mamba_state_size: int
    mamba_groups: int
    mamba_conv_kernel: int
    mamba_chunk_size: int = 128
    norm_eps: float = 1e-5
    rope: bool = False
    rope_theta: float = 10000.0
    init_std: float = 0.02
    qkv: str = "fused"
    name: str = "custom"

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ModelConfigError(f"model config {self.name!r}:\n  " + "\n  ".join(problems))

    # Derived sizes -------------------------------------------------------------------------

    @property
    def n_layers(self) -> int:
        return len(self.pattern)

    @property
    def layer_types(self) -> tuple[str, ...]:
        """'mamba' | 'attention' | 'mlp' for each layer, in order."""
        return tuple(LAYER_TYPES[c] for c in self.pattern)

    @property
    def layer_linears(self) -> tuple[tuple[str, ...], ...]:
        """The names of each layer's internal linears, in order (see ``LAYER_LINEARS``; attention's
        are q_proj, k_proj, v_proj, o_proj with ``qkv: separate``)."""
        linears = dict(LAYER_LINEARS)
        if self.qkv == "separate":
            linears["attention"] = SEPARATE_QKV + ("o_proj",)
        return tuple(linears[t] for t in self.layer_types)

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the depthwise conv: x, B and C (z and dt bypass it)."""
        return self.mamba_d_inner + 2 * self.mamba_groups * self.mamba_state_size

    @property
    def mamba_in_proj_size(self) -> int:
        """Output width of in_proj: [z (d_inner) | x (d_inner) | B (G·N) | C (G·N) | dt (heads)]."""
        return 2 * self.mamba_d_inner + 2 * self.mamba_groups * self.mamba_state_size + self.mamba_heads

    @property
    def attn_qkv_size(self) -> int:
        """Output width of the fused QKV projection: [Q (heads·d) | K (kv·d) | V (kv·d)]."""
        return (self.attn_heads + 2 * self.attn_kv_heads) * self.attn_head_dim

    @property
    def tensor_split_sizes(self) -> dict[str, int]:
        """The sizes tensor parallelism splits, each into equal parts on every rank of the group:
        attention heads and KV heads (only where the pattern has attention), Mamba heads and groups
        (where it has Mamba), the MLP width (where it has an MLP)."""
        types = set(self.layer_types)
        sizes = {}
        if "attention" in types:
            sizes.update(attn_heads=self.attn_heads, attn_kv_heads=self.attn_kv_heads)
        if "mamba" in types:
            sizes.update(mamba_heads=self.mamba_heads, mamba_groups=self.mamba_groups)
        if "mlp" in types:
            sizes.update(mlp_hidden_size=self.mlp_hidden_size)
        return sizes

    # Validation -----------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Every reason this config is invalid, as 'field = value: allowed' lines (empty if valid)."""
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            expected = _FIELD_TYPES[f.name]
            if not _has_type(value, expected):
                out.append(f"{f.name} = {value!r}: must be of type {expected.__name__}")
        if out:
            return out  # range checks below assume the types are right

        bad = sorted(set(self.pattern) - set(LAYER_TYPES))
        if not self.pattern or bad:
            allowed = ", ".join(f"'{c}' ({t})" for c, t in LAYER_TYPES.items())
            out.append(f"pattern = {self.pattern!r}: must be a non-empty string of {allowed}")
        for name in (
            "hidden_size",
            "vocab_size",
            "mlp_hidden_size",
            "attn_heads",
            "attn_kv_heads",
            "attn_head_dim",
            "mamba_heads",
            "mamba_head_dim",
            "mamba_state_size",
            "mamba_groups",
            "mamba_conv_kernel",
            "mamba_chunk_size",
        ):
            if getattr(self, name) < 1:
                out.append(f"{name} = {getattr(self, name)}: must be >= 1")
        for name in ("norm_eps", "rope_theta", "init_std"):
            if not getattr(self, name) > 0:
                out.append(f"{name} = {getattr(self, name)}: must be > 0")
        if self.attn_kv_heads >= 1 and self.attn_heads % self.attn_kv_heads:
            out.append(f"attn_kv_heads = {self.attn_kv_heads}: must divide attn_heads = {self.attn_heads}")
        if self.mamba_groups >= 1 and self.mamba_heads % self.mamba_groups:
            out.append(f"mamba_groups = {self.mamba_groups}: must divide mamba_heads = {self.mamba_heads}")
        if self.qkv not in QKV_LAYOUTS:
            out.append(f"qkv = {self.qkv!r}: must be one of {', '.join(QKV_LAYOUTS)}")
        if self.rope and self.attn_head_dim % 2:
            out.append(f"attn_head_dim = {self.attn_head_dim}: must be even when rope is true")
        return out

    # Loading --------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict[str, Any], name: str | None = None) -> ModelConfig:
        if not isinstance(data, dict):
            raise ModelConfigError(f"model config {name!r}: expected a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        required = sorted(
            f.name for f in fields(cls) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        unknown = sorted(set(data) - known)
        missing = [k for k in required if k not in data]
        problems = [f"{k}: unknown field" for k in unknown] + [f"{k}: missing (required)" for k in missing]
        if problems:
            problems.append(f"allowed fields: {', '.join(sorted(known))}")
            raise ModelConfigError(f"model config {data.get('name', name)!r}:\n  " + "\n  ".join(problems))
        if name is not None and "name" not in data:
            data = {**data, "name": name}
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELD_TYPES = {
    "pattern": str,
    "name": str,
    "qkv": str,
    "rope": bool,
    "norm_eps": float,
    "rope_theta": float,
    "init_std": float,
    **{
        f: int
        for f in (
            "hidden_size",
            "vocab_size",
            "mlp_hidden_size",
            "attn_heads",
            "attn_kv_heads",
            "attn_head_dim",
            "mamba_heads",
            "mamba_head_dim",
            "mamba_state_size",
            "mamba_groups",
            "mamba_conv_kernel",
            "mamba_chunk_size",
        )
    },
}


def _has_type(value: Any, expected: type) -> bool:
    # bool is a subclass of int in Python; a YAML `true` must not pass as a size.
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, expected)


def model_config_path(name_or_path: str | Path) -> Path:
    """The file of a model config name ("tiny", "small", "nemotron_h_8b") or path."""
    return find_config("models", name_or_path)


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """Load a model config by name ("tiny", "small", "nemotron_h_8b") or from a YAML file path."""
    path = model_config_path(name_or_path)
    if not path.is_file():
        raise ModelConfigError(f"model config: {not_found('models', name_or_path)}")
    return ModelConfig.from_dict(read_yaml(path, ModelConfigError), name=path.stem)
