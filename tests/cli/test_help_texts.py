"""The help of ``fp4repro`` and of every subcommand, pinned: reorganizing the command line must
not change a word of what ``--help`` prints.

The fixture help_texts.json maps each command ("fp4repro", "fp4repro bench", ...) to its help at a
fixed width. After an intended change of a help text, rewrite it with

    .venv/bin/python tests/cli/test_help_texts.py --write
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from pathlib import Path

FIXTURE = Path(__file__).with_name("help_texts.json")
#: argparse wraps help to the terminal's width, read from $COLUMNS: fixed, so the text is the
#: same in any terminal and under pytest.
COLUMNS = "100"


def help_texts(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The help of ``parser`` and of every subparser below it, recursively, by command (the prog)."""
    texts = {parser.prog: parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                texts.update(help_texts(child))
    return texts


def current_help_texts() -> dict[str, str]:
    from fp4repro.cli import build_parser

    return help_texts(build_parser())


def test_every_help_text_is_unchanged(monkeypatch):
    monkeypatch.setenv("COLUMNS", COLUMNS)
    expected = json.loads(FIXTURE.read_text())
    actual = current_help_texts()
    assert sorted(actual) == sorted(expected), (
        f"commands added: {sorted(set(actual) - set(expected))}, removed: {sorted(set(expected) - set(actual))}"
    )
    changed = [command for command in expected if actual[command] != expected[command]]
    diffs = "".join(
        "".join(
            difflib.unified_diff(
                expected[c].splitlines(keepends=True),
                actual[c].splitlines(keepends=True),
                f"{c} --help (fixture)",
                f"{c} --help (now)",
            )
        )
        for c in changed
    )
    assert not changed, f"the help of {', '.join(repr(c) for c in changed)} changed:\n{diffs}"


if __name__ == "__main__":
    os.environ["COLUMNS"] = COLUMNS
    texts = current_help_texts()
    if sys.argv[1:] == ["--write"]:
        FIXTURE.write_text(json.dumps(texts, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {FIXTURE}: {len(texts)} commands")
    else:
        print(json.dumps(texts, indent=1, ensure_ascii=False))
