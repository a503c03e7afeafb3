"""fp4repro.plots: every figure from small inputs in the real schema (written by the project's own
writers), valid PNG + PDF out, clear errors for bad inputs."""

import json
from pathlib import Path

import pandas as pd
import pytest

from fp4repro.cli import main
from fp4repro.eval.downstream import group_name, result_rows
from fp4repro.eval.loss import final_window_loss
from fp4repro.plots import FIGURE_INPUTS, FIGURES, PlotError, plot_figure
from fp4repro.results import DOWNSTREAM_COLUMNS, NLL_COLUMNS
from fp4repro.train.loop import METRICS, TELEMETRY

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RECIPES = ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048")
OPERANDS = ("fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x")
STEPS, TOKENS_PER_STEP, CHECKPOINTS = 40, 256, (20, 40)


def _metrics(k: int) -> list[dict]:
    return [{"step": s, "tokens": s * TOKENS_PER_STEP, "stage": "stage1" if s <= 30 else "stage2",
             "loss": 7.0 - 2.5 * s / STEPS + 0.05 * k + 0.1 * ((s * 7) % 5 - 2) / 2, "lr": 1e-3,
             "grad_norm": 1.0, "tokens_per_s": 1000.0} for s in range(1, STEPS + 1)]


def _telemetry(recipe: str) -> list[dict]:
    if recipe == "bf16":
        return []
    rows = []
    for step in range(0, STEPS, 10):
        for layer in ("layers.0.mixer.fc1", "layers.0.mixer.fc2"):
            for i, op in enumerate(OPERANDS):
                under = (step // 10 + i) % 3 if op.endswith(".dy") and recipe != "ue5m3_t2048" else 0
                rows.append({"step": step, "layer": layer, "operand": op, "blocks": 1024, "saturated_blocks": 0,
                             "underflow_blocks": under, "nonzero_elements": 16384, "zeroed_elements": 10,
                             "nonfinite_blocks": 0, "sq_error": 0.1, "sq_norm": 10.0, "amax_ratio": 1.0,
                             "rel_error": 0.1})
    return rows


def _lm_eval_results(step: int, k: int) -> dict:
    """An lm-eval results dict as simple_evaluate returns it for two aggregates."""
    tasks = {"prose_next_line": ["fp4repro_prose_next_line"], "cloze": ["fp4repro_prose_cloze", "fp4repro_code_cloze"]}
    results, subtasks = {}, {}
    for agg, names in tasks.items():
        score = 0.25 + 0.002 * step + 0.01 * k
        results[group_name(agg)] = {"alias": agg, "acc,none": score, "acc_stderr,none": 0.03}
        subtasks[group_name(agg)] = names
        for name in names:
            results[name] = {"alias": name, "acc,none": score, "acc_stderr,none": 0.03, "acc_norm,none": score,
                             "acc_norm_stderr,none": 0.03}
    return {"results": results, "group_subtasks": subtasks,
            "n-samples": {n: {"effective": 50} for names in tasks.values() for n in names}}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """results/toy/{train,eval}/<recipe>/... for four recipes, written as the project writes them."""
    root = tmp_path_factory.mktemp("plots") / "results" / "toy"
    for k, recipe in enumerate(RECIPES):
        train, ev = root / "train" / recipe, root / "eval" / recipe
        train.mkdir(parents=True)
        ev.mkdir(parents=True)
        pd.DataFrame(_metrics(k), columns=METRICS).to_parquet(train / "metrics.parquet", index=False)
        pd.DataFrame(_telemetry(recipe), columns=TELEMETRY).to_parquet(train / "telemetry.parquet", index=False)
        summary = {"experiment": "toy", "recipe": recipe, **final_window_loss(train / "metrics.parquet", 0.1)}
        (ev / "final_loss.json").write_text(json.dumps(summary))
        nll, down = [], []
        for step in CHECKPOINTS:
            for policy in ("bf16", "quantized"):
                meta = {"recipe": recipe, "step": step, "tokens": step * TOKENS_PER_STEP, "policy": policy}
                for source, v in (("prose", 6.0), ("code", 5.0), ("blend", 5.5)):
                    nll.append({**meta, "source": source, "nll": v - 0.02 * step + 0.01 * k, "tokens_evaluated": 99})
                down += result_rows(_lm_eval_results(step, k), meta)
        pd.DataFrame(nll, columns=list(NLL_COLUMNS)).to_parquet(ev / "nll.parquet", index=False)
        pd.DataFrame(down, columns=list(DOWNSTREAM_COLUMNS)).to_parquet(ev / "downstream.parquet", index=False)
    return root


@pytest.fixture(autouse=True)
def low_dpi(monkeypatch):
    """Smaller PNGs: the tests check files, not pixels (and stay fast on two shared cores)."""
    import fp4repro.plots.common

    monkeypatch.setattr(fp4repro.plots.common, "PNG_DPI", 50)


def inputs_of(root: Path, figure: str) -> list[Path]:
    files = {"loss": ["train/{r}/metrics.parquet", "eval/{r}/final_loss.json"], "nll": ["eval/{r}/nll.parquet"],
             "downstream": ["eval/{r}/downstream.parquet"], "telemetry": ["train/{r}/telemetry.parquet"]}[figure]
    return [root / f.format(r=r) for f in files for r in RECIPES]


def assert_figure(png: Path) -> None:
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
    assert png.stat().st_size > 5_000
    assert not [p for p in png.parent.iterdir() if p.name.endswith(".tmp")]   # atomic: no temp files left


@pytest.mark.parametrize("figure", sorted(FIGURES))
def test_figure_writes_png_and_pdf(results, tmp_path, figure):
    out = tmp_path / "figs" / f"{figure}.png"
    done = results / "train" / "ue5m3" / "done.json"     # a workflow may list it: accepted, ignored
    done.write_text("{}")
    plot_figure(figure, inputs_of(results, figure) + [done], out)
    assert_figure(out)


def test_loss_without_final_loss_json_computes_the_window(results, tmp_path):
    """final_loss.json is optional: the window W comes from --final-window (the metrics of an unknown
    experiment give no config to read it from, which is a clear error)."""
    metrics = [results / f"train/{r}/metrics.parquet" for r in RECIPES]
    with pytest.raises(PlotError, match="final-window"):
        plot_figure("loss", metrics, tmp_path / "a.png")
    plot_figure("loss", metrics, tmp_path / "c.png", final_window=0.2)
    assert_figure(tmp_path / "c.png")


# a table of each kind without one column the figure needs
BROKEN = {"loss": ("train/ue5m3/metrics.parquet", "loss"), "nll": ("eval/ue5m3/nll.parquet", "nll"),
          "downstream": ("eval/ue5m3/downstream.parquet", "stderr"),
          "telemetry": ("train/ue5m3/telemetry.parquet", "underflow_blocks")}


@pytest.mark.parametrize("figure", sorted(FIGURES))
def test_wrong_columns_name_the_file_and_column(results, tmp_path, figure):
    rel, column = BROKEN[figure]
    bad = tmp_path / Path(rel).parent.name / Path(rel).name
    bad.parent.mkdir()
    pd.read_parquet(results / rel).drop(columns=[column]).to_parquet(bad)
    inputs = [p for p in inputs_of(results, figure) if p != results / rel] + [bad]
    with pytest.raises(PlotError) as err:
        plot_figure(figure, inputs, tmp_path / "out.png")
    assert str(bad) in str(err.value) and f"missing column(s) {column}" in str(err.value)
    assert not (tmp_path / "out.png").exists() and not (tmp_path / "out.pdf").exists()


def test_bad_inputs_give_clear_errors(results, tmp_path):
    with pytest.raises(PlotError, match="no input files; it takes .*nll.parquet"):
        plot_figure("nll", [], tmp_path / "x.png")
    missing = tmp_path / "nowhere" / "nll.parquet"
    with pytest.raises(PlotError, match=f"{missing}: no such file"):
        plot_figure("nll", [missing], tmp_path / "x.png")
    with pytest.raises(PlotError, match="takes .*not a .json file"):
        plot_figure("nll", [results / "eval/ue5m3/final_loss.json"], tmp_path / "x.png")
    with pytest.raises(PlotError, match="every input table is empty"):
        plot_figure("telemetry", [results / "train/bf16/telemetry.parquet"], tmp_path / "x.png")
    with pytest.raises(PlotError, match="unknown figure"):
        plot_figure("nope", [], tmp_path / "x.png")
    with pytest.raises(PlotError, match="must be a .png"):
        plot_figure("telemetry", inputs_of(results, "telemetry"), tmp_path / "x.jpg")
    assert set(FIGURE_INPUTS) == set(FIGURES)


def test_cli_plot(results, tmp_path, capsys, monkeypatch):
    out = tmp_path / "t.png"
    monkeypatch.chdir(tmp_path)          # --out defaults to figures/<experiment>/<figure>.png
    assert main(["plot", "nll", *map(str, inputs_of(results, "nll"))]) == 0
    assert_figure(tmp_path / "figures" / "toy" / "nll.png")
    capsys.readouterr()
    missing = tmp_path / "missing" / "metrics.parquet"
    assert main(["plot", "loss", "--out", str(out), str(missing)]) == 1          # an input that is not there
    assert f"{missing}: no such file" in capsys.readouterr().err
    assert main(["plot", "loss", str(results / "train/ue5m3/metrics.parquet"), str(out)]) == 2   # options
    assert "cannot tell the experiment from the input paths" in capsys.readouterr().err
