"""The overlap check (tests/plots/overlap.py) itself, and every figure of the committed small study
(results/small, results/bench) drawn and checked: no two texts overprint."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from overlap import assert_no_overlap, figures_overlapping, no_overlap, study_figures  # noqa: E402

from fp4repro.plots import FIGURES  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _figure():
    fig, ax = plt.subplots(figsize=(4, 3))
    plt.close(fig)  # as draw_figure leaves its figures: closed, on a canvas that draws nothing
    ax.set_label("panel")
    return fig, ax


def test_two_texts_on_top_of_each_other_are_named_with_their_axes():
    fig, ax = _figure()
    ax.text(0.5, 0.5, ".200", transform=ax.transAxes)
    ax.text(0.51, 0.5, ".300", transform=ax.transAxes)
    with pytest.raises(AssertionError, match=r"'\.200' \(axes 'panel'\) overlaps '\.300' \(axes 'panel'\)"):
        assert_no_overlap(fig)


def test_texts_apart_empty_or_invisible_pass():
    fig, ax = _figure()
    ax.text(0.1, 0.5, ".200", transform=ax.transAxes)
    ax.text(0.7, 0.5, ".300", transform=ax.transAxes)
    ax.text(0.1, 0.5, "", transform=ax.transAxes)  # empty: paints nothing
    ax.text(0.1, 0.5, "hidden", transform=ax.transAxes, visible=False)
    ax.annotate("outside", (5.0, 5.0), xytext=(0.1, 0.5), textcoords="axes fraction", annotation_clip=True)
    assert_no_overlap(fig)


def test_tick_labels_of_one_axis_and_a_title_over_a_suptitle_are_caught():
    fig, ax = _figure()
    ax.set_xticks(range(20), [f"label {i}" for i in range(20)])  # twenty wide labels on a 4-inch axis
    with pytest.raises(AssertionError, match=r"'label 0' \(axes 'panel'\) overlaps 'label 1' \(axes 'panel'\)"):
        assert_no_overlap(fig)
    fig, ax = _figure()
    ax.set_title("a title")
    fig.suptitle("a suptitle", y=0.9)  # pulled down onto the axes' title
    with pytest.raises(AssertionError, match=r"'a title' \(axes 'panel'\) overlaps 'a suptitle' \(the figure\)"):
        assert_no_overlap(fig)


def test_a_title_wider_than_its_figure_is_caught_and_a_narrower_one_passes():
    fig, ax = _figure()
    ax.set_title("a title " * 20)  # 160 characters over a 4-inch figure
    with pytest.raises(
        AssertionError, match=r"'a title a title .*' \(axes 'panel'\) reaches \d+ px past the figure's edge"
    ):
        assert_no_overlap(fig)
    fig, ax = _figure()
    ax.set_title("a title " * 4)
    assert_no_overlap(fig)


def test_a_block_that_draws_nothing_checks_nothing_and_fails():
    with pytest.raises(AssertionError, match="nothing was drawn"):
        with no_overlap():
            pass


def test_every_figure_of_the_committed_small_study_has_no_overlapping_texts():
    bench = [REPO / "results" / "bench" / "throughput_h200.json"]
    figures = study_figures(REPO / "results" / "small", bench, "small")
    # the tiny study's throughput figure: its model has no measured shapes, so it shows the
    # committed ones side by side (a second column, whose label ran into the suptitle)
    figures["throughput (tiny)"] = (bench, {"model": "tiny"})
    assert set(figures) - {"throughput (tiny)"} == set(FIGURES)  # a new figure joins this test
    for name, (inputs, _) in figures.items():
        assert inputs and all(p.exists() for p in inputs), f"{name}: committed inputs missing"
    failures = figures_overlapping(figures)
    assert not failures, "\n".join(failures)
