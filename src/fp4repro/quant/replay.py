"""The cold D = 50 replay: the quantized inference policy the authors evaluate their delayed-scaling
recipes with (B16, B32 and the Torch control; ``fp4repro.eval.policy``, policy ``replay``).

As the authors define it (artifact MrHuff/ue5m3-fp4, reproduce/docs/numerical_protocol.md,
"Post-load quantized inference"; src/ue5m3_fp4/nn/linear.py, the ``training_replay`` activation
mode; src/ue5m3_fp4/scaling/inference.py, its refresh rule "step == 1 or step - last_refresh_step
>= 50"):

- *cold*: the state starts empty after the checkpoint is loaded (``reset``); no held amax of the
  training run is restored and the checkpoint's step is not its starting point ("This inference
  replay does not restore the training cache and does not equate a forward batch with a training
  optimizer step").
- *weights*: each weight operand's amax is sampled once, at its first quantization after the
  reset, and frozen ("sample and freeze each unchanged weight tensor's global amax").
- *activations*: one forward of the whole model is one work unit, counted from 1 after the reset
  (``advance`` before each forward); on units 1, 51, 101, ... each linear's activation operand
  (fprop.x) samples the current amax of the whole tensor it quantizes, every row of the batch,
  and holds it until the next refresh, unit - last refresh >= ``interval`` ("Cold D=50 replay
  refreshes activations on complete forward work units 1, 51, 101, and so on, holding the sampled
  value between refreshes").

A result under it therefore depends on the batches and their order ("batch size, request order,
partial final batches, and reset boundaries are part of the experiment identity"): the evaluation
records the order of its forwards beside every result (``fp4repro.eval.order``).

Unlike the current policy (``CurrentAmaxState``), the activations of a batch are one tensor: the
authors' replay holds one amax per linear, sampled from everything the refresh forward quantized.
"""

from __future__ import annotations

import torch

from fp4repro.config.spec import QuantSpec, TensorScaling
from fp4repro.formats import get_format
from fp4repro.quant.state import QuantState, chosen_target

#: The authors' replay interval D, in forward work units (src/ue5m3_fp4/scaling/inference.py,
#: FP4_INFERENCE_TRAINING_REPLAY_INTERVAL = 50).
REPLAY_INTERVAL = 50
#: The operand whose amax the replay refreshes; every other operand (the weights) is frozen.
ACTIVATION = "fprop.x"


class ReplayAmaxState(QuantState):
    """The cold replay's state: ``step`` counts forwards since ``reset`` (the hook that
    ``fp4repro.eval.policy.build_model`` puts on the model calls ``advance`` before each), the
    activation amaxes are refreshed every ``interval`` forwards from the first, the weights'
    amaxes are held from their first sample on. ``trace`` records every sample: (forward, key,
    amax). An automatic target uses the current policy's T (its rule with growth 1)."""

    def __init__(self, interval: int = REPLAY_INTERVAL) -> None:
        if interval < 1:
            raise ValueError(f"replay interval {interval}: must be >= 1")
        super().__init__()
        self.interval = interval
        self.trace: list[tuple[int, str, float]] = []

    def reset(self) -> None:
        """Cold again: no held amax, no forward counted."""
        self.__init__(self.interval)

    def held_amax(self, key: str, scaling: TensorScaling) -> torch.Tensor | None:
        if key not in self._held:
            return None
        if key.endswith("." + ACTIVATION) and self.step - self._held_at[key] >= self.interval:
            return None
        return self._held[key]

    def hold(self, key: str, amax: torch.Tensor | None, scaling: TensorScaling) -> None:
        if amax is None:  # an operand without a tensor scale (MX): nothing to hold
            return
        self._held[key] = amax.detach().to(torch.float32)
        self._held_at[key] = self.step
        self._held_host.pop(key, None)
        self.trace.append((self.step, key, float(amax)))

    def target(self, key: str, spec: QuantSpec) -> float | None:
        if spec.auto_target is None:
            return spec.target
        return chosen_target(1.0, spec.auto_target, get_format(spec.scale).max)

    def choose_target(self, key: str, spec: QuantSpec) -> float:
        return self.target(key, spec)
