"""Offline tasks: deterministic, well formed, drawn from the held-out documents only."""

import json

from fp4repro.config.eval import default_aggregates
from fp4repro.eval import write_offline_tasks
from fp4repro.eval.tasks import N_CHOICES, WORD, heldout_documents


def _items(folder, name):
    return [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()]


def test_tasks_are_deterministic(manifest, tmp_path):
    a = write_offline_tasks(manifest, tmp_path / "a", n_items=8, seed=3)
    b = write_offline_tasks(manifest.root, tmp_path / "b", n_items=8, seed=3)
    assert a == b == {f"fp4repro_{s}_{k}": 8 for s in ("prose", "code") for k in ("next_line", "cloze")}
    for name in a:
        assert (tmp_path / "a" / f"{name}.jsonl").read_bytes() == (tmp_path / "b" / f"{name}.jsonl").read_bytes()
    write_offline_tasks(manifest, tmp_path / "c", n_items=8, seed=4)
    assert (tmp_path / "c" / "fp4repro_code_cloze.jsonl").read_bytes() != (
        tmp_path / "a" / "fp4repro_code_cloze.jsonl"
    ).read_bytes()


def test_items_come_from_held_out_documents(manifest, offline_tasks):
    docs = heldout_documents(manifest)
    for source in ("prose", "code"):
        for kind in ("next_line", "cloze"):
            for item in _items(offline_tasks, f"fp4repro_{source}_{kind}"):
                choices, label = item["choices"], item["label"]
                assert len(choices) == len(set(choices)) == N_CHOICES and 0 <= label < N_CHOICES
                truth = item["context"] + choices[label]
                home = [d for d in docs[source] if truth in d]
                assert home, "the context and the true answer continue a test document"
                assert truth in docs[source][item["document"]], "the item names the document it was cut from"
                own = (
                    {line.strip() for line in home[0].split("\n")}
                    if kind == "next_line"
                    else set(WORD.findall(home[0]))
                )
                assert not own & {c for i, c in enumerate(choices) if i != label}, "distractors come from elsewhere"


def test_default_aggregates_name_three_groups():
    assert default_aggregates(["prose", "code"]) == {
        "prose_next_line": ["fp4repro_prose_next_line"],
        "code_next_line": ["fp4repro_code_next_line"],
        "cloze": ["fp4repro_prose_cloze", "fp4repro_code_cloze"],
    }
