"""At which optimizer steps a run records quantization telemetry.

Every ``train.telemetry_every``-th step (0, n, 2n, ...: the study checks that these see every
phase of each amax refresh interval), and, with ``train.telemetry_at_refresh``, every step at
which a held amax is sampled: a multiple of a refresh interval K the recipe uses, so that the
fresh phase (steps since refresh 0) has a sample in every interval, not only where the cadence
meets it. The loop records at these steps; ``fp4repro verify`` expects a committed run's
telemetry at them.
"""

from __future__ import annotations

from fp4repro.config.study import Study, refresh_intervals


def refresh_steps_of(study: Study, recipe: str) -> frozenset[int]:
    """The refresh intervals whose sampling steps get telemetry besides the cadence: those the
    recipe uses on the study's model, where the experiment asks for it; none otherwise."""
    if not study.experiment.train.telemetry_at_refresh:
        return frozenset()
    return frozenset(refresh_intervals(study.recipe(recipe), study.model))


def samples_amax(step: int, refresh_intervals_: frozenset[int] | set[int]) -> bool:
    """Whether optimizer step ``step`` (0-based) samples a fresh held amax: a multiple of one of
    the refresh intervals (the amax is sampled at step 0 and every K steps after)."""
    return any(step % k == 0 for k in refresh_intervals_)


def is_telemetry_step(step: int, every: int, refresh_intervals_: frozenset[int] = frozenset()) -> bool:
    """Whether optimizer step ``step`` (0-based) records telemetry: a multiple of ``every``, or a
    step that samples the amax of one of ``refresh_intervals_`` (``samples_amax``)."""
    return step % every == 0 or samples_amax(step, refresh_intervals_)
