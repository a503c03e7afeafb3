"""Which steps record telemetry: the cadence, and every amax sample where the experiment asks."""

from dataclasses import replace

from fp4repro.config.study import load_study
from fp4repro.train.cadence import is_telemetry_step, refresh_steps_of


def test_the_cadence_alone_records_every_nth_step():
    assert [s for s in range(30) if is_telemetry_step(s, 11)] == [0, 11, 22]


def test_telemetry_at_refresh_adds_each_amax_sample():
    # the small study's choice at 1,500 steps: every 11th step and every 50th (the held amax's samples)
    steps = [s for s in range(1500) if is_telemetry_step(s, 11, frozenset({50}))]
    fresh = [s for s in steps if s % 50 == 0]
    assert fresh == list(range(0, 1500, 50)) and len(steps) == 137 + 30 - 3  # 0, 550 and 1100 are both
    assert {s % 50 for s in steps} == set(range(50))  # and every phase of the hold is still seen


def test_the_intervals_come_from_the_recipe_and_only_where_asked():
    study = load_study("tiny")
    assert refresh_steps_of(study, "ue5m3") == frozenset()  # tiny does not ask
    asked = load_study(replace(study.experiment, train=replace(study.experiment.train, telemetry_at_refresh=True)))
    assert refresh_steps_of(asked, "ue5m3") == frozenset({50})  # the authors' D = 50 hold
    assert refresh_steps_of(asked, "nvfp4") == frozenset()  # current amax: nothing held
    assert refresh_steps_of(asked, "bf16") == frozenset()
