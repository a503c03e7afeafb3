"""The error type of evaluation."""

from __future__ import annotations

from fp4repro.errors import FP4ReproError


class EvalError(FP4ReproError):
    """An evaluation that cannot run (a checkpoint, a training run or a task that does not fit);
    the message says what and why."""
