"""A check that no two texts of a drawn figure overprint each other (titles, suptitles, axis and
tick labels, annotations, legend texts, bar labels), and that none reaches far past the figure's
edge: the figures are saved with ``bbox_inches="tight"``, which widens the image to take such a
text in, so a title wider than its figure leaves the panels a narrow part of a wide image.

    assert_no_overlap(fig)  # draws fig, fails naming each pair of texts that collide and each
                            # text past the figure's edge
    with no_overlap():      # checks every draw of the block for collisions instead (a savefig
        plot_figure(...)    # draws the figure anyway: no second rendering)

A text counts when it is painted: visible, with a non-empty string, and drawn by the figure's draw.
Taking ``fig.findobj(Text)`` alone would also count texts that are never painted although they say
they are visible (tick labels of ticks outside the view limits, which matplotlib keeps for reuse;
axes switched off with ``ax.axis("off")``; annotations outside their axes), so the texts are
recorded as they paint themselves, each with its window extent under the renderer that paints it.

Two texts collide when their boxes share more than ``TOLERANCE`` pixels both across and down,
measured at the figures' 100 dpi (``plots.common.theme``) whatever the dpi of the draw (a PNG
saved at 150 dpi, the PDF at 72). One pixel: a text's box already holds its font's ascent and
descent, so two lines stacked as close as matplotlib stacks them (a tick label and its axis label,
two lines of a legend) may touch or share an antialiased edge without a glyph touching another;
more than a pixel shared both ways is where strokes start to cross.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

TOLERANCE = 1.0  # pixels at DPI (see the module's docstring)
#: pixels at DPI a text may reach past its figure's edge: a legend hung just below the panels, the
#: last tick label of a panel at the edge
OUTSIDE = 10.0
DPI = 100.0  # the figures' dpi (plots.common.theme), in which the tolerance is measured


@contextlib.contextmanager
def painted_texts() -> Iterator[dict[int, list[tuple[Text, np.ndarray]]]]:
    """For every draw in the block (keyed by its renderer), each text painted and its box
    [x0, y0, x1, y1] in pixels at ``DPI``."""
    draws: dict[int, list[tuple[Text, np.ndarray]]] = {}
    draw = Text.draw

    def recording(self, renderer):
        # Text.draw paints nothing for an invisible or empty text (an annotation whose point is
        # outside its axes returns before it calls Text.draw)
        if self.get_visible() and self.get_text().strip():
            box = self.get_window_extent(renderer)
            scale = DPI / self.get_figure(root=True).dpi
            draws.setdefault(id(renderer), []).append((self, scale * np.array([box.x0, box.y0, box.x1, box.y1])))
        return draw(self, renderer)

    Text.draw = recording
    try:
        yield draws
    finally:
        Text.draw = draw


def _where(text: Text) -> str:
    """Which part of the figure a text belongs to: its axes (label, else title, else its place
    among the figure's axes), else the (sub)figure whose text it is. Tick and axis labels do not
    know their axes (their ``axes`` is None): they are found among each axes' texts."""
    fig = text.get_figure(root=True)
    owner = next((ax for ax in fig.axes if any(t is text for t in ax.findobj(Text))), None)
    if owner is not None:
        label = owner.get_label()
        if not label or label.startswith("<"):  # matplotlib's default labels say nothing
            label = owner.get_title() or f"#{fig.axes.index(owner)}"
        return f"axes {label!r}"
    sub = text.get_figure(root=False)
    if sub is not None and sub is not fig:
        title = sub._suptitle.get_text() if getattr(sub, "_suptitle", None) else ""
        return f"subfigure {title[:40]!r}" if title else "a subfigure"
    return "the figure"


def overlaps(texts: list[tuple[Text, np.ndarray]], tolerance: float = TOLERANCE) -> list[str]:
    """One line per pair of ``texts`` (text, box) whose boxes share more than ``tolerance``
    pixels both across and down, naming both strings and where each is."""
    if not texts:
        return []
    boxes = np.array([b for _, b in texts])
    # the shared width and height of every pair of boxes (negative: apart)
    wide = np.minimum(boxes[:, None, 2], boxes[None, :, 2]) - np.maximum(boxes[:, None, 0], boxes[None, :, 0])
    tall = np.minimum(boxes[:, None, 3], boxes[None, :, 3]) - np.maximum(boxes[:, None, 1], boxes[None, :, 1])
    hits = np.argwhere(np.triu((wide > tolerance) & (tall > tolerance), k=1))
    return [
        f"{a.get_text()!r} ({_where(a)}) overlaps {b.get_text()!r} ({_where(b)}) "
        f"by {wide[i, j]:.0f} x {tall[i, j]:.0f} px"
        for i, j in hits
        for a, b in [(texts[i][0], texts[j][0])]
    ]


def outside_figure(texts: list[tuple[Text, np.ndarray]], tolerance: float = OUTSIDE) -> list[str]:
    """One line per text of ``texts`` (text, box) painted more than ``tolerance`` pixels past the
    edge of its (root) figure, naming the string, where it is and by how much."""
    found = []
    for text, box in texts:
        width, height = text.get_figure(root=True).get_size_inches() * DPI
        past = max(-box[0], box[2] - width, -box[1], box[3] - height)
        if past > tolerance:
            found.append(f"{text.get_text()!r} ({_where(text)}) reaches {past:.0f} px past the figure's edge")
    return found


def _fail(found: list[str]) -> None:
    shown = "\n  ".join(found[:20]) + (f"\n  ... and {len(found) - 20} more" if len(found) > 20 else "")
    raise AssertionError(f"{len(found)} text(s) overlapping or past the figure's edge:\n  {shown}")


@contextlib.contextmanager
def no_overlap(tolerance: float = TOLERANCE, within_figure: bool = False) -> Iterator[None]:
    """Fail, after the block, naming the texts that overlap in any draw made in the block, and with
    ``within_figure`` those past their figure's edge (for draws at the figure's own size: a savefig
    with ``bbox_inches="tight"`` draws on the tight box, which takes every text in); a block that
    draws nothing fails too (it would check nothing)."""
    with painted_texts() as draws:
        yield
    assert draws, "nothing was drawn in the block: no texts to check"
    for texts in draws.values():
        found = overlaps(texts, tolerance) + (outside_figure(texts) if within_figure else [])
        if found:
            _fail(found)


def assert_no_overlap(fig, tolerance: float = TOLERANCE) -> None:
    """Draw ``fig`` (on an Agg canvas: ``plt.close``, as ``draw_figure`` calls it, leaves a figure a
    canvas that draws nothing) and fail naming every pair of its texts that overlap and every text
    past its edge."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    with no_overlap(tolerance, within_figure=True):
        fig.canvas.draw()


def study_figures(results: Path, bench: list[Path], model: str) -> dict[str, tuple[list[Path], dict]]:
    """Each figure of a study (``results``: its results/<experiment>) with the inputs
    workflow/rules/figures.smk gives it, and its options: figure -> (inputs, options)."""

    def runs(*patterns):
        return [p for pattern in patterns for p in sorted(results.glob(pattern))]

    telemetry = runs("train/*/seed*/telemetry.parquet")
    return {
        "loss": (runs("train/*/seed*/metrics.parquet", "eval/*/seed*/final_loss.json"), {}),
        "nll": (runs("eval/*/seed*/nll.parquet", "eval/*/seed*/nll_documents.parquet"), {}),
        "downstream": (runs("eval/*/seed*/downstream.parquet", "eval/*/seed*/downstream_items.parquet"), {}),
        "telemetry": (telemetry, {}),
        "target": (telemetry, {}),
        "throughput": (bench, {"model": model}),
    }


def figures_overlapping(figures: dict[str, tuple[list[Path], dict]]) -> list[str]:
    """``study_figures``'s figures drawn (``draw_figure``) and checked: one entry per figure with
    overlapping texts (its name may carry a note after a space: "throughput (tiny)")."""
    from fp4repro.plots import draw_figure

    failures = []
    for name, (inputs, options) in figures.items():
        try:
            assert_no_overlap(draw_figure(name.split()[0], inputs, **options))
        except AssertionError as err:
            failures.append(f"figure {name}: {err}")
    return failures
