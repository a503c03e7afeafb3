"""A run's fingerprint and the tensor-parallel layout: with the group's amax a recipe computes the
same numbers at every tensor size, so the layout stays out of the fingerprint; with each shard's
own amax (``tp_amax: local``) the numbers depend on the split, and the tensor size enters it.
And whose run a folder holds: another recipe given the same folder is refused."""

import dataclasses
import json
import subprocess
from dataclasses import replace

import pytest

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


def test_separate_q_k_v_enter_the_fingerprint_and_fused_ones_keep_theirs():
    """A fused model's run keeps the fingerprint it had before the model config had ``qkv``."""
    study = load_study(PACKAGED / "experiment/paper8b.yaml")
    args = (study.recipe("ue5m3"), "data", study.experiment.train, 0, "megatron")
    fused, separate = replace(study.model, qkv="fused"), replace(study.model, qkv="separate")
    assert run_numerics(fused, *args)["model"] == {k: v for k, v in dataclasses.asdict(fused).items() if k != "qkv"}
    assert run_numerics(separate, *args)["model"] == dataclasses.asdict(separate)


@pytest.mark.slow
def test_a_second_recipe_given_the_same_out_is_refused_and_the_first_results_stay(guarded, tmp_path, train_command):
    # issue 42: two recipes given the same --out: the second replaced the first's top-level results
    path, _ = guarded
    short = tmp_path / "short.yaml"
    short.write_text(path.read_text().replace("tokens: 12800", "tokens: 320"))  # 10 steps
    out = tmp_path / "shared"

    def train(recipe, *extra):
        command = train_command(out, *extra)
        command[command.index("--experiment") + 1] = str(short)
        command[command.index("--recipe") + 1] = recipe
        return subprocess.run(command, capture_output=True, text=True, check=False)

    assert train("bf16").returncode == 0
    finished = {name: (out / name).read_bytes() for name in ("done.json", "metrics.parquet", "telemetry.parquet")}
    second = train("nvfp4", "--stop-after", "1")
    assert second.returncode == 1 and second.stderr.count("\n") == 1, second.stderr
    assert second.stderr.startswith(
        f"fp4repro train: error: {out}: holds the run of recipe 'bf16' seed 0 of experiment 'guarded' ("
    )
    assert "recipe 'nvfp4' seed 0 of experiment 'guarded' would replace its results" in second.stderr
    assert {name: (out / name).read_bytes() for name in finished} == finished
    assert len(list((out / "runs").iterdir())) == 1  # no run of nvfp4 was begun
    # an unfinished run (no done.json yet) names its owner in its record
    (out / "done.json").unlink()
    (record,) = (out / "runs").glob("*/run.json")
    assert json.loads(record.read_text())["owner"] == {"experiment": "guarded", "recipe": "bf16", "seed": 0}
    assert train("bf16", "--seed", "3", "--stop-after", "1").stderr.count("holds the run of recipe 'bf16' seed 0") == 1
