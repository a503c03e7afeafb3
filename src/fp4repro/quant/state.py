"""Run-wide quantization state: held amaxes of periodic tensor scaling, and telemetry.

One ``QuantState`` per model, shared by all its QuantLinears, keyed by "<layer>.<operand>".
The training loop calls ``advance()`` after every optimizer step and turns telemetry on for
the steps it wants recorded; ``state_dict()`` goes into checkpoints so a resumed run holds the
same amaxes.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from fp4repro.config.spec import TensorScaling
from fp4repro.reference.block import OperandStats


class QuantState:
    def __init__(self) -> None:
        self.step = 0                      # optimizer steps taken
        self.telemetry = False             # record OperandStats on the next quantizations
        self._held: dict[str, torch.Tensor] = {}
        self._held_at: dict[str, int] = {}
        self._held_host: dict[str, float] = {}   # the held values read back once, for GEMM epilogues
        self._records: list[dict] = []

    # ------------------------------------------------------------------ periodic tensor scaling
    def held_amax(self, key: str, scaling: TensorScaling) -> torch.Tensor | None:
        """The amax to quantize ``key`` with, or None when the current amax must be used
        (current scaling, the first sight of ``key``, or ``interval`` steps since its last sample)."""
        if scaling.kind == "current" or key not in self._held:
            return None
        if self.step - self._held_at[key] >= scaling.interval:
            return None
        return self._held[key]

    def hold(self, key: str, amax: torch.Tensor, scaling: TensorScaling) -> None:
        """Remember the amax just sampled for ``key`` (periodic scaling only)."""
        if scaling.kind == "periodic":
            self._held[key] = amax.detach().to(torch.float32)
            self._held_at[key] = self.step
            self._held_host.pop(key, None)

    def held_amax_value(self, key: str) -> float:
        """The held amax of ``key`` as a Python float: read from the device the first time it is
        asked for after a sample (one synchronization per refresh), then cached."""
        value = self._held_host.get(key)
        if value is None:
            value = self._held_host[key] = float(self._held[key])
        return value

    # ------------------------------------------------------------------ per-sequence activations
    def sequence_lengths(self, batch: int, width: int) -> tuple[int, ...] | None:
        """Valid lengths of the ``batch`` sequences (``width`` positions each, padding after them)
        whose activation operand (fprop.x) the forward quantizes sequence by sequence, each as its
        own tensor with its current amax, padding rows as one group of their own
        (``QuantLinear``); None: the operand is one tensor. Training: always None. The inference
        policy's state, which holds no amax, overrides this (``fp4repro.eval.policy.CurrentAmaxState``)."""
        return None

    def advance(self) -> None:
        """Call once per optimizer step."""
        self.step += 1

    def steps_since_refresh(self, key: str) -> int:
        """Optimizer steps since ``key``'s held amax was sampled: 0 at a refresh step (held ==
        current), up to interval - 1 before the next; 0 for an operand that holds no amax."""
        return self.step - self._held_at[key] if key in self._held_at else 0

    # ------------------------------------------------------------------------------ telemetry
    def record(self, layer: str, operand: str, stats: OperandStats) -> None:
        row = {"step": self.step, "layer": layer, "operand": operand,
               "steps_since_refresh": self.steps_since_refresh(f"{layer}.{operand}"), **asdict(stats)}
        row["rel_error"] = stats.rel_error
        self._records.append(row)

    def pop_telemetry(self) -> list[dict]:
        """Records collected since the last call (one dict per layer × operand × quantization)."""
        rows, self._records = self._records, []
        return rows

    # ----------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        return {"step": self.step, "held": {k: v.cpu() for k, v in self._held.items()},
                "held_at": dict(self._held_at)}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self._held = {k: v.clone() for k, v in state["held"].items()}
        self._held_at = {k: int(v) for k, v in state["held_at"].items()}
        self._held_host = {}

    def to(self, device) -> "QuantState":
        self._held = {k: v.to(device) for k, v in self._held.items()}
        return self
