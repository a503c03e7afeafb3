"""Offline downstream tasks: lm-eval multiple-choice tasks built from held-out (test split) documents.

For every source of the prepared data, two tasks of four choices each (chance = 0.25):

    fp4repro_<source>_next_line   a few lines of a document, then the true next line among three
                                  distractors: lines of similar length from other documents of
                                  the same source (never a line of its own document). The next
                                  line's indentation ends the context, so the choices differ in
                                  content, not in whitespace.
    fp4repro_<source>_cloze       a document up to a held-out word or identifier (4+ characters,
                                  not a Python keyword, not among the source's most frequent
                                  words), then that word among three distractors of similar
                                  length from other documents of the same source.

Documents come from the test split's token stream, decoded with the tokenizer (byte-level BPE
decodes exactly to the stored, normalized text). Everything is a function of the documents,
``n_items`` and ``seed``: the same inputs write byte-identical files.

Files written to ``out_dir``: ``<task>.jsonl`` (fields id, context, choices, label, and document: the
index of the held-out document the item was cut from, so that a paired test can resample
documents rather than items) and
``<task>.yaml`` (an lm-eval task over that file, metrics acc and acc_norm), and
``fp4repro_offline.yaml``, a group of the default aggregates, so that the command-line
``lm_eval --include_path <out_dir> --tasks fp4repro_offline`` runs the same thing.
"""

from __future__ import annotations

import bisect
import json
import keyword
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from fp4repro.config.eval import default_aggregates, task_name
from fp4repro.util import atomic_write_text

TASKS_FORMAT = 2  # bump when item generation changes, so that stored tasks are rebuilt (2: each item's document)
N_CHOICES = 4
CONTEXT_LINES = 4  # at most this many lines before the next line / the cloze line
CONTEXT_CHARS = 400  # ... and at most this many characters of context
MIN_LINE_CHARS = 12  # a next line must have this much non-blank text ...
MAX_LINE_CHARS = 160  # ... and at most this much
MIN_CLOZE_CONTEXT = 40  # a cloze context has at least this many non-blank characters
WORD = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z_][A-Za-z0-9_]{3,}(?![A-Za-z0-9_])")
FREQUENT_WORDS = 50  # the source's most frequent words are never cloze targets
LENGTH_NEIGHBOURS = 40  # distractors are drawn from this many candidates nearest in length
TASK_KINDS = ("next_line", "cloze")


@dataclass(frozen=True)
class Item:
    context: str
    choices: tuple[str, ...]
    label: int
    document: int  # the held-out document the item was cut from: its index in the source's test split


# ---------------------------------------------------------------------------------- documents


def split_documents(stream: np.ndarray, eod_id: int) -> list[np.ndarray]:
    """The documents of a token stream in which every document ends with EOD."""
    ends = np.flatnonzero(stream == eod_id)
    starts = np.concatenate([[0], ends[:-1] + 1]) if len(ends) else np.zeros(0, dtype=np.int64)
    docs = [stream[s:e] for s, e in zip(starts, ends)]
    if len(ends) == 0 and len(stream):
        docs = [stream]
    return [d for d in docs if len(d)]


def heldout_documents(manifest, split: str = "test") -> dict[str, list[str]]:
    """The decoded texts of each source's ``split`` documents, in stored order."""
    from fp4repro.data import validation_tokens

    tokenizer = manifest.load_tokenizer()
    out = {}
    for source in manifest.source_names:
        if split not in manifest.splits(source):
            out[source] = []
            continue
        docs = split_documents(validation_tokens(manifest, source, split), manifest.eod_id)
        out[source] = tokenizer.decode_batch([d.tolist() for d in docs], skip_special_tokens=False)
    return out


# -------------------------------------------------------------------------------- next line


def _context_before(lines: list[str], index: int, prefix: str = "") -> str:
    """Up to CONTEXT_LINES lines before ``lines[index]`` (and at most CONTEXT_CHARS characters,
    whole lines only), each ending in a newline, followed by ``prefix``."""
    taken: list[str] = []
    size = len(prefix)
    for line in reversed(lines[max(0, index - CONTEXT_LINES) : index]):
        if taken and size + len(line) + 1 > CONTEXT_CHARS:
            break
        taken.append(line)
        size += len(line) + 1
    return "".join(line + "\n" for line in reversed(taken)) + prefix


def _next_line_candidates(docs: list[str]) -> list[tuple[int, int]]:
    """(document, line) positions whose line can be a next-line target: enough text, not too
    long, and at least one non-blank line of context before it."""
    found = []
    for d, doc in enumerate(docs):
        lines = doc.split("\n")
        seen_text = False
        for i, line in enumerate(lines):
            body = line.strip()
            if seen_text and MIN_LINE_CHARS <= len(body) <= MAX_LINE_CHARS:
                found.append((d, i))
            seen_text = seen_text or bool(body)
    return found


def _distractors(
    true: str, pool: list[str], pool_lengths: list[int], exclude: set[str], rng: random.Random, n: int = N_CHOICES - 1
) -> list[str] | None:
    """``n`` distinct strings from ``pool`` (sorted by length) near ``true`` in length, none equal
    to it (ignoring case) or in ``exclude`` (what the item's own document holds); None when the
    pool is too small."""
    centre = bisect.bisect_left(pool_lengths, len(true))
    lo = max(0, centre - LENGTH_NEIGHBOURS // 2)
    window = pool[lo : lo + LENGTH_NEIGHBOURS]
    options = sorted({p for p in window if p.lower() != true.lower() and p not in exclude})
    if len(options) < n:
        return None
    return rng.sample(options, n)


def _shuffled(true: str, distractors: list[str], rng: random.Random) -> tuple[tuple[str, ...], int]:
    choices = [true, *distractors]
    rng.shuffle(choices)
    return tuple(choices), choices.index(true)


def _sorted_pool(strings) -> tuple[list[str], list[int]]:
    pool = sorted(set(strings), key=lambda s: (len(s), s))
    return pool, [len(s) for s in pool]


def next_line_items(docs: list[str], n_items: int, rng: random.Random) -> list[Item]:
    """Up to ``n_items`` next-line items from ``docs`` (distinct positions, sampled uniformly)."""
    candidates = _next_line_candidates(docs)
    split = [doc.split("\n") for doc in docs]
    pool, lengths = _sorted_pool(split[d][i].strip() for d, i in candidates)
    own_lines = [{line.strip() for line in lines} for lines in split]
    items = []
    for d, i in rng.sample(candidates, len(candidates)):
        line = split[d][i]
        true = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        distractors = _distractors(true, pool, lengths, own_lines[d], rng)
        if distractors is None:
            continue
        choices, label = _shuffled(true, distractors, rng)
        items.append(Item(_context_before(split[d], i, indent), choices, label, d))
        if len(items) == n_items:
            break
    return items


# ------------------------------------------------------------------------------------ cloze


def _words(docs: list[str]) -> Counter:
    return Counter(m.group() for doc in docs for m in WORD.finditer(doc))


def cloze_items(docs: list[str], n_items: int, rng: random.Random) -> list[Item]:
    """Up to ``n_items`` cloze items: context up to a word, the word among similar-length words
    that its document does not contain."""
    counts = _words(docs)
    frequent = {w for w, _ in counts.most_common(FREQUENT_WORDS)} | set(keyword.kwlist)
    pool, lengths = _sorted_pool(w for w in counts if w not in frequent)
    split = [doc.split("\n") for doc in docs]
    candidates = [
        (d, i, m.start(), m.group())
        for d, lines in enumerate(split)
        for i, line in enumerate(lines)
        for m in WORD.finditer(line)
        if m.group() not in frequent
    ]
    own_words = [set(_words([doc])) for doc in docs]
    items = []
    for d, i, col, word in rng.sample(candidates, len(candidates)):
        context = _context_before(split[d], i, split[d][i][:col])
        if len(context.strip()) < MIN_CLOZE_CONTEXT:
            continue
        distractors = _distractors(word, pool, lengths, own_words[d], rng)
        if distractors is None:
            continue
        choices, label = _shuffled(word, distractors, rng)
        items.append(Item(context, choices, label, d))
        if len(items) == n_items:
            break
    return items


# ---------------------------------------------------------------------------------- writing

MAKERS = {"next_line": next_line_items, "cloze": cloze_items}


def make_items(docs: list[str], kind: str, source: str, n_items: int, seed: int) -> list[Item]:
    """The items of one task; its own random stream, so tasks do not depend on each other."""
    return MAKERS[kind](docs, n_items, random.Random(f"{seed}:{source}:{kind}"))


def task_yaml(name: str, jsonl: Path, description: str, source: str, n_items: int, seed: int) -> dict:
    """An lm-eval multiple-choice task config over a local JSONL file."""
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(jsonl.resolve())}},
        "output_type": "multiple_choice",
        "test_split": "test",
        "doc_to_text": "context",
        "doc_to_choice": "choices",
        "doc_to_target": "label",
        "target_delimiter": "",
        "num_fewshot": 0,
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
        "metadata": {"version": 1.0, "description": description, "source": source, "n_items": n_items, "seed": seed},
    }


def group_config(name: str, tasks: list, metric: str = "acc", weight_by_size: bool = False) -> dict:
    """An lm-eval group: the mean ``metric`` of its tasks (unweighted by default), with lm-eval's
    standard error of that mean."""
    return {
        "group": name,
        "task": list(tasks),
        "aggregate_metric_list": [{"metric": metric, "aggregation": "mean", "weight_by_size": weight_by_size}],
        "metadata": {"version": 1.0},
    }


DESCRIPTIONS = {
    "next_line": "the true next line of a held-out {source} document among {n} lines of similar length",
    "cloze": "a held-out word or identifier of a {source} document among {n} words of similar length",
}


def write_offline_tasks(
    manifest_or_data_dir, out_dir: str | Path, n_items: int = 200, seed: int = 1234, split: str = "test"
) -> dict[str, int]:
    """Generate the offline tasks from the held-out documents of a prepared data folder (or its
    ``Manifest``) into ``out_dir``; returns {task name: number of items}.

    Deterministic: the same data, ``n_items`` and ``seed`` write the same bytes. Files are written
    atomically, so a concurrent reader sees either the old or the new version of each.
    """
    from fp4repro.data import Manifest, load_manifest

    manifest = (
        manifest_or_data_dir
        if isinstance(manifest_or_data_dir, Manifest)
        else load_manifest(Path(manifest_or_data_dir))
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for source, docs in heldout_documents(manifest, split).items():
        for kind in TASK_KINDS:
            name = task_name(source, kind)
            items = make_items(docs, kind, source, n_items, seed)
            jsonl = out_dir / f"{name}.jsonl"
            atomic_write_text(
                jsonl,
                "".join(
                    json.dumps(
                        {
                            "id": k,
                            "context": it.context,
                            "choices": list(it.choices),
                            "label": it.label,
                            "document": it.document,
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                    for k, it in enumerate(items)
                ),
            )
            description = DESCRIPTIONS[kind].format(source=source, n=N_CHOICES)
            config = task_yaml(name, jsonl, description, source, n_items, seed)
            atomic_write_text(out_dir / f"{name}.yaml", yaml.safe_dump(config, sort_keys=False))
            counts[name] = len(items)
    groups = [group_config(agg, tasks) for agg, tasks in default_aggregates(manifest.source_names).items()]
    atomic_write_text(
        out_dir / "fp4repro_offline.yaml",
        yaml.safe_dump({"group": "fp4repro_offline", "task": groups, "metadata": {"version": 1.0}}, sort_keys=False),
    )
    return counts
