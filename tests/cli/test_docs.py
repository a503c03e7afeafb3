"""fp4repro docs: the pages that give measurements are rendered from the committed result files,
and a page out of date with its files is caught."""

import json
import shutil
from pathlib import Path

import pytest

from fp4repro.cli import main
from fp4repro.cli.docs import benchmarks_page, readme

REPO = Path(__file__).resolve().parents[2]


def test_a_changed_benchmark_number_makes_its_page_stale(tmp_path):
    shutil.copytree(REPO / "results/bench", tmp_path / "results/bench")
    committed = (REPO / "docs/results/benchmarks.md").read_text()
    assert benchmarks_page(tmp_path) == committed
    kernels = tmp_path / "results/bench/kernels_h200.json"
    record = json.loads(kernels.read_text())
    copy_row = record["quantize"][0]
    assert f"{copy_row['gb_per_s']:>7.0f}" in committed
    copy_row["gb_per_s"] = 1234.0
    kernels.write_text(json.dumps(record))
    page = benchmarks_page(tmp_path)
    assert page != committed and "   1234 " in page


def test_the_readme_timings_render_from_their_file_and_go_stale_with_it(tmp_path):
    text = "before\n<!-- fp4repro docs: timings -->\nold\n<!-- fp4repro docs: end -->\nafter\n"
    (tmp_path / "results").mkdir()
    timings = {"test": {"seconds": 750.0, "machine": "2 cores, 24 GiB, x86_64, no GPU", "commit": "0123456789"}}
    (tmp_path / "results/timings.json").write_text(json.dumps(timings))
    rendered = readme(tmp_path, text)
    assert rendered.startswith("before\n<!-- fp4repro docs: timings -->\n") and rendered.endswith("after\n")
    assert "| `make test` | 12.5 min | 2 cores, 24 GiB, x86_64, no GPU | 0123456 |" in rendered
    timings["test"]["seconds"] = 810.0
    (tmp_path / "results/timings.json").write_text(json.dumps(timings))
    assert readme(tmp_path, rendered) != rendered and "13.5 min" in readme(tmp_path, rendered)


def test_an_unknown_readme_block_is_named():
    with pytest.raises(ValueError, match="unknown generated block 'nothing'"):
        readme(REPO, "<!-- fp4repro docs: nothing -->\nx\n<!-- fp4repro docs: end -->\n")


def test_the_committed_pages_are_current_and_check_names_a_stale_one(tmp_path, monkeypatch, capsys):
    """A copy of the checkout's results and pages with one page edited: the check names that page
    alone (every other committed page equals what its files give) and writes nothing."""
    monkeypatch.chdir(REPO)  # configs resolve in ./configs first, as when a user runs it
    root = tmp_path / "checkout"
    for part in ("results/bench", "results/megatron", "results/small", "results/small_v2", "results/small_v1", "docs"):
        shutil.copytree(REPO / part, root / part)
    shutil.copy(REPO / "README.md", root / "README.md")
    if (REPO / "results/timings.json").is_file():
        shutil.copy(REPO / "results/timings.json", root / "results/timings.json")
    page = root / "docs/results/benchmarks.md"
    page.write_text(page.read_text().replace("BF16 copy (ceiling)", "BF16 copy", 1))
    before = page.read_text()
    assert main(["docs", "--check", "--root", str(root)]) == 1
    assert capsys.readouterr().out == f"out of date: {page} (run `fp4repro docs`)\n"
    assert page.read_text() == before


def test_the_recipe_guides_example_is_a_recipe_that_does_what_the_guide_says(tmp_path, monkeypatch, capsys):
    """docs/recipes-guide.md's own recipe, written where the guide says, checked with the guide's
    command: the base's override kept and widened to dgrad's dY on the 8B's last four fc2."""
    guide = (REPO / "docs/recipes-guide.md").read_text()
    example = guide.split("```yaml\n# configs/recipes/ue5m3_fc2_dy2048.yaml\n")[1].split("```")[0]
    command = guide.split("```bash\nfp4repro recipe ue5m3_fc2_dy2048")[1].split("#")[0].split()
    (tmp_path / "configs/recipes").mkdir(parents=True)
    (tmp_path / "configs/recipes/ue5m3_fc2_dy2048.yaml").write_text(example)
    monkeypatch.chdir(tmp_path)
    assert main(["recipe", "ue5m3_fc2_dy2048", *command]) == 0
    printed = capsys.readouterr().out
    widened = printed.split("layers 45, 47, 49, 51 (fc2):\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in widened] == ["dgrad.dy", "wgrad.dy"]
    assert all(" T=2048 " in line for line in widened)
