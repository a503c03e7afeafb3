"""``evaluate`` end to end: NLL and lm-eval tables, resume, and failures before any work."""

import json
import math
import re

import pandas as pd
import pytest
import yaml

from fp4repro.cli import main
from fp4repro.config.eval import EvalConfigError
from fp4repro.config.model import load_model_config
from fp4repro.config.study import load_study
from fp4repro.data import load_manifest, validation_tokens
from fp4repro.eval import EvalError, evaluate, load_eval_model, stream_nll
from fp4repro.eval import run as run_module
from fp4repro.results import table_provenance

STEPS = (6, 12)  # the checkpoints of conftest's runs


@pytest.fixture(scope="module")
def evaluated(prepared, runs):
    """The nvfp4 run evaluated once (both policies, NLL and the three offline aggregates)."""
    exp, path, results = prepared
    evaluate_main(str(path), "nvfp4", results=results, progress=False)
    return results / exp.name / "eval" / "nvfp4" / "seed0"


def evaluate_main(path: str, recipe: str, **kwargs):
    """What `fp4repro evaluate --experiment PATH --recipe RECIPE` runs."""
    return evaluate(load_study(path), recipe, **kwargs)


def test_every_output_records_its_provenance(evaluated):
    for table in ("nll.parquet", "downstream.parquet"):
        assert table_provenance(evaluated / table)["device"].startswith("cpu")
    assert json.loads((evaluated / "final_loss.json").read_text())["provenance"]["packages"]["lm-eval"]


def test_the_evaluation_records_where_its_time_went(evaluated):
    seconds = json.loads((evaluated / "seconds.json").read_text())
    assert seconds["evaluated"] == len(STEPS) * 2  # checkpoints x policies (bf16, quantized)
    assert min(seconds[p] for p in ("setup", "nll", "downstream")) > 0 and seconds["load"] >= 0  # 0.1 s resolution
    parts = ("setup", "load", "nll", "downstream", "other")
    assert sum(seconds[p] for p in parts) == pytest.approx(seconds["wall"], abs=0.3)
    assert seconds["provenance"]["device"].startswith("cpu")


def test_nll_table(evaluated):
    nll = pd.read_parquet(evaluated / "nll.parquet")
    assert list(nll.columns) == [
        "recipe",
        "seed",
        "step",
        "tokens",
        "policy",
        "source",
        "nll",
        "tokens_evaluated",
        "order",
    ]
    assert len(nll) == len(STEPS) * 2 * 3
    assert set(nll["source"]) == {"prose", "code", "blend"} and set(nll["policy"]) == {"bf16", "quantized"}
    assert (nll["tokens_evaluated"] > 0).all() and nll["nll"].between(0, 20).all()
    row = nll.set_index(["step", "policy", "source"])["nll"]
    for step in STEPS:  # blend = final stage's weights (prose 0.4, code 0.6)
        for policy in ("bf16", "quantized"):
            assert row[step, policy, "blend"] == pytest.approx(
                0.4 * row[step, policy, "prose"] + 0.6 * row[step, policy, "code"]
            )
    assert (row.xs("bf16", level="policy") != row.xs("quantized", level="policy")).all()


def test_each_checkpoint_is_scored_with_its_own_weights(prepared, runs, evaluated):
    """The NLL rows of every checkpoint and policy equal those of a model loaded afresh from that
    checkpoint (the evaluation builds one model per policy and swaps the weights in)."""
    exp, path, results = prepared
    study = load_study(str(path))
    manifest = load_manifest(results / exp.name / "data")
    nll = pd.read_parquet(evaluated / "nll.parquet").set_index(["step", "policy", "source"])["nll"]
    train = study.experiment.train
    for rel in json.loads((runs["nvfp4"] / "done.json").read_text())["checkpoints"]:
        for policy in ("bf16", "quantized"):
            model, meta = load_eval_model(runs["nvfp4"] / rel, policy)
            fresh = stream_nll(
                model,
                validation_tokens(manifest, "code"),
                train.seq_len,
                study.experiment.eval.batch_size,
                study.experiment.eval.nll_max_tokens,
            )
            assert nll[meta["step"], policy, "code"] == pytest.approx(fresh.nll, rel=1e-12)


def test_document_rows_add_up_to_each_sources_nll(evaluated):
    """nll_documents.parquet: one row per source and document; per source, its sums are the NLL
    row's total (the paired bootstrap resamples exactly what the NLL row reports)."""
    docs = pd.read_parquet(evaluated / "nll_documents.parquet")
    nll = pd.read_parquet(evaluated / "nll.parquet")
    assert list(docs.columns) == [
        "recipe",
        "seed",
        "step",
        "tokens",
        "policy",
        "source",
        "document",
        "nll_sum",
        "predicted",
        "order",
    ]
    assert not docs.duplicated(["step", "policy", "source", "document"]).any()
    assert (docs["predicted"] > 0).all()
    sums = docs.groupby(["step", "policy", "source"])[["nll_sum", "predicted"]].sum()
    sources = nll[nll["source"] != "blend"].set_index(["step", "policy", "source"])
    assert len(sums) == len(sources) == len(STEPS) * 2 * 2
    for key, row in sources.iterrows():
        assert sums.loc[key, "predicted"] == row["tokens_evaluated"]
        assert sums.loc[key, "nll_sum"] / sums.loc[key, "predicted"] == pytest.approx(row["nll"], rel=1e-9)
    assert docs.groupby("source")["document"].nunique()["prose"] > 1  # the stream is split at EODs


def test_three_offline_aggregates_with_standard_errors(evaluated):
    down = pd.read_parquet(evaluated / "downstream.parquet")
    agg = down[(down["level"] == "aggregate") & (down["metric"] == "acc")]
    assert set(agg["task"]) == {"prose_next_line", "code_next_line", "cloze"}
    assert len(agg) == 3 * len(STEPS) * 2
    assert agg["value"].between(0, 1).all()
    assert (agg["stderr"] > 0).all() and agg["stderr"].map(math.isfinite).all()
    tasks = down[(down["level"] == "task") & (down["metric"] == "acc")]
    assert set(tasks["task"]) == {f"fp4repro_{s}_{k}" for s in ("prose", "code") for k in ("next_line", "cloze")}
    assert (tasks["n"] == 4).all()
    assert set(tasks.loc[tasks["task"] == "fp4repro_code_cloze", "aggregate"]) == {"cloze"}


def test_final_window_loss(evaluated):
    summary = json.loads((evaluated / "final_loss.json").read_text())
    assert summary["recipe"] == "nvfp4" and summary["final_window"] == 0.25
    assert (summary["first_step"], summary["last_step"]) == (10, 12)
    assert summary["loss"] == pytest.approx(8.0 - 0.25 * 11)


def test_rerun_skips_what_is_there(prepared, evaluated, monkeypatch):
    exp, path, results = prepared
    before = {name: (evaluated / name).read_bytes() for name in ("nll.parquet", "downstream.parquet")}

    def must_not_load(*args, **kwargs):
        raise AssertionError("a finished checkpoint x policy was evaluated again")

    monkeypatch.setattr(run_module, "load_eval_model", must_not_load)
    evaluate_main(str(path), "nvfp4", results=results, progress=False)
    assert {name: (evaluated / name).read_bytes() for name in before} == before


def test_only_missing_rows_are_computed(prepared, runs, tmp_path, capsys):
    exp, path, results = prepared
    out = results / exp.name / "eval" / "bf16" / "seed0"
    evaluate_main(str(path), "bf16", results=results, downstream=False, progress=False)
    full = pd.read_parquet(out / "nll.parquet")
    full[full["step"] != STEPS[0]].to_parquet(out / "nll.parquet", index=False)  # as if interrupted
    capsys.readouterr()
    evaluate_main(str(path), "bf16", results=results, downstream=False, progress=True)
    # the log says where the time of each checkpoint x policy computed went, and only of those
    timed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    assert [t.split(":")[0] for t in timed] == [f"step {STEPS[0]} bf16", f"step {STEPS[0]} quantized"]
    assert all(re.search(r": load \d+\.\d s, nll \d+\.\d s$", t) for t in timed)
    again = pd.read_parquet(out / "nll.parquet")
    pd.testing.assert_frame_equal(again, full)
    by_policy = again.set_index(["step", "source", "policy"])["nll"].unstack("policy")
    assert (by_policy["bf16"] == by_policy["quantized"]).all()  # bf16 recipe: identical policies


def test_unknown_task_fails_before_any_work(prepared, runs, helpers, tmp_path):
    exp, _, results = prepared
    path = helpers["write_experiment"](tmp_path, eval={"tasks": {"commonsense": ["hellaswagg", "piqa"]}})
    with pytest.raises(EvalError, match=r"lm-eval does not know task\(s\) 'hellaswagg' \(did you mean .*hellaswag"):
        evaluate_main(str(path), "ue5m3", results=results, progress=False)
    assert not (results / exp.name / "eval" / "ue5m3").exists()


def test_bad_eval_config_fails_with_the_field(prepared, helpers, tmp_path):
    _, _, results = prepared
    write_experiment = helpers["write_experiment"]
    path = write_experiment(tmp_path, eval={"policies": ["bf16", "fp8"]})
    with pytest.raises(EvalConfigError, match=r"field 'eval.policies': value \['bf16', 'fp8'\]"):
        evaluate_main(str(path), "ue5m3", results=results, progress=False)
    path = write_experiment(tmp_path, eval={"task": {}})
    with pytest.raises(EvalConfigError, match=r"unknown field\(s\) \['task'\]"):
        evaluate_main(str(path), "ue5m3", results=results, progress=False)


def test_mismatched_checkpoint_fails_before_any_work(prepared, helpers, tmp_path):
    """An experiment whose model is a wider tiny model, with checkpoints of the tiny one."""
    exp, _, results = prepared
    wide = tmp_path / "tiny_wide.yaml"
    wide.write_text(yaml.safe_dump({**load_model_config("tiny").to_dict(), "hidden_size": 256}))
    path = helpers["write_experiment"](tmp_path, name="widemodel", model=str(wide))
    helpers["make_run"](results, "widemodel", "ue5m3", steps=(1,))
    (results / "widemodel" / "data").symlink_to(results / exp.name / "data")
    with pytest.raises(EvalError, match=f"written for model config 'tiny', but the experiment's model is '{wide}'"):
        evaluate_main(str(path), "ue5m3", results=results, progress=False)
    assert not (results / "widemodel" / "eval").exists()


def test_unfinished_run_is_refused(prepared, tmp_path):
    _, path, _ = prepared
    with pytest.raises(EvalError, match="has not finished"):
        evaluate_main(str(path), "ue5m3", results=tmp_path, progress=False)


def test_a_policy_that_quantizes_nothing_is_not_computed_twice(prepared, runs, tmp_path, monkeypatch):
    """The bf16 recipe's quantized policy is its bf16 model: one NLL pass per checkpoint, two rows
    sets; an FP4 recipe's two policies are two passes."""
    exp, path, _ = prepared
    results = tmp_path / "results"
    (results / exp.name).mkdir(parents=True)
    (results / exp.name / "data").symlink_to(prepared[2] / exp.name / "data")
    for recipe in ("bf16", "ue5m3"):
        (results / exp.name / "train" / recipe).mkdir(parents=True)
        (results / exp.name / "train" / recipe / "seed0").symlink_to(runs[recipe])
    passes = []
    original = run_module.nll_rows
    monkeypatch.setattr(run_module, "nll_rows", lambda *a, **k: passes.append(a[-1]["policy"]) or original(*a, **k))
    evaluate_main(str(path), "bf16", results=results, downstream=False, progress=False)
    assert passes == ["bf16"] * len(STEPS)
    table = pd.read_parquet(results / exp.name / "eval" / "bf16" / "seed0" / "nll.parquet")
    assert sorted(set(table["policy"])) == ["bf16", "quantized"] and len(table) == 2 * len(STEPS) * 3
    passes.clear()
    evaluate_main(str(path), "ue5m3", results=results, downstream=False, progress=False)
    assert passes == ["bf16", "quantized"] * len(STEPS)


def test_item_outcomes_are_recorded_and_average_to_lm_evals_task_scores(evaluated):
    items = pd.read_parquet(evaluated / "downstream_items.parquet")
    down = pd.read_parquet(evaluated / "downstream.parquet")
    assert set(items["value"].unique()) <= {0.0, 1.0} and set(items["seed"]) == {0}
    tasks = down[(down["level"] == "task") & (down["metric"] == "acc")]
    for _, row in tasks.iterrows():
        mine = items[
            (items["task"] == row["task"])
            & (items["step"] == row["step"])
            & (items["policy"] == row["policy"])
            & (items["metric"] == "acc")
        ]
        assert len(mine) == row["n"] and sorted(mine["doc_id"]) == list(range(row["n"]))
        assert mine["value"].mean() == pytest.approx(row["value"])  # lm-eval's own task score
        # each item's held-out document, as its task file names it
        tasks_dir = evaluated.parent.parent / "tasks"
        named = [json.loads(line)["document"] for line in (tasks_dir / f"{row['task']}.jsonl").read_text().splitlines()]
        assert mine.sort_values("doc_id")["document"].tolist() == named


def test_the_replay_records_the_order_of_its_forwards_which_changes_its_result(prepared, runs, helpers, tmp_path):
    """`fp4repro evaluate --policy recipe --policy quantized`: ue5m3 evaluates under its own policy,
    the cold replay, and the current one. Every row records the order of its measure's forwards;
    another batch size (8 windows per source: one forward each, or 3 + 3 + 2) is another order,
    which changes the replay's NLL, not the current policy's."""
    exp, _, _ = prepared
    tables = {}
    for batch in (32, 3):
        folder = tmp_path / f"batch{batch}"
        results = folder / "results"
        (results / exp.name / "train" / "ue5m3").mkdir(parents=True)
        (results / exp.name / "data").symlink_to(prepared[2] / exp.name / "data")
        (results / exp.name / "train" / "ue5m3" / "seed0").symlink_to(runs["ue5m3"])
        path = helpers["write_experiment"](folder, eval={"nll_max_tokens": 512, "batch_size": batch})
        args = ["--experiment", str(path), "--recipe", "ue5m3", "--results", str(results)]
        assert (
            main(["evaluate", *args, "--no-downstream", "--quiet", "--policy", "recipe", "--policy", "quantized"]) == 0
        )
        tables[batch] = pd.read_parquet(results / exp.name / "eval" / "ue5m3" / "seed0" / "nll.parquet")
    for table in tables.values():
        assert sorted(set(table["policy"])) == ["quantized", "replay"] and len(table) == len(STEPS) * 2 * 3
        # one order per measure: every source of a checkpoint x policy, the forwards of all of them
        assert (table.groupby(["step", "policy"])["order"].nunique() == 1).all()
    wide, narrow = (t.set_index(["step", "policy", "source"]) for t in (tables[32], tables[3]))
    assert set(wide["order"].str.split(":").str[0]) == {"2"} and set(narrow["order"].str.split(":").str[0]) == {"6"}
    for step in STEPS:
        assert (wide.loc[(step, "replay"), "nll"] != narrow.loc[(step, "replay"), "nll"]).all()
        assert wide.loc[(step, "quantized"), "nll"].to_numpy() == pytest.approx(
            narrow.loc[(step, "quantized"), "nll"].to_numpy(), rel=1e-6
        )


def test_a_seed_outside_curve_seeds_is_evaluated_at_its_final_checkpoint_only(prepared, helpers, tmp_path):
    exp, _, results = prepared
    train = {**yaml.safe_load(helpers["write_experiment"](tmp_path).read_text())["train"], "seeds": [0, 1]}
    path = helpers["write_experiment"](
        tmp_path, name="curves", train=train, eval={"n_items": 4, "nll_max_tokens": 512, "curve_seeds": [1]}
    )
    helpers["make_run"](results, "curves", "bf16")
    (results / "curves" / "data").symlink_to(results / exp.name / "data")
    evaluate_main(str(path), "bf16", seed=0, results=results, downstream=False, progress=False)
    nll = pd.read_parquet(results / "curves" / "eval" / "bf16" / "seed0" / "nll.parquet")
    assert set(nll["step"]) == {STEPS[-1]}
