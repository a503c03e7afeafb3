"""Warmup–stable–decay learning rate over the whole multi-stage run, by optimizer step.

    lr(step) = peak · (step + 1) / W                    step < W            (linear warmup)
             = peak                                    W <= step < S - D   (stable)
             = peak · (r + (1 - r) · (S - step) / D)   step >= S - D       (linear decay to r · peak)

S = total steps over all stages, W = round(warmup_fraction · S), D = round(decay_fraction · S),
r = min_lr_ratio. The decay sits at the end of the last stage, so a stage boundary never resets it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WSDSchedule:
    peak_lr: float
    total_steps: int
    warmup_steps: int
    decay_steps: int
    min_lr_ratio: float

    @classmethod
    def from_fractions(
        cls, peak_lr: float, total_steps: int, warmup_fraction: float, decay_fraction: float, min_lr_ratio: float
    ) -> WSDSchedule:
        return cls(
            peak_lr,
            total_steps,
            round(warmup_fraction * total_steps),
            round(decay_fraction * total_steps),
            min_lr_ratio,
        )

    @classmethod
    def of(cls, train) -> WSDSchedule:
        """The schedule of an experiment's ``TrainConfig``."""
        return cls.from_fractions(
            train.lr, train.total_steps, train.warmup_fraction, train.decay_fraction, train.min_lr_ratio
        )

    def describe(self) -> str:
        """The schedule in words: 'lr 0.0008 (WSD over 30,000 steps): no warmup, the peak to step
        25,500, then a linear decay over the last 4,500 steps (15%) to 1% of the peak'."""
        warmup = f"a linear warmup over {self.warmup_steps:,} steps" if self.warmup_steps else "no warmup"
        decay = (
            f"then a linear decay over the last {self.decay_steps:,} steps "
            f"({100 * self.decay_steps / self.total_steps:.3g}%) to {100 * self.min_lr_ratio:.3g}% of the peak"
            if self.decay_steps
            else "no decay"
        )
        stable = f"the peak to step {self.total_steps - self.decay_steps:,}"
        return f"lr {self.peak_lr:g} (WSD over {self.total_steps:,} steps): {warmup}, {stable}, {decay}"

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        decay_start = self.total_steps - self.decay_steps
        if step < decay_start or self.decay_steps == 0:
            return self.peak_lr
        remaining = (self.total_steps - step) / self.decay_steps
        return self.peak_lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * remaining)
