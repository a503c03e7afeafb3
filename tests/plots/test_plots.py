"""fp4repro.plots: every figure from small inputs in the real schema and the seed layout (written by
the project's own writers), valid PNG + PDF out, clear errors for bad inputs, and the paired
differences drawn equal to those ``fp4repro.paired`` / ``fp4repro.statistics`` compute."""

import json
import math
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from overlap import assert_no_overlap, no_overlap

from fp4repro.cli import main
from fp4repro.eval.downstream import group_name, item_rows, result_rows
from fp4repro.eval.loss import final_window_loss
from fp4repro.paired import document_difference, item_difference, step_difference
from fp4repro.plots import FIGURE_INPUTS, FIGURES, OPTIONS, PlotError, draw_figure, plot_figure
from fp4repro.results import DOWNSTREAM_COLUMNS, DOWNSTREAM_ITEM_COLUMNS, NLL_COLUMNS, NLL_DOCUMENT_COLUMNS, event_rates
from fp4repro.statistics import seed_level, seeds_and_items
from fp4repro.train.loop import METRICS, TELEMETRY

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RECIPES = ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048")
OPERANDS = ("fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x")
HELD = ("fprop.x", "dgrad.dy", "wgrad.dy")  # operands with a held amax (periodic scaling), refreshed every 5
STEPS, TOKENS_PER_STEP, CHECKPOINTS, REFRESH = 40, 256, (20, 40), 5
# loss offset of each recipe: ue5m3 is nvfp4 − 0.1 at every step of every seed (no noise of its own)
OFFSET = {"bf16": -0.05, "nvfp4": 0.0, "ue5m3": -0.1, "ue5m3_t2048": 0.03}
NOISY = {"bf16", "ue5m3_t2048"}  # recipes with noise of their own on top of the seed's
BLEND = {"prose": 0.4, "code": 0.6}
DOCUMENTS, ITEMS = 30, 20
AGGREGATES = {"prose_next_line": ["fp4repro_prose_next_line"], "cloze": ["fp4repro_prose_cloze", "fp4repro_code_cloze"]}


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng([zlib.crc32(str(k).encode()) for k in key])


def _metrics(recipe: str, seed: int) -> list[dict]:
    shared = _rng("loss", seed).normal(0, 0.05, STEPS)  # the seed's batches: shared by every recipe
    own = _rng("loss", recipe, seed).normal(0, 0.03, STEPS) if recipe in NOISY else np.zeros(STEPS)
    return [
        {
            "step": s,
            "tokens": s * TOKENS_PER_STEP,
            "stage": "stage1" if s <= 30 else "stage2",
            "loss": 7.0 - 2.5 * s / STEPS + OFFSET[recipe] + shared[s - 1] + own[s - 1],
            "lr": 1e-3,
            "grad_norm": 1.0,
            "tokens_per_s": 1000.0,
            "attempt": 0,
        }
        for s in range(1, STEPS + 1)
    ]


def _telemetry(recipe: str, seed: int) -> list[dict]:
    if recipe == "bf16":
        return []
    rows = []
    for step in range(0, STEPS, 3):  # coprime with the refresh: every phase seen
        for layer in ("layers.0.mixer.fc1", "layers.0.mixer.fc2"):
            for i, op in enumerate(OPERANDS):
                phase = step % REFRESH if op in HELD else 0
                dy = op.endswith(".dy")
                under = (phase + i + seed) % 3 + (2 * phase if dy and recipe != "ue5m3_t2048" else 0) if dy else 0
                rows.append(
                    {
                        "step": step,
                        "layer": layer,
                        "operand": op,
                        "steps_since_refresh": phase,
                        "blocks": 1024,
                        "saturated_blocks": 0,
                        "underflow_blocks": under,
                        "nonzero_elements": 16384,
                        "zeroed_elements": 10,
                        "clipped_elements": phase + (3 if recipe == "nvfp4" else 1) if op in HELD else 0,
                        "nonfinite_blocks": 0,
                        "sq_error": 0.1,
                        "sq_norm": 10.0,
                        "amax_ratio": 1.0,
                        "rel_error": 0.1,
                    }
                )
    return rows


def _lm_eval_results(recipe: str, seed: int, step: int) -> dict:
    """An lm-eval results dict as simple_evaluate returns it for two aggregates, with logged samples."""
    k = RECIPES.index(recipe)
    results, subtasks, samples = {}, {}, {}
    for agg, names in AGGREGATES.items():
        scores = []
        for name in names:
            p = 0.25 + 0.004 * step + 0.03 * k
            outcomes = (_rng("items", recipe, seed, step, name).random(ITEMS) < p).astype(float)
            samples[name] = [{"doc_id": i, "metrics": ["acc"], "acc": v} for i, v in enumerate(outcomes)]
            score = float(outcomes.mean())
            scores.append(score)
            results[name] = {"alias": name, "acc,none": score, "acc_stderr,none": 0.1}
        results[group_name(agg)] = {"alias": agg, "acc,none": float(np.mean(scores)), "acc_stderr,none": 0.08}
        subtasks[group_name(agg)] = names
    return {
        "results": results,
        "group_subtasks": subtasks,
        "samples": samples,
        "n-samples": {n: {"effective": ITEMS} for names in AGGREGATES.values() for n in names},
    }


def _nll(recipe: str, seed: int) -> tuple[list[dict], list[dict]]:
    """nll.parquet rows (per source and the blend) computed from nll_documents.parquet rows."""
    k = RECIPES.index(recipe)
    nll, documents = [], []
    for step in CHECKPOINTS:
        for policy in ("bf16", "quantized"):
            meta = {"recipe": recipe, "seed": seed, "step": step, "tokens": step * TOKENS_PER_STEP, "policy": policy}
            per_source = {}
            for source, level in (("prose", 6.0), ("code", 5.0)):
                predicted = 50 + np.arange(DOCUMENTS) % 7 * 10
                per_token = (
                    level
                    - 0.02 * step
                    + 0.01 * k
                    + _rng("doc", source, seed).normal(0, 0.3, DOCUMENTS)
                    + _rng("doc", recipe, source, seed, step, policy).normal(0, 0.05, DOCUMENTS)
                )
                documents += [
                    {
                        **meta,
                        "source": source,
                        "document": d,
                        "nll_sum": float(per_token[d] * predicted[d]),
                        "predicted": int(predicted[d]),
                    }
                    for d in range(DOCUMENTS)
                ]
                per_source[source] = (float((per_token * predicted).sum() / predicted.sum()), int(predicted.sum()))
            per_source["blend"] = (
                sum(w * per_source[s][0] for s, w in BLEND.items()),
                sum(per_source[s][1] for s in BLEND),
            )
            nll += [{**meta, "source": s, "nll": v, "tokens_evaluated": n} for s, (v, n) in per_source.items()]
    return nll, documents


def write_results(root: Path, seeds) -> Path:
    """results/toy/{train,eval}/<recipe>/seed<s>/... for four recipes, written as the project writes them."""
    exp = root / "results" / "toy"
    for recipe in RECIPES:
        for seed in seeds:
            train, ev = exp / "train" / recipe / f"seed{seed}", exp / "eval" / recipe / f"seed{seed}"
            train.mkdir(parents=True)
            ev.mkdir(parents=True)
            pd.DataFrame(_metrics(recipe, seed), columns=METRICS).to_parquet(train / "metrics.parquet", index=False)
            pd.DataFrame(_telemetry(recipe, seed), columns=TELEMETRY).to_parquet(
                train / "telemetry.parquet", index=False
            )
            summary = {
                "experiment": "toy",
                "recipe": recipe,
                "seed": seed,
                **final_window_loss(train / "metrics.parquet", 0.25),
            }
            (ev / "final_loss.json").write_text(json.dumps(summary))
            nll, documents = _nll(recipe, seed)
            pd.DataFrame(nll, columns=list(NLL_COLUMNS)).to_parquet(ev / "nll.parquet", index=False)
            pd.DataFrame(documents, columns=list(NLL_DOCUMENT_COLUMNS)).to_parquet(
                ev / "nll_documents.parquet", index=False
            )
            down, items = [], []
            for step in CHECKPOINTS:
                for policy in ("bf16", "quantized"):
                    meta = {
                        "recipe": recipe,
                        "seed": seed,
                        "step": step,
                        "tokens": step * TOKENS_PER_STEP,
                        "policy": policy,
                    }
                    lm_eval = _lm_eval_results(recipe, seed, step)
                    down += result_rows(lm_eval, meta)
                    items += item_rows(lm_eval, meta)
            pd.DataFrame(down, columns=list(DOWNSTREAM_COLUMNS)).to_parquet(ev / "downstream.parquet", index=False)
            pd.DataFrame(items, columns=list(DOWNSTREAM_ITEM_COLUMNS)).to_parquet(
                ev / "downstream_items.parquet", index=False
            )
    return exp


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """One seed per recipe (as the tiny run)."""
    return write_results(tmp_path_factory.mktemp("plots"), (0,))


@pytest.fixture(scope="module")
def results_seeds(tmp_path_factory) -> Path:
    """Three seeds per recipe."""
    return write_results(tmp_path_factory.mktemp("plots3"), (0, 1, 2))


@pytest.fixture(autouse=True)
def low_dpi(monkeypatch):
    """Smaller PNGs: the tests check files, not pixels (and stay fast on two shared cores)."""
    import fp4repro.plots.common

    monkeypatch.setattr(fp4repro.plots.common, "PNG_DPI", 50)


FILES = {
    "loss": ["train/{r}/seed{s}/metrics.parquet", "eval/{r}/seed{s}/final_loss.json"],
    "nll": ["eval/{r}/seed{s}/nll.parquet", "eval/{r}/seed{s}/nll_documents.parquet"],
    "downstream": ["eval/{r}/seed{s}/downstream.parquet", "eval/{r}/seed{s}/downstream_items.parquet"],
    "telemetry": ["train/{r}/seed{s}/telemetry.parquet"],
    "target": ["train/{r}/seed{s}/telemetry.parquet"],
}
# what a figure needs besides its files here: the toy experiment has no config to read the blend from
EXTRA = {"nll": {"blend": BLEND}}


def inputs_of(root: Path, figure: str, recipes=RECIPES) -> list[Path]:
    seeds = sorted(int(p.name[4:]) for p in (root / "train" / RECIPES[0]).iterdir())
    return [root / f.format(r=r, s=s) for f in FILES[figure] for r in recipes for s in seeds]


def assert_figure(png: Path) -> None:
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
    assert png.stat().st_size > 5_000
    assert not [p for p in png.parent.iterdir() if p.name.endswith(".tmp")]  # atomic: no temp files left


def rendered(fig):
    """``fig`` drawn on an Agg canvas, as saving would draw it (text, layout), with no two texts
    overlapping: a figure that draw_figure builds but that could not be drawn, or that prints
    labels over each other, fails here, without writing files. (``fig.canvas.draw()`` alone would
    draw nothing: ``draw_figure`` closes the figure, which leaves it a canvas that does not draw.)"""
    assert_no_overlap(fig)
    return fig


def axis(fig, label: str):
    found = [ax for ax in fig.axes if ax.get_label() == label]
    assert len(found) == 1, f"no single axes {label!r} among {[ax.get_label() for ax in fig.axes]}"
    return found[0]


def artist(ax, gid: str):
    found = [a for a in [*ax.lines, *ax.collections, *ax.patches] if a.get_gid() == gid]
    assert len(found) == 1, f"no single artist {gid!r} in {ax.get_label()!r}"
    return found[0]


RUN_FIGURES = sorted(set(FIGURES) - {"throughput"})  # figures of runs' tables (throughput: a benchmark's)


@pytest.mark.parametrize("figure", RUN_FIGURES)
def test_figure_writes_png_and_pdf(results, tmp_path, figure):
    out = tmp_path / "figs" / f"{figure}.png"
    done = results / "train" / "ue5m3" / "seed0" / "done.json"  # a workflow may list it: accepted, ignored
    done.write_text("{}")
    with no_overlap():  # the texts of the PDF's and the PNG's draws, as they are written
        plot_figure(figure, inputs_of(results, figure) + [done], out, **EXTRA.get(figure, {}))
    assert_figure(out)


@pytest.mark.parametrize("figure", RUN_FIGURES)
def test_figure_from_several_seeds_draws_the_mean(results_seeds, figure):
    fig = rendered(draw_figure(figure, inputs_of(results_seeds, figure), **EXTRA.get(figure, {})))
    if figure == "loss":  # the bold line is the mean over seeds of the smoothed per-seed curves
        from fp4repro.plots.loss import smooth, smoothing_window

        curves = [pd.DataFrame(_metrics("ue5m3_t2048", s)).set_index("step")["loss"] for s in (0, 1, 2)]
        expected = np.mean([smooth(c, smoothing_window(STEPS)).to_numpy() for c in curves], axis=0)
        np.testing.assert_allclose(artist(axis(fig, "loss"), "loss:ue5m3_t2048").get_ydata(), expected)


def test_a_path_outside_the_seed_layout_is_named(results, tmp_path):
    old = tmp_path / "results" / "toy" / "eval" / "ue5m3" / "nll.parquet"  # the layout before seeds
    old.parent.mkdir(parents=True)
    old.write_bytes((results / "eval/ue5m3/seed0/nll.parquet").read_bytes())
    with pytest.raises(PlotError) as err:
        plot_figure("nll", inputs_of(results, "nll", ("nvfp4",)) + [old], tmp_path / "x.png", blend=BLEND)
    assert str(old) in str(err.value) and "<recipe>/seed<seed>/nll.parquet" in str(err.value)
    assert not (tmp_path / "x.png").exists()


def test_two_files_of_one_run_are_an_error(results, tmp_path):
    twin = tmp_path / "results" / "other" / "train" / "ue5m3" / "seed0" / "metrics.parquet"
    twin.parent.mkdir(parents=True)
    twin.write_bytes((results / "train/ue5m3/seed0/metrics.parquet").read_bytes())
    with pytest.raises(PlotError, match=r"a second metrics.parquet for recipe 'ue5m3' seed 0") as err:
        plot_figure("loss", inputs_of(results, "loss") + [twin], tmp_path / "x.png")
    assert str(twin) in str(err.value)


def test_loss_difference_is_the_paired_per_step_difference(results):
    """ue5m3's loss is nvfp4's − 0.1 at every step: its difference line is −0.1 throughout; the
    final-window box of a noisy recipe is the batch-means interval of its final-window steps."""
    fig = draw_figure("loss", inputs_of(results, "loss"))
    ax = axis(fig, "difference")
    line = artist(ax, "difference:ue5m3")
    np.testing.assert_allclose(line.get_ydata(), -0.1, atol=1e-9)
    np.testing.assert_array_equal(line.get_xdata(), np.arange(1, STEPS + 1) * TOKENS_PER_STEP)
    assert "batch means" in ax.get_title() and "nvfp4" in ax.get_title()
    assert {a.get_gid() for a in ax.lines if a.get_gid()} == {
        f"difference:{r}" for r in ("bf16", "ue5m3", "ue5m3_t2048")
    }
    window = [s for s in range(1, STEPS + 1) if s * TOKENS_PER_STEP > 0.75 * STEPS * TOKENS_PER_STEP]
    a, b = (pd.DataFrame(_metrics(r, 0)).set_index("step").loc[window, "loss"] for r in ("ue5m3_t2048", "nvfp4"))
    expected = step_difference(a, b)
    box = artist(ax, "final:ue5m3_t2048")
    assert box.get_y() == pytest.approx(expected.low) and box.get_y() + box.get_height() == pytest.approx(expected.high)
    assert expected.high - expected.low > 0.01  # a real interval, not a degenerate one


def test_loss_band_over_seeds_is_the_t_interval_per_step(results_seeds):
    from fp4repro.plots.loss import smooth, smoothing_window

    fig = draw_figure("loss", inputs_of(results_seeds, "loss"))
    band = artist(axis(fig, "difference"), "band:ue5m3_t2048")
    per_seed = [
        smooth(
            pd.DataFrame(_metrics("ue5m3_t2048", s)).set_index("step")["loss"]
            - pd.DataFrame(_metrics("nvfp4", s)).set_index("step")["loss"],
            smoothing_window(STEPS),
        )
        for s in (0, 1, 2)
    ]
    vertices = band.get_paths()[0].vertices
    for step in (5, 20, 40):
        expected = seed_level([d.loc[step] for d in per_seed])
        ys = vertices[np.isclose(vertices[:, 0], step * TOKENS_PER_STEP), 1]
        assert ys.min() == pytest.approx(expected.low) and ys.max() == pytest.approx(expected.high)
    assert "t-interval of the smoothed differences over 3 seeds" in axis(fig, "difference").get_title()


def test_final_window_panel_marks_each_seed(results_seeds):
    fig = draw_figure("loss", inputs_of(results_seeds, "loss"))
    for recipe in ("nvfp4", "ue5m3"):
        losses = [
            json.loads((results_seeds / f"eval/{recipe}/seed{s}/final_loss.json").read_text())["loss"]
            for s in (0, 1, 2)
        ]
        assert sorted(artist(axis(fig, "final"), f"seeds:{recipe}").get_xdata()) == pytest.approx(sorted(losses))


def test_recipes_read_on_different_seeds_say_so(results_seeds):
    def mixed(figure):  # ue5m3 with seeds 0-2, every other recipe with seed 0
        return [p for p in inputs_of(results_seeds, figure) if "/ue5m3/" in str(p) or "/seed0/" in str(p)]

    fig = draw_figure("loss", mixed("loss"))
    assert "mean over seeds (ue5m3: 3; bf16, nvfp4, ue5m3_t2048: 1)" in axis(fig, "loss").get_title()
    labels = [t.get_text() for t in axis(fig, "final").get_yticklabels()]
    assert "ue5m3\n(seeds 0–2)" in labels and "nvfp4\n(seed 0)" in labels
    assert "one seed: no interval per step" in axis(fig, "difference").get_title()  # the pairs share seed 0
    fig = draw_figure("telemetry", mixed("telemetry"))
    assert "mean over seeds (ue5m3: 3; nvfp4, ue5m3_t2048: 1)" in fig._suptitle.get_text()
    same = draw_figure("loss", inputs_of(results_seeds, "loss"))
    assert [t.get_text() for t in axis(same, "final").get_yticklabels()] == list(RECIPES)


def test_a_label_gives_consecutive_seeds_as_a_range():
    from fp4repro.plots.common import seed_ranges

    assert seed_ranges([7, 0, 1, 2, 3, 4, 5, 6]) == "0–7"
    assert seed_ranges([0, 1, 2, 5]) == "0–2, 5" and seed_ranges([0, 1, 4, 6, 7]) == "0, 1, 4, 6, 7"
    assert seed_ranges([3]) == "3" and seed_ranges([]) == ""


def test_titles_say_whose_mean_is_over_how_many_seeds():
    from fp4repro.plots.common import seed_counts

    assert seed_counts({"ue5m3": 3, "nvfp4": 3}) == "3 seeds" and seed_counts({"ue5m3": 1}) == "1 seed"
    assert (
        seed_counts({"ue5m3_t2048": 1, "ue5m3": 2, "nvfp4": 1, "bf16": 1})
        == "seeds (ue5m3: 2; bf16, nvfp4, ue5m3_t2048: 1)"
    )


def test_baseline_option(results, tmp_path):
    fig = draw_figure("loss", inputs_of(results, "loss"), baseline="ue5m3")
    np.testing.assert_allclose(artist(axis(fig, "difference"), "difference:nvfp4").get_ydata(), 0.1, atol=1e-9)
    with pytest.raises(PlotError, match="baseline 'mxfp4' is not among the recipes"):
        plot_figure("loss", inputs_of(results, "loss"), tmp_path / "l.png", baseline="mxfp4")
    # without nvfp4 the baseline is the first recipe of the study's order present
    fig = draw_figure("loss", inputs_of(results, "loss", ("ue5m3", "bf16")))
    assert "recipe − bf16" in axis(fig, "difference").get_title()
    with pytest.raises(PlotError, match="takes no option baseline"):
        plot_figure("telemetry", inputs_of(results, "telemetry"), tmp_path / "t.png", baseline="nvfp4")


def test_nll_interval_from_one_seed_is_the_document_bootstrap(results):
    fig = draw_figure("nll", inputs_of(results, "nll"), blend=BLEND)
    docs = {r: pd.read_parquet(results / f"eval/{r}/seed0/nll_documents.parquet") for r in ("ue5m3", "nvfp4")}
    ax = axis(fig, "difference:quantized")
    segments = artist(ax, "interval:ue5m3:quantized").get_segments()
    points = artist(ax, "difference:ue5m3:quantized")
    assert len(segments) == len(CHECKPOINTS)
    for k, step in enumerate(CHECKPOINTS):
        picked = [d[(d["step"] == step) & (d["policy"] == "quantized")] for d in docs.values()]
        # the last checkpoint with the report's resamples (its default), earlier ones with fewer
        expected = (
            document_difference(*picked, BLEND)
            if step == CHECKPOINTS[-1]
            else document_difference(*picked, BLEND, resamples=500)
        )
        assert segments[k][0][0] == step * TOKENS_PER_STEP
        assert (segments[k][0][1], segments[k][1][1]) == pytest.approx((expected.low, expected.high))
        assert points.get_ydata()[k] == pytest.approx(expected.difference)
        assert expected.low < expected.high
    nll = pd.read_parquet(results / "eval/ue5m3/seed0/nll.parquet")
    assert expected.difference == pytest.approx(  # the bootstrap's full sample is the table's blend difference
        nll.query("step == 40 and policy == 'quantized' and source == 'blend'")["nll"].iloc[0]
        - pd.read_parquet(results / "eval/nvfp4/seed0/nll.parquet")
        .query("step == 40 and policy == 'quantized' and source == 'blend'")["nll"]
        .iloc[0]
    )
    assert "paired bootstrap over documents\n(2000 resamples at the last checkpoint, 500 before)" in ax.get_title()


def _seed_averaged_documents(root: Path, step: int) -> list[pd.DataFrame]:
    """bf16's and nvfp4's per-document NLL under policy bf16 at ``step``, averaged over seeds 0-2."""
    return [
        pd.concat(
            pd.read_parquet(root / f"eval/{r}/seed{s}/nll_documents.parquet").query(
                f"step == {step} and policy == 'bf16'"
            )
            for s in (0, 1, 2)
        )
        .groupby(["source", "document"], sort=False)[["nll_sum", "predicted"]]
        .mean()
        .reset_index()
        for r in ("bf16", "nvfp4")
    ]


def test_nll_interval_over_seeds_is_the_seed_level_t_widened_by_the_documents(results_seeds):
    fig = draw_figure("nll", inputs_of(results_seeds, "nll"), blend=BLEND)
    blend = {
        r: [
            pd.read_parquet(results_seeds / f"eval/{r}/seed{s}/nll.parquet")
            .query("step == 20 and policy == 'bf16' and source == 'blend'")["nll"]
            .iloc[0]
            for s in (0, 1, 2)
        ]
        for r in ("bf16", "nvfp4")
    }
    documents = _seed_averaged_documents(results_seeds, 20)
    expected = seeds_and_items(
        np.array(blend["bf16"]) - np.array(blend["nvfp4"]),
        document_difference(*documents, BLEND, 500),  # 500: step 20 is before the last checkpoint
    )
    assert expected.stderr > seed_level(np.array(blend["bf16"]) - np.array(blend["nvfp4"])).stderr
    segment = artist(axis(fig, "difference:bf16"), "interval:bf16:bf16").get_segments()[0]
    assert (segment[0][1], segment[1][1]) == pytest.approx((expected.low, expected.high))


def test_one_seed_differences_need_the_unit_tables(results, tmp_path):
    nll_only = [p for p in inputs_of(results, "nll") if p.name == "nll.parquet"]
    with pytest.raises(PlotError, match=r"paired bootstrap over documents: give nll_documents.parquet of \w+/seed0"):
        plot_figure("nll", nll_only, tmp_path / "n.png", blend=BLEND)
    with pytest.raises(PlotError, match="cannot tell the final blend's weights"):
        plot_figure("nll", inputs_of(results, "nll"), tmp_path / "n.png")
    down_only = [p for p in inputs_of(results, "downstream") if p.name == "downstream.parquet"]
    with pytest.raises(PlotError, match="give downstream_items.parquet of"):
        plot_figure("downstream", down_only, tmp_path / "d.png")


def test_downstream_interval_from_one_seed_is_the_item_test(results):
    fig = draw_figure("downstream", inputs_of(results, "downstream"))
    ax = axis(fig, "difference:quantized")
    items = {r: pd.read_parquet(results / f"eval/{r}/seed0/downstream_items.parquet") for r in ("ue5m3", "nvfp4")}
    points = artist(ax, "difference:ue5m3:quantized").get_ydata()
    segments = artist(ax, "interval:ue5m3:quantized").get_segments()
    for k, aggregate in enumerate(AGGREGATES):
        picked = [
            t[(t["step"] == 40) & (t["policy"] == "quantized") & (t["aggregate"] == aggregate) & (t["metric"] == "acc")]
            for t in items.values()
        ]
        expected = item_difference(*picked)
        assert points[k] == pytest.approx(expected.difference)
        assert (segments[k][0][1], segments[k][1][1]) == pytest.approx((expected.low, expected.high))


def test_telemetry_has_every_event_by_operand_and_phase(results):
    fig = draw_figure("telemetry", inputs_of(results, "telemetry"))
    table = pd.read_parquet(results / "train/ue5m3/seed0/telemetry.parquet")
    held = table[table["operand"].isin(HELD)]
    for event in ("underflow", "saturation", "clipping"):
        axis(fig, f"operand:{event}")
        axis(fig, f"phase:{event}")
    # the phases drawn are those of the table's held-amax operands, with their rates
    line = artist(axis(fig, "phase:clipping"), "phase:ue5m3")
    rates = event_rates(held, ["steps_since_refresh"]).sort_values("steps_since_refresh")
    np.testing.assert_array_equal(line.get_xdata(), sorted(held["steps_since_refresh"].unique()))
    np.testing.assert_allclose(line.get_ydata(), rates["clipping"])
    assert set(line.get_xdata()) == set(range(REFRESH))
    # clipping by operand: ue5m3's fprop.x bar is its rate
    bar = artist(axis(fig, "operand:clipping"), "rate:ue5m3:fprop.x")
    rate = event_rates(table[table["operand"] == "fprop.x"], [])["clipping"].iloc[0]
    assert bar.get_y() + bar.get_height() == pytest.approx(rate)
    assert "no saturated blocks" in " ".join(t.get_text() for t in axis(fig, "operand:saturation").texts)


def test_the_telemetry_legend_gives_each_recipe_the_target_its_rows_record(results, tmp_path):
    """T is read from the runs, not the recipe's name: the authors' ue5m3 quantizes one layer at
    T = 2048; a table without the column says no T."""
    inputs = []
    for recipe, targets in (("nvfp4", {}), ("ue5m3", {"last": 2048.0}), ("ue5m3_t2048", None)):
        table = pd.read_parquet(results / f"train/{recipe}/seed0/telemetry.parquet")
        if targets is not None:
            last = sorted(table["layer"].unique())[-1]
            table["target"] = np.where(table["layer"] == last, targets.get("last", 448.0), 448.0)
        path = tmp_path / f"results/toy/train/{recipe}/seed0/telemetry.parquet"
        path.parent.mkdir(parents=True)
        table.to_parquet(path)
        inputs.append(path)
    fig = draw_figure("telemetry", inputs)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    linears = {r: pd.read_parquet(p)["layer"].nunique() for r, p in zip(("nvfp4", "ue5m3", "ue5m3_t2048"), inputs)}
    assert labels == [
        f"nvfp4 (E4M3 scales; T=448; {linears['nvfp4']} linears)",
        f"ue5m3 (UE5M3; T=448 or 2048; {linears['ue5m3']} linears)",
        f"ue5m3_t2048 (UE5M3; {linears['ue5m3_t2048']} linears)",
    ]


# a table of each kind without one column the figure needs
BROKEN = {
    "loss": ("train/ue5m3/seed0/metrics.parquet", "loss"),
    "nll": ("eval/ue5m3/seed0/nll.parquet", "nll"),
    "downstream": ("eval/ue5m3/seed0/downstream.parquet", "stderr"),
    "telemetry": ("train/ue5m3/seed0/telemetry.parquet", "clipped_elements"),
    "target": ("train/ue5m3/seed0/telemetry.parquet", "operand"),
}


@pytest.mark.parametrize("figure", RUN_FIGURES)
def test_wrong_columns_name_the_file_and_column(results, tmp_path, figure):
    rel, column = BROKEN[figure]
    bad = tmp_path / "results" / "toy" / rel
    bad.parent.mkdir(parents=True)
    pd.read_parquet(results / rel).drop(columns=[column]).to_parquet(bad)
    inputs = [p for p in inputs_of(results, figure) if p != results / rel] + [bad]
    with pytest.raises(PlotError) as err:
        plot_figure(figure, inputs, tmp_path / "out.png", **EXTRA.get(figure, {}))
    assert str(bad) in str(err.value) and f"missing column(s) {column}" in str(err.value)
    assert not (tmp_path / "out.png").exists() and not (tmp_path / "out.pdf").exists()


def test_loss_without_final_loss_json_computes_the_window(results, tmp_path):
    """final_loss.json is optional: the window W comes from --final-window (the metrics of an unknown
    experiment give no config to read it from, which is a clear error)."""
    metrics = [p for p in inputs_of(results, "loss") if p.name == "metrics.parquet"]
    with pytest.raises(PlotError, match="final-window"):
        plot_figure("loss", metrics, tmp_path / "a.png")
    plot_figure("loss", metrics, tmp_path / "c.png", final_window=0.2)
    assert_figure(tmp_path / "c.png")


def test_bad_inputs_give_clear_errors(results, tmp_path):
    with pytest.raises(PlotError, match="no input files; it takes .*nll.parquet"):
        plot_figure("nll", [], tmp_path / "x.png")
    missing = tmp_path / "nowhere" / "seed0" / "nll.parquet"
    with pytest.raises(PlotError, match=f"{missing}: no such file"):
        plot_figure("nll", [missing], tmp_path / "x.png")
    with pytest.raises(PlotError, match="takes .*not a file named final_loss.json"):
        plot_figure("nll", [results / "eval/ue5m3/seed0/final_loss.json"], tmp_path / "x.png")
    with pytest.raises(PlotError, match="every input table is empty"):
        plot_figure("telemetry", [results / "train/bf16/seed0/telemetry.parquet"], tmp_path / "x.png")
    with pytest.raises(PlotError, match="unknown figure"):
        plot_figure("nope", [], tmp_path / "x.png")
    with pytest.raises(PlotError, match="must be a .png"):
        plot_figure("telemetry", inputs_of(results, "telemetry"), tmp_path / "x.jpg")
    assert set(FIGURE_INPUTS) == set(FIGURES) == set(OPTIONS)


def test_cli_plot(results, tmp_path, capsys, monkeypatch):
    out = tmp_path / "t.png"
    monkeypatch.chdir(tmp_path)  # --out defaults to figures/<experiment>/<figure>.png
    assert (
        main(
            [
                "plot",
                "nll",
                "--blend",
                "prose=0.4,code=0.6",
                "--baseline",
                "ue5m3",
                *map(str, inputs_of(results, "nll")),
            ]
        )
        == 0
    )
    assert_figure(tmp_path / "figures" / "toy" / "nll.png")
    capsys.readouterr()
    missing = tmp_path / "missing" / "seed0" / "metrics.parquet"
    assert main(["plot", "loss", "--out", str(out), str(missing)]) == 1  # an input that is not there
    assert f"{missing}: no such file" in capsys.readouterr().err
    assert main(["plot", "loss", str(results / "train/ue5m3/seed0/metrics.parquet"), str(out)]) == 2  # options
    assert "cannot tell the experiment from the input paths" in capsys.readouterr().err
    assert main(["plot", "telemetry", "--baseline", "nvfp4", *map(str, inputs_of(results, "telemetry"))]) == 2
    assert "takes no --baseline" in capsys.readouterr().err
    assert main(["plot", "nll", "--blend", "prose:0.4", *map(str, inputs_of(results, "nll"))]) == 2
    assert "--blend 'prose:0.4'" in capsys.readouterr().err


def test_cli_passes_the_options_of_the_figure(results, tmp_path, monkeypatch):
    import fp4repro.plots

    seen = []
    monkeypatch.setattr(fp4repro.plots, "plot_figure", lambda name, inputs, out, **options: seen.append(options))
    inputs = [str(p) for p in inputs_of(results, "loss")]
    assert main(["plot", "loss", "--baseline", "ue5m3", "--final-window", "0.2", *inputs]) == 0
    assert main(["plot", "nll", "--blend", "prose=0.4,code=0.6", *map(str, inputs_of(results, "nll"))]) == 0
    assert main(["plot", "telemetry", *map(str, inputs_of(results, "telemetry"))]) == 0
    assert seen == [{"baseline": "ue5m3", "final_window": 0.2}, {"blend": BLEND}, {}]


# ------------------------------------------------------------------------------ figure 'target'

TARGET_LAYERS = ("layers.0.mixer.fc1", "layers.1.mlp.fc2", "layers.2.mixer.in_proj")


def auto_t(step: int, layer: int, op: str) -> float:
    """A known T sequence: 448 until the first refresh (step 10), then per layer and operand."""
    if step < 10:
        return 448.0
    base = {
        "fprop.x": 4096.0,
        "wgrad.x": 2048.0,
        "fprop.w": 8192.0,
        "dgrad.w": 8192.0,
        "dgrad.dy": 896.0,
        "wgrad.dy": 1792.0,
    }[op]
    return min(8192.0, base * 2**layer) if step < 20 else max(448.0, base / 2**layer)


def _target_telemetry(recipe: str, with_target: bool = True) -> pd.DataFrame:
    rows = []
    for step in range(0, 30, 3):
        for k, layer in enumerate(TARGET_LAYERS):
            for op in OPERANDS:
                t = {
                    "ue5m3_auto": auto_t(step, k, op),
                    "ue5m3_t8192": 8192.0,
                    "ue5m3": 448.0,
                    "ue5m3_t2048": 2048.0 if op.endswith(".dy") else 448.0,
                    "ue5m3_t448": 448.0,
                    "ue5m3_t2048_all_dy": 2048.0 if op.endswith(".dy") else 448.0,
                    "mxfp4": math.nan,
                }[recipe]
                rows.append(
                    {
                        "step": step,
                        "layer": layer,
                        "operand": op,
                        "steps_since_refresh": step % 10,
                        "blocks": 64,
                        "saturated_blocks": 0,
                        "underflow_blocks": 1,
                        "nonzero_elements": 1024,
                        "clipped_elements": 0,
                        "target": t,
                    }
                )
    table = pd.DataFrame(rows, columns=TELEMETRY)
    return table if with_target else table.drop(columns=["target"])


def write_target_runs(root: Path, recipes: dict[str, bool]) -> list[Path]:
    """Telemetry of each recipe (-> whether its table has the target column); bf16's empty one too."""
    paths = []
    for recipe, with_target in {"bf16": True, **recipes}.items():
        path = root / "results" / "toy" / "train" / recipe / "seed0" / "telemetry.parquet"
        path.parent.mkdir(parents=True)
        table = pd.DataFrame(columns=TELEMETRY) if recipe == "bf16" else _target_telemetry(recipe, with_target)
        table.to_parquet(path, index=False)
        paths.append(path)
    return paths


def test_target_draws_the_automatic_T_per_class_with_the_fixed_T_as_references(tmp_path):
    inputs = write_target_runs(tmp_path, {"ue5m3": True, "ue5m3_t8192": True, "mxfp4": True, "ue5m3_auto": True})
    fig = plot_figure("target", inputs, tmp_path / "target.png")
    assert_figure(tmp_path / "target.png")
    table = _target_telemetry("ue5m3_auto")
    for cls, ops in {
        "activations": ("fprop.x", "wgrad.x"),
        "weights": ("fprop.w", "dgrad.w"),
        "gradients": ("dgrad.dy", "wgrad.dy"),
    }.items():
        ax = axis(fig, f"target:{cls}")
        assert ax.get_yscale() == "log"
        steps = sorted(table["step"].unique())
        # the expected values straight from the known sequence, over the class's operands and all layers
        values = [[auto_t(step, k, op) for k in range(len(TARGET_LAYERS)) for op in ops] for step in steps]
        line = artist(ax, f"median:ue5m3_auto:{cls}")
        np.testing.assert_array_equal(line.get_xdata(), steps)
        np.testing.assert_array_equal(line.get_ydata(), [np.median(v) for v in values])
        band = artist(ax, f"band:ue5m3_auto:{cls}").get_paths()[0].vertices[:, 1]
        assert set(np.round(band, 6)) == {min(v) for v in values} | {max(v) for v in values}
        # the fixed recipes: 448 and 8192 as references; mxfp4 (no tensor scale) none
        fixed = sorted(a.get_gid() for a in ax.lines if (a.get_gid() or "").startswith("fixed:"))
        assert fixed == [f"fixed:{cls}:448", f"fixed:{cls}:8192"]
        assert artist(ax, f"fixed:{cls}:8192").get_ydata()[0] == 8192
        texts = " ".join(t.get_text() for t in ax.texts)
        assert "T = 448: ue5m3" in texts and "T = 8192: ue5m3_t8192" in texts and "mxfp4" not in texts
    assert "ue5m3_auto: T 448–8192, last median 4096" in " ".join(
        t.get_text() for t in axis(fig, "target:weights").texts
    )


def test_target_without_an_automatic_recipe_says_so(results, tmp_path):
    fig = draw_figure("target", inputs_of(results, "target"))
    text = " ".join(t.get_text() for t in axis(fig, "none").texts)
    assert "No recipe with an automatic target T" in text and "nvfp4, ue5m3, ue5m3_t2048" in text
    assert not [ax for ax in fig.axes if ax.get_label().startswith("target:")]
    # a table written before T was recorded: its recipe's fixed T comes from the recipe file, marked *
    inputs = write_target_runs(tmp_path, {"ue5m3_t448": True, "ue5m3_t2048_all_dy": False})
    fig = draw_figure("target", inputs)
    text = " ".join(t.get_text() for t in axis(fig, "none").texts)
    assert "gradients: 448 (ue5m3_t448); 2048 (ue5m3_t2048_all_dy*)" in text
    assert "activations: 448 (ue5m3_t2048_all_dy*, ue5m3_t448)" in text


# ---------------------------------------------------------------------------------- throughput


def _throughput_file(path: Path, model: str, device: str = "NVIDIA H200") -> Path:
    """A body-throughput file as ``fp4repro bench throughput`` writes it (recorded numbers)."""
    from fp4repro.bench import throughput

    def rows(scale):
        out = {}
        for name, ms in {"bf16": 900.0, "nvfp4": 1000.0, "nvfp4_no_rht_no_bf16_tail": 990.0, "ue5m3": 920.0}.items():
            out[name] = {
                **throughput.summarize([ms * scale * f for f in (0.99, 1.0, 1.0, 1.0, 1.01)], 8192),
                "peak_mib": 1.0,
                "kernels": None,
            }
        return out

    columns = {}
    for column, scale in (("emulated", 1.0), ("fp8_analogue", 0.95)):
        r = rows(scale)
        columns[column] = {"recipes": r, "effects": throughput.effects({n: v["ms"] for n, v in r.items()})}
    columns["fp8_analogue"]["cast"] = "saturating"
    entry = {
        "model": model,
        "seq_len": 8192,
        "batch": 1,
        "steps": 5,
        "warmup": 1,
        "device": device,
        "columns": columns,
        "not_measured": dict(throughput.NOT_MEASURED),
    }
    throughput.record(path, entry, "cpu")
    return path


def test_throughput_draws_tokens_per_second_per_column_and_says_what_was_not_measured(tmp_path):
    inputs = [_throughput_file(tmp_path / "throughput_h200.json", "nemotron_h_8b")]
    _throughput_file(inputs[0], "small")
    with pytest.raises(PlotError, match="shapes of nemotron_h_8b, small; pass --model"):
        plot_figure("throughput", inputs, tmp_path / "t.png")
    with no_overlap():
        fig = plot_figure("throughput", inputs, tmp_path / "t.png", model="nemotron_h_8b")
    assert_figure(tmp_path / "t.png")
    emulated, analogue, projection, native = (
        axis(fig, f"throughput:{c}") for c in ("emulated", "fp8_analogue", "projection", "native")
    )
    widths = [p.get_width() for p in emulated.patches]
    assert widths == pytest.approx([8192 / 0.9, 8192 / 1.0, 8192 / 0.99, 8192 / 0.92])  # bf16 first
    assert [t.get_text() for t in emulated.get_yticklabels()] == ["bf16", "nvfp4", "nvfp4_no_rht_no_bf16_tail", "ue5m3"]
    assert [p.get_width() for p in analogue.patches] == pytest.approx([w / 0.95 for w in widths])
    assert "x1.010 [1.010, 1.010]" in emulated.get_title()
    assert not emulated.texts  # no number beside each bar: the panel's one message is its title's speed-up
    assert "compute capability >= 10.0" in " ".join(native.texts[0].get_text().split())
    assert "not made yet" in projection.texts[0].get_text()
    assert emulated.get_ylabel().endswith("median of 5 steps")  # recorded without a timing: eager
    data = json.loads(inputs[0].read_text())
    for column in data["shapes"]["small 1x8192"]["columns"].values():
        column["timing"] = "cuda_graph"
    inputs[0].write_text(json.dumps(data))
    fig = rendered(draw_figure("throughput", inputs, model="small"))
    assert axis(fig, "throughput:emulated").get_ylabel().endswith("median of 5 graph replays")
    fig = rendered(draw_figure("throughput", inputs, model="tiny"))  # the measured ones, said (the tiny study's)
    assert fig._suptitle.get_text().startswith("tiny's shapes not measured; shown: nemotron_h_8b, small's")
    assert len(fig.axes) == 8
    # an analogue measured before its cast clamped (no cast record) is void, said in its panel
    void = json.loads(inputs[0].read_text())
    del void["shapes"]["nemotron_h_8b 1x8192"]["columns"]["fp8_analogue"]["cast"]
    (tmp_path / "void").mkdir()
    (tmp_path / "void" / "throughput_h200.json").write_text(json.dumps(void))
    fig = rendered(draw_figure("throughput", [tmp_path / "void"], model="nemotron_h_8b"))
    assert "void: made before the FP8 cast clamped" in " ".join(
        axis(fig, "throughput:fp8_analogue").texts[0].get_text().split()
    )
    assert not axis(fig, "throughput:fp8_analogue").patches
    # a projected GPU is a panel of its own: bars at the central time, whiskers over the band
    projected = json.loads(inputs[0].read_text())
    entry = projected["shapes"]["nemotron_h_8b 1x8192"]
    entry["columns"]["projection_b200"] = {
        "kind": "projection",
        "target": "NVIDIA B200",
        "recipes": {
            n: {"median_ms": ms, "low_ms": ms * 0.8, "high_ms": ms * 1.25, "tokens_per_s": 8192 / ms * 1e3}
            for n, ms in {"bf16": 500.0, "nvfp4": 400.0, "nvfp4_no_rht_no_bf16_tail": 390.0}.items()
        },
        "effects": {
            "both": {"versus": "nvfp4_no_rht_no_bf16_tail", "speedup": 400 / 390, "ci_low": 1.01, "ci_high": 1.04}
        },
    }
    entry["projection_check"] = {"bound": 0.1, "worst_error": 0.05, "within": True}
    (tmp_path / "projected").mkdir()
    (tmp_path / "projected" / "throughput_h200.json").write_text(json.dumps(projected))
    fig = rendered(draw_figure("throughput", [tmp_path / "projected"], model="nemotron_h_8b"))
    b200 = axis(fig, "throughput:projection_b200")
    assert [p.get_width() for p in b200.patches] == pytest.approx([8192 / 0.5, 8192 / 0.4, 8192 / 0.39])
    whiskers = b200.containers[0][2][0].get_segments()  # the error bars: the band's ends in tokens/s
    assert [tuple(seg[:, 0]) for seg in whiskers][0] == pytest.approx((8192 / 0.625, 8192 / 0.4))
    title = " ".join(b200.get_title().split())
    assert "NVIDIA B200 projection" in title and "H200 check 5.0% <= 10%" in title and "[1.010, 1.040]" in title
    # the folder of the files: its files; a folder that does not exist holds none
    fig = draw_figure("throughput", [tmp_path], model="small")
    assert len(fig.axes) == 4
    # a model measured at two shapes (the paper's 1 x 1,024 beside 1 x 8,192): a column of panels each
    from fp4repro.bench import throughput

    paper = {**json.loads(inputs[0].read_text())["shapes"]["small 1x8192"], "seq_len": 1024}
    for column in paper["columns"].values():
        for row in column["recipes"].values():
            row["tokens_per_s"] = 1024 / (row["median_ms"] / 1e3)
    throughput.record(inputs[0], paper, "cpu")
    fig = rendered(draw_figure("throughput", inputs, model="small"))
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_label() == "throughput:emulated"]
    assert len(fig.axes) == 8 and sorted(label.split("\n")[1] for label in labels) == [
        "1 x 1,024 tokens",
        "1 x 8,192 tokens",
    ]
    fig = rendered(draw_figure("throughput", [tmp_path / "results" / "bench"]))
    assert "not measured for this model's shapes (looked in" in fig.axes[0].texts[0].get_text()


def test_the_not_measured_message_stays_in_its_figure_however_long_the_folder_it_names(tmp_path):
    # a path has no space to break at: the message wraps it, wherever a test or a user keeps results
    folder = tmp_path / ("results_of_a_study_kept_in_a_deeply_nested_folder_" * 3) / "bench"
    fig = rendered(draw_figure("throughput", [folder]))
    assert "".join(fig.axes[0].texts[0].get_text().split()).count(str(folder).replace(" ", "")) == 1


def test_a_full_disk_is_one_line_and_keeps_the_old_figure_and_its_pdf(results, tmp_path, capsys, full_disk):
    # issue 42: a full disk during `fp4repro plot` ended in a traceback and zlib.error, never "disk full"
    out = tmp_path / "figs" / "loss.png"
    inputs = [*map(str, inputs_of(results, "loss")), "--out", str(out)]
    assert main(["plot", "loss", *inputs]) == 0
    old = out.read_bytes(), out.with_suffix(".pdf").read_bytes()
    capsys.readouterr()
    full_disk("loss.png")
    assert main(["plot", "loss", *inputs]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fp4repro plot: error: disk full writing {out}; ")
    assert err.endswith(" bytes free; nothing was replaced\n")
    assert (out.read_bytes(), out.with_suffix(".pdf").read_bytes()) == old  # the PDF too: the pair stays whole
    assert sorted(p.name for p in out.parent.iterdir()) == ["loss.pdf", "loss.png"]


def _final_checkpoint_only(results: Path, seeds) -> None:
    """The evaluation tables of ``seeds`` cut to their final checkpoint (an experiment's
    eval.curve_seeds evaluates the other seeds there only)."""
    for table in ("nll", "nll_documents", "downstream", "downstream_items"):
        for seed in seeds:
            for path in results.glob(f"eval/*/seed{seed}/{table}.parquet"):
                rows = pd.read_parquet(path)
                rows[rows["step"] == CHECKPOINTS[-1]].to_parquet(path, index=False)


def test_curves_are_drawn_over_the_seeds_evaluated_at_every_checkpoint(tmp_path):
    results = write_results(tmp_path, (0, 1, 2))
    _final_checkpoint_only(results, (1, 2))
    nll = draw_figure("nll", inputs_of(results, "nll"), **EXTRA["nll"])  # steps of one seed: the document bootstrap
    seed0 = pd.read_parquet(results / "eval/nvfp4/seed0/nll.parquet").query("source == 'blend' and policy == 'bf16'")
    curve = artist(axis(nll, "nll:blend:bf16"), "mean:nvfp4")
    np.testing.assert_allclose(curve.get_ydata(), seed0.sort_values("step")["nll"])  # no jump at the last point
    assert "\ncurves over 1 seed, the other seeds at their final checkpoint only" in nll._suptitle.get_text()
    # the final checkpoint's difference is still over all three seeds
    final = [
        pd.read_parquet(results / f"eval/{r}/seed{s}/nll.parquet")
        .query(f"step == {CHECKPOINTS[-1]} and policy == 'bf16' and source == 'blend'")["nll"]
        .iloc[0]
        for r in ("bf16", "nvfp4")
        for s in (0, 1, 2)
    ]
    documents = document_difference(*_seed_averaged_documents(results, CHECKPOINTS[-1]), BLEND)
    expected = seeds_and_items(np.array(final[:3]) - np.array(final[3:]), documents)
    segment = artist(axis(nll, "difference:bf16"), "interval:bf16:bf16").get_segments()[-1]
    assert (segment[0][1], segment[1][1]) == pytest.approx((expected.low, expected.high))
    down = draw_figure("downstream", inputs_of(results, "downstream"))
    rows = pd.read_parquet(results / "eval/nvfp4/seed0/downstream.parquet").query(
        "policy == 'bf16' and level == 'aggregate'"
    )
    a, m = rows["aggregate"].iloc[0], rows["metric"].iloc[0]
    (curve,) = [
        line
        for ax in down.axes
        if ax.get_title().startswith(f"{a} ({m})\n")
        for line in ax.lines
        if line.get_gid() == "curve:nvfp4:bf16"
    ]
    expected = rows[(rows["aggregate"] == a) & (rows["metric"] == m)].sort_values("step")["value"]
    np.testing.assert_allclose(curve.get_ydata(), expected)


def _with_replay_rows(results: Path, tmp_path: Path, figure: str, shift: float = 0.0) -> list[Path]:
    """The figure's ue5m3 and nvfp4 inputs copied under tmp_path, ue5m3's with its quantized rows
    again as replay rows (NLL and every downstream value raised by ``shift``), nvfp4's as they are
    (no replay)."""
    copied = []
    for path in inputs_of(results, figure, ("ue5m3", "nvfp4")):
        table = pd.read_parquet(path)
        if "/ue5m3/" in str(path) and "policy" in table:
            replay = table[table["policy"] == "quantized"].assign(policy="replay")
            if "nll_sum" in replay:
                replay = replay.assign(nll_sum=replay["nll_sum"] + shift * replay["predicted"])
            else:
                column = "nll" if "nll" in replay else "value"
                replay = replay.assign(**{column: replay[column] + shift})
            table = pd.concat([table, replay])
        target = tmp_path / path.relative_to(results.parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        table.to_parquet(target, index=False)
        copied.append(target)
    return copied


def test_a_policy_the_baseline_was_not_evaluated_under_pairs_it_under_the_current_amax(results, tmp_path):
    # ue5m3 under its own replay policy, nvfp4 under quantized only: the replay column sets one
    # beside the other, as the claims do, and says so
    copied = _with_replay_rows(results, tmp_path, "nll", shift=0.01)
    fig = draw_figure("nll", copied, **EXTRA["nll"])
    replay, quantized = axis(fig, "difference:replay"), axis(fig, "difference:quantized")
    assert replay.get_title().splitlines()[:2] == [
        "blend NLL − nvfp4's, replay policy",
        "nvfp4 under quantized: it has no replay rows",
    ]
    assert "nvfp4 under" not in quantized.get_title()
    shifted = artist(replay, "difference:ue5m3:replay").get_ydata()
    np.testing.assert_allclose(shifted, artist(quantized, "difference:ue5m3:quantized").get_ydata() + 0.01)
    documents = {p.parent.parent.name: p for p in copied if p.name == "nll_documents.parquet"}
    docs = [
        pd.read_parquet(documents[r]).query(f"step == {CHECKPOINTS[-1]} and policy == '{p}'")
        for r, p in (("ue5m3", "replay"), ("nvfp4", "quantized"))
    ]
    expected = document_difference(*docs, BLEND)
    last = artist(replay, "interval:ue5m3:replay").get_segments()[-1]
    assert (last[0][1], last[1][1]) == pytest.approx((expected.low, expected.high))

    # a recipe without quantization is not set beside nvfp4 quantized: with no nvfp4 bf16 rows,
    # the bf16 column has nothing to pair
    copied = _with_replay_rows(results, tmp_path / "q", "nll")
    for path in copied:
        if "/nvfp4/" in str(path):
            table = pd.read_parquet(path)
            table[table["policy"] != "bf16"].to_parquet(path, index=False)
    title = axis(draw_figure("nll", copied, **EXTRA["nll"]), "difference:bf16").get_title()
    assert title.splitlines()[-1] == "no intervals: no recipe shares a seed and a checkpoint with nvfp4 under it"


@pytest.mark.parametrize("fixture", ["results", "results_seeds"])  # one seed: items alone; three: t over seeds too
def test_the_downstream_replay_column_pairs_the_recipe_under_replay_with_nvfp4_under_quantized(
    fixture, request, tmp_path
):
    results = request.getfixturevalue(fixture)
    down = draw_figure("downstream", _with_replay_rows(results, tmp_path, "downstream", shift=0.05))
    replay, quantized = axis(down, "difference:replay"), axis(down, "difference:quantized")
    assert replay.get_title().splitlines() == ["policy replay", "nvfp4 under quantized: it has no replay rows"]
    # every ue5m3 item 0.05 higher under replay: each difference and interval 0.05 higher
    for part in ("difference", "interval"):
        shifted, plain = (artist(ax, f"{part}:ue5m3:{p}") for ax, p in ((replay, "replay"), (quantized, "quantized")))
        if part == "difference":
            np.testing.assert_allclose(shifted.get_ydata(), plain.get_ydata() + 0.05, atol=1e-12)
        else:
            np.testing.assert_allclose(
                np.array(shifted.get_segments()), np.array(plain.get_segments()) + [0, 0.05], atol=1e-12
            )


def test_a_policy_the_baseline_has_no_rows_to_pair_under_says_it_has_no_intervals(results, tmp_path):
    copied = _with_replay_rows(results, tmp_path, "nll")
    for path in copied:  # nvfp4 under bf16 alone: nothing to read it under in the replay column
        if "/nvfp4/" in str(path):
            table = pd.read_parquet(path)
            table[table["policy"] == "bf16"].to_parquet(path, index=False)
    title = axis(draw_figure("nll", copied, **EXTRA["nll"]), "difference:replay").get_title()
    assert title.splitlines() == [
        "blend NLL − nvfp4's, replay policy",
        "no intervals: no recipe shares a seed and a checkpoint with nvfp4 under it",
    ]
