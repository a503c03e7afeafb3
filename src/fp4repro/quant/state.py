"""Run-wide quantization state: held amaxes of periodic tensor scaling, automatic targets, and
telemetry.

One ``QuantState`` per model, shared by all its QuantLinears, keyed by "<layer>.<operand>".
The training loop calls ``advance()`` after every optimizer step and turns telemetry on for
the steps it wants recorded; ``state_dict()`` goes into checkpoints so a resumed run holds the
same amaxes and targets.

Automatic target (``QuantSpec.auto_target``): between refreshes each quantization of an operand
max-folds the live amax of what it quantized (a by-product of its block amaxes) into the
operand's live slots (``live_slots``), so that the interval's growth G_k = max(live / held) =
max(live) / held (the held amax is fixed within the interval, and rounding a quotient is
monotone) costs no launch between refreshes (1 at the refresh itself). At the next refresh,
before the fresh sample is used, T = clamp(scale_max / (safety · max(G over the last ``window``
intervals)), min, max) (``choose_target``); until the first interval has ended, T = min. The
growth is reduced with ``reduce_max`` before it is read (identity in one process; a distributed
backend sets it to a MAX all-reduce so that every rank chooses the same T).

Stochastic rounding draws its random bits from a seed that names what is rounded
(``sr_seed``): the run's seed, the operand's key, the step and the how-manieth quantization of
that key in the step. Not from a generator shared by every quantization: then the bits of one
operand would depend on how many quantizations ran before it, which differs between the two
backends (megatron's autograd visits the layers in its own order), between pipeline schedules,
and between a run and its resume.
"""

from __future__ import annotations

import contextlib
import zlib
from dataclasses import asdict

import torch

from fp4repro.config.spec import AutoTarget, QuantSpec, TensorScaling
from fp4repro.formats import get_format
from fp4repro.kernels import fold_live_amax, live_slots, live_slots_amax
from fp4repro.quant.stats import DeviceStats, read_stats
from fp4repro.reference.block import OperandStats


def chosen_target(growth: float, auto: AutoTarget, scale_max: float) -> float:
    """T = clamp(scale_max / (safety · growth), min, max) in float64: the largest T whose headroom
    scale_max / T covers ``safety`` times the growth (``AutoTarget``)."""
    return min(max(scale_max / (auto.safety * growth), float(auto.min)), float(auto.max))


class QuantState:
    def __init__(self, seed: int = 0) -> None:
        self.seed = seed  # the run's seed: stochastic rounding's bits derive from it
        self.step = 0  # optimizer steps taken
        self.telemetry = False  # record OperandStats on the next quantizations
        self._held: dict[str, torch.Tensor] = {}
        self._held_at: dict[str, int] = {}
        self._held_host: dict[str, float] = {}  # the held values read back once, for GEMM epilogues
        self._records: list[tuple[dict, OperandStats | DeviceStats, float]] = []  # (row head, stats, T)
        self._live: dict[str, torch.Tensor] = {}  # this interval's running live amax (slots), on the device
        self._growths: dict[str, list[float]] = {}  # G of the last ``window`` finished intervals
        self._target: dict[str, float] = {}  # the automatic T in use
        # MAX reduction across the ranks that hold the same tensors (None: one process) of an
        # automatic target's growth and of each periodic refresh's fresh amax, so that every rank
        # holds the same
        self.reduce_max = None
        self._sr_draws: dict[str, int] = {}  # SR quantizations of each key in this step

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
        """The held amax of ``key`` as a Python float, cached: the first key asked for after a
        sample reads every held amax not yet read, in one transfer (one synchronization per
        refresh, not one per operand: a refresh samples all of a model's operands at once)."""
        value = self._held_host.get(key)
        if value is None:
            unread = [k for k in self._held if k not in self._held_host]
            values = torch.stack([self._held[k].reshape(()).to(self._held[key].device) for k in unread])
            self._held_host.update(zip(unread, values.to(torch.float64).tolist()))
            value = self._held_host[key]
        return value

    # ------------------------------------------------------------------ automatic target T
    def target(self, key: str, spec: QuantSpec) -> float | None:
        """The T to quantize ``key`` with: the spec's own, or its automatic one (``auto_target.min``
        until ``choose_target`` has chosen another)."""
        if spec.auto_target is None:
            return spec.target
        return self._target.get(key, float(spec.auto_target.min))

    def live_slots(self, key: str, device) -> torch.Tensor:
        """The running live-amax slots of ``key``'s current interval, made (zeros) at its first
        quantization after a refresh: a quantization max-folds its live amax into them."""
        slots = self._live.get(key)
        if slots is None:
            slots = self._live[key] = live_slots(device)
        return slots

    def _interval_growth(self, key: str) -> torch.Tensor | None:
        """max(live) / held of the interval that ends (None: nothing seen after its refresh); a
        held amax of 0 that has since seen a non-zero tensor is infinite growth (next T: ``min``)."""
        slots = self._live.pop(key, None)
        if slots is None:
            return None
        live, held = live_slots_amax(slots), self._held[key].to(slots.device)
        return torch.where(held > 0, live / held, torch.where(live > 0, torch.inf, 1.0))

    def choose_target(self, key: str, spec: QuantSpec) -> float:
        """At a refresh of ``key`` (its held amax is due for a fresh sample, which has not been
        taken yet): close the interval that ends, its growth G_k (1 if nothing but its first
        step was seen), and choose the next T from the last ``window`` intervals. The first
        sample of ``key`` closes nothing. Reads the growth once (one synchronization per refresh)."""
        auto = spec.auto_target
        growth = self._interval_growth(key) if key in self._held else None
        if key in self._held_at:
            if growth is not None and self.reduce_max is not None:
                growth = self.reduce_max(growth)
            growths = self._growths.setdefault(key, [])
            growths.append(1.0 if growth is None else max(1.0, float(growth)))
            del growths[: -auto.window]
            self._target[key] = chosen_target(max(growths), auto, get_format(spec.scale).max)
        return self.target(key, spec)

    # ------------------------------------------------------------------ per-sequence activations
    def sequence_lengths(self, batch: int, width: int) -> tuple[int, ...] | None:
        """Valid lengths of the ``batch`` sequences (``width`` positions each, padding after them)
        whose activation operand (fprop.x) the forward quantizes sequence by sequence, each as its
        own tensor with its current amax, padding rows as one group of their own
        (``QuantLinear``); None: the operand is one tensor. Training: always None. The inference
        policy's state, which holds no amax, overrides this (``CurrentAmaxState``)."""
        return None

    def advance(self) -> None:
        """Call once per optimizer step."""
        self.step += 1
        self._sr_draws = {}

    def restart_step(self, step: int) -> None:
        """Count refresh phases and SR draws as at the start of ``step`` again (a redo of it,
        with the amaxes it held): its quantizations draw the same SR seeds."""
        self.step = step
        self._sr_draws = {}

    # ---------------------------------------------------------------------- stochastic rounding
    def sr_seed(self, key: str) -> int:
        """The seed of the next stochastic rounding of ``key``: crc32 of "<run seed>/<key>/<step>/<n>"
        for its n-th SR quantization in this step (a 32-bit value: the Philox key of the kernels,
        or the seed of the reference's generator)."""
        n = self._sr_draws.get(key, 0)
        self._sr_draws[key] = n + 1
        return zlib.crc32(f"{self.seed}/{key}/{self.step}/{n}".encode())

    def steps_since_refresh(self, key: str) -> int:
        """Optimizer steps since ``key``'s held amax was sampled: 0 at a refresh step (held ==
        current), up to interval - 1 before the next; 0 for an operand that holds no amax."""
        return self.step - self._held_at[key] if key in self._held_at else 0

    # ------------------------------------------------------------------------------ telemetry
    def record(self, layer: str, operand: str, stats: OperandStats | DeviceStats, target: float | None = None) -> None:
        """One telemetry row: the quantization's stats, its refresh phase and the T it used. A
        kernel's ``DeviceStats`` stay on the device until ``pop_telemetry`` reads them all."""
        head = {
            "step": self.step,
            "layer": layer,
            "operand": operand,
            "steps_since_refresh": self.steps_since_refresh(f"{layer}.{operand}"),
        }
        self._records.append((head, stats, float("nan") if target is None else float(target)))

    def last_stats(self, layer: str, operand: str) -> OperandStats | DeviceStats:
        """The stats of the latest record of ``layer``.``operand`` in this step (searched from the
        end: it is usually the record just made)."""
        for head, stats, _ in reversed(self._records):
            if head["layer"] == layer and head["operand"] == operand:
                return stats
        raise KeyError(f"no telemetry record of {layer}.{operand} since the last pop_telemetry()")

    def pop_telemetry(self) -> list[dict]:
        """Records collected since the last call (one dict per layer × operand × quantization);
        the device's counters are read here, in one transfer (``read_stats``)."""
        records, self._records = self._records, []
        read = read_stats([stats for _, stats, _ in records])
        return [
            {**head, **asdict(stats), "rel_error": stats.rel_error, "target": target}
            for (head, _, target), stats in zip(records, read)
        ]

    # ----------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        return {
            "seed": self.seed,
            "step": self.step,
            "held": {k: v.cpu() for k, v in self._held.items()},
            "held_at": dict(self._held_at),
            "live": {k: live_slots_amax(v).cpu() for k, v in self._live.items()},
            "growths": {k: list(v) for k, v in self._growths.items()},
            "target": dict(self._target),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.seed = int(state.get("seed", self.seed))
        self._sr_draws = {}
        self._held = {k: v.clone() for k, v in state["held"].items()}
        self._held_at = {k: int(v) for k, v in state["held_at"].items()}
        self._held_host = {}
        # automatic targets (absent from checkpoints of runs without them); ``to`` moves them with the held amaxes
        self._live = {}
        for key, amax in state.get("live", {}).items():
            fold_live_amax(self.live_slots(key, amax.device), amax)
        self._growths = {k: [float(g) for g in v] for k, v in state.get("growths", {}).items()}
        self._target = {k: float(v) for k, v in state.get("target", {}).items()}

    def to(self, device) -> QuantState:
        self._held = {k: v.to(device) for k, v in self._held.items()}
        self._live = {k: v.to(device) for k, v in self._live.items()}
        return self


class CurrentAmaxState(QuantState):
    """A QuantState that never holds an amax: every quantization uses the tensor's current amax
    (the evaluation's quantized inference policy builds its models with it).

    It also quantizes the activations (fprop.x) of each sequence of the batch as their own tensor
    (``fp4repro.quant.linear.sequence_operand``): ``sequence_lengths`` answers the valid lengths
    that the scorer set for the current forward (``with state.sequences(lengths):``), or, when
    none are set, that every row is a sequence of the full width. The weights keep one amax: they
    do not depend on the batch.

    An automatic target (``QuantSpec.auto_target``) has no growth to cover with the current
    amax: its rule with G = 1 gives T = clamp(scale_max / safety, min, max) (``chosen_target``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._lengths: tuple[int, ...] | None = None

    def sequence_lengths(self, batch: int, width: int) -> tuple[int, ...]:
        if self._lengths is None:
            return (width,) * batch
        if len(self._lengths) != batch or max(self._lengths) > width:
            raise ValueError(
                f"sequence lengths {list(self._lengths)} were set for this forward, but its "
                f"batch has {batch} sequences of {width} positions"
            )
        return self._lengths

    @contextlib.contextmanager
    def sequences(self, lengths):
        """Within this block, the batch's sequences have valid ``lengths`` (padding after them)."""
        lengths = tuple(int(n) for n in lengths)
        if not lengths or min(lengths) < 0:
            raise ValueError(f"sequence lengths {list(lengths)}: need one length >= 0 per sequence")
        previous, self._lengths = self._lengths, lengths
        try:
            yield
        finally:
            self._lengths = previous

    def held_amax(self, key: str, scaling: TensorScaling) -> torch.Tensor | None:
        return None

    def target(self, key: str, spec: QuantSpec) -> float | None:
        if spec.auto_target is None:
            return spec.target
        return chosen_target(1.0, spec.auto_target, get_format(spec.scale).max)

    def hold(self, key: str, amax: torch.Tensor, scaling: TensorScaling) -> None:
        return None
