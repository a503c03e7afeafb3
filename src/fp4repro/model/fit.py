"""Whether a state dict fits the reference model of a config: the check both an evaluation
checkpoint and a run's starting weights (``--init-from``) go through before any compute."""

from __future__ import annotations

import torch

from fp4repro.config.model import ModelConfig
from fp4repro.model.nemotron_h import NemotronH


def state_dict_mismatch(state_dict: dict, config: ModelConfig) -> list[str]:
    """Why ``state_dict`` does not fit the reference model of ``config`` (empty list: it fits):
    missing keys, unexpected keys, shapes that differ. The model is built on the meta device, so
    this costs no memory for large configs."""
    with torch.device("meta"):
        expected = NemotronH(config).state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    problems = []
    if missing:
        problems.append(f"missing keys {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {_few(unexpected)}")
    for key in sorted(set(expected) & set(state_dict)):
        want, got = tuple(expected[key].shape), tuple(state_dict[key].shape)
        if want != got:
            problems.append(f"{key}: shape {got} in the checkpoint, {want} in the model")
    return problems


def _few(items: list[str], n: int = 4) -> str:
    shown = ", ".join(items[:n])
    return f"[{shown}{', …' if len(items) > n else ''}] ({len(items)})"
