"""A run's fingerprint and the tensor-parallel layout: with the group's amax a recipe computes the
same numbers at every tensor size, so the layout stays out of the fingerprint; with each shard's
own amax (``tp_amax: local``) the numbers depend on the split, and the tensor size enters it."""

from dataclasses import replace

from fp4repro.config.files import PACKAGED
from fp4repro.config.study import load_study
from fp4repro.train.runs import fingerprint_of, run_numerics


def test_the_tensor_size_enters_the_fingerprint_only_with_local_amaxes():
    study = load_study(PACKAGED / "experiment/paper8b.yaml")
    parallel = study.experiment.parallel
    assert parallel.tensor == 2 and parallel.tp_amax == "group"
    args = (study.model, study.recipe("ue5m3"), "data", study.experiment.train, 0, "megatron")

    def fingerprint(**change):
        return fingerprint_of(run_numerics(*args, parallel=replace(parallel, **change)))

    one = fingerprint(tensor=1, sequence_parallel=False)
    assert fingerprint() == one == fingerprint(tensor=4)
    assert fingerprint(tp_amax="local", tensor=1, sequence_parallel=False) == one  # local = group at size 1
    local = {tp: fingerprint(tp_amax="local", tensor=tp) for tp in (2, 4)}
    assert local[2] != one and local[2] != local[4]
