"""Where one training process's wall time goes, by phase, for done.json's ``process_seconds``.

    setup        from ``train`` being called to its first step: checks, data, model, engine
    first_step   the process's first optimizer step (kernels compiled into an empty Triton cache
                 land here, and autotuning)
    steps        every later step (their sum)
    checkpoints  writing evaluation checkpoints, resume checkpoints and the tables' parts
    other        the rest of the wall time (the final tables, done.json itself not counted)
    wall         the process's time from ``train`` being called to done.json (the interpreter's
                 start-up and imports before it not counted)

A resumed run's done.json holds the seconds of the process that ended it; its metrics table keeps
every step's time (``tokens_per_s``) and which process made it (``attempt``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PhaseSeconds:
    setup: float = 0.0
    first_step: float | None = None
    steps: float = 0.0
    checkpoints: float = 0.0

    def add_step(self, seconds: float) -> None:
        """One optimizer step's seconds: the first of the process apart, the others summed."""
        if self.first_step is None:
            self.first_step = seconds
        else:
            self.steps += seconds

    def record(self, wall: float) -> dict[str, float]:
        """The phases and ``wall`` in seconds (0.1 s), with ``other`` the wall time outside them."""
        phases = {
            "setup": self.setup,
            "first_step": self.first_step or 0.0,
            "steps": self.steps,
            "checkpoints": self.checkpoints,
        }
        phases["other"] = max(0.0, wall - sum(phases.values()))
        return {name: round(value, 1) for name, value in {**phases, "wall": wall}.items()}
