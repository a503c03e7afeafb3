"""Corpora: the standard-library reader, normalization, deduplication, splits, user-file errors."""

import ast
import json
import random
import re

import pytest

from fp4repro.config.experiment import Source
from fp4repro.data import DataError
from fp4repro.data.corpus import (
    SPLITS,
    dedup_and_split,
    document_hash,
    expand_paths,
    normalize_text,
    read_file_source,
    split_of,
)
from fp4repro.data.stdlib import (
    TOPICS_FILE,
    docstring_owners,
    docstrings,
    package_files,
    package_roots,
    read_packages,
    read_python_source,
    read_stdlib,
    spread_sample,
    stdlib_files,
    stdlib_root,
    strip_docstrings,
)

# ---- standard library -------------------------------------------------------------------------


def test_stdlib_files_exclude_tests_and_third_party_and_are_sorted():
    files = stdlib_files()
    assert files == sorted(files)
    assert len(files) > 300 and "json/decoder.py" in files and TOPICS_FILE in files
    for path in files:
        parts = set(path.split("/")[:-1])
        assert not parts & {"test", "tests", "idle_test", "site-packages", "dist-packages"}, path


NESTED_DEFINITIONS = """
def f():
    if x:
        class A:
            def m(self): "m"
    else:
        def g(): pass
    for i in y:
        pass
    else:
        def h(): pass
    while z:
        async def a(): pass
    try:
        def t(): pass
    except E:
        def e(): pass
    else:
        def o(): pass
    finally:
        def fin(): pass
    with c:
        def w(): pass
    match v:
        case 1:
            def case(): pass
    return lambda: (yield)
"""


@pytest.mark.parametrize("source", ["stdlib sample", "nested"])
def test_the_statement_walk_finds_every_docstring_owner_that_ast_walk_finds(source):
    if source == "nested":
        sources = [NESTED_DEFINITIONS]
    else:
        root = stdlib_root()
        sources = [read_python_source(root / rel) for rel in spread_sample(stdlib_files(root), 80)]
    for text in sources:
        tree = ast.parse(text)
        every = {
            id(n)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        }
        assert {id(n) for n in docstring_owners(tree)} == every
    if source == "nested":
        assert len(every) == 13


def test_strip_docstrings_keeps_code_valid_and_comments():
    source = (
        '#!/usr/bin/env python\n"""Module doc."""\nimport os  # keep me\n\n'
        'def f(): "inline doc"\n\nclass A:\n    """Only a docstring,\n    on two lines."""  # trailing\n\n'
        'class B:\n    """B doc."""\n    x = "not a docstring"\n\n'
        "async def g():\n    '''g'''\n    return 1\n"
    )
    stripped = strip_docstrings(source)
    assert stripped == (
        "#!/usr/bin/env python\nimport os  # keep me\n\ndef f(): pass\n\nclass A:\n    pass\n\n"
        'class B:\n    x = "not a docstring"\n\nasync def g():\n    return 1\n'
    )
    ast.parse(stripped)


@pytest.mark.parametrize("relpath", spread_sample([f for f in stdlib_files() if f != TOPICS_FILE], 25))
def test_stdlib_modules_lose_all_docstrings_and_stay_parseable(relpath):
    source = read_python_source(stdlib_root() / relpath)
    tree = ast.parse(strip_docstrings(source))
    assert docstrings(tree) == []


def test_read_stdlib_subset_gives_prose_and_code():
    corpus = read_stdlib(max_files=12)
    assert corpus.files == 12 and not corpus.unreadable
    assert len(corpus.code) <= 12 and corpus.prose
    assert all(ast.get_docstring(ast.parse(text)) is None for text in corpus.code)


# ---- installed packages -----------------------------------------------------------------------


def _below_roots(files, roots) -> list:
    """Each file's path below the package root it lies in."""
    return [f.relative_to(next(r for r in roots if f.is_relative_to(r))) for f in files]


def _tests_or_install_hooks(files, roots) -> list:
    """The files in a test suite or install hooks, judged by the parts below their package root: the
    folders above it (the checkout, its .venv) may be named anything, `test` included."""
    return [
        b
        for b in _below_roots(files, roots)
        if set(b.parts) & {"test", "tests", "idle_test", "__pycache__"} or b.name.startswith("__editable__")
    ]


def test_installed_package_files_are_this_environments_without_tests_or_install_hooks():
    roots = package_roots()
    files = package_files()
    assert files == sorted(files) and len(files) > 1000
    assert all(any(f.is_relative_to(r) for r in roots) for f in files)
    assert not any(f.is_relative_to(stdlib_root()) and not any(f.is_relative_to(r) for r in roots) for f in files)
    assert {"torch", "megatron", "pandas"} <= {b.parts[0] for b in _below_roots(files, roots)}  # our dependencies
    assert _tests_or_install_hooks(files, roots) == []


def test_an_environment_under_a_folder_named_test_keeps_its_packages(tmp_path):
    # issue 42: a checkout under a folder named `test` (`git clone ... test && cd test && make test`) failed
    # the test above, which read every part of each file's absolute path
    root = tmp_path / "test" / ".venv" / "lib" / "site-packages"
    names = ("pkg/__init__.py", "pkg/tests/test_m.py", "pkg/test/m.py", "pkg/__pycache__/m.py", "__editable___x.py")
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("VALUE = 1\n")
    files = package_files([root])
    assert files == [root / "pkg" / "__init__.py"]
    assert _tests_or_install_hooks(files, [root]) == []


def test_read_packages_splits_docstrings_from_code_in_a_given_tree(tmp_path):
    (tmp_path / "pkg" / "tests").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text('"""The package."""\nVALUE = 1  # a comment\n')
    (tmp_path / "pkg" / "mod.py").write_text('def f():\n    """Do f."""\n    return 2\n')
    (tmp_path / "pkg" / "tests" / "test_mod.py").write_text('"""A test."""\n')
    (tmp_path / "__editable___pkg_finder.py").write_text('"""An install hook."""\n')
    (tmp_path / "broken.py").write_text("def (:\n")
    corpus = read_packages(roots=[tmp_path])
    assert corpus.files == 3 and [u.split(":")[0] for u in corpus.unreadable] == ["broken.py"]
    assert corpus.prose == ["The package.", "Do f."]
    assert corpus.code == ["VALUE = 1  # a comment\n", "def f():\n    return 2\n"]
    assert read_packages(max_files=1, roots=[tmp_path]).files == 1


def test_reading_in_processes_gives_the_serial_corpus_in_the_same_order(tmp_path, monkeypatch):
    from fp4repro.data import stdlib

    for i in range(300):  # sizes vary, so that workers finish their chunks out of order
        body = "".join(f'def f{j}():\n    """Doc {i}.{j}."""\n    return {j}\n' for j in range(1 + (i * 7919) % 40))
        (tmp_path / f"m{i:03d}.py").write_text(body if i % 97 else "def (:\n")
    serial = read_packages(roots=[tmp_path], workers=1)
    monkeypatch.setattr(stdlib, "PARALLEL_FROM", 1)
    parallel = read_packages(roots=[tmp_path], workers=2)
    assert parallel == serial and serial.files == 300 and len(serial.unreadable) == 4
    assert serial.prose[:2] == ["Doc 1.0.", "Doc 1.1."]


def test_spread_sample_is_even_and_deterministic():
    items = list(range(100))
    assert spread_sample(items, 4) == [0, 25, 50, 75]
    assert spread_sample(items, None) == items and spread_sample(items, 500) == items


# ---- normalization, dedup, splits -------------------------------------------------------------


def test_normalize_text():
    assert normalize_text("\n\n  a  \r\nb\t\rc \n\n") == "  a\nb\nc"
    assert normalize_text("e\u0301") == "\u00e9"  # NFC
    assert normalize_text(" \n\t\n") == ""


def test_dedup_removes_exact_and_normalized_duplicates():
    corpus = dedup_and_split(["x = 1\n", "x = 1", "x = 1  \r\n", "y", "", "  \n"], 0.0, 0.0, seed=0)
    assert corpus.documents_read == 6 and corpus.duplicates == 2 and corpus.empty == 2
    assert sorted(corpus.splits["train"]) == ["x = 1", "y"]


def test_splits_are_disjoint_deterministic_and_independent_of_input_order():
    texts = [f"document {i}" for i in range(4000)]
    a = dedup_and_split(texts, 0.05, 0.1, seed=3)
    shuffled = texts[:]
    random.Random(1).shuffle(shuffled)
    b = dedup_and_split(shuffled, 0.05, 0.1, seed=3)
    assert a.splits == b.splits  # same documents, same order
    sets = {s: set(a.splits[s]) for s in SPLITS}
    for one, other in (("train", "valid"), ("train", "test"), ("valid", "test")):
        assert not sets[one] & sets[other]
    assert set().union(*sets.values()) == set(texts)
    assert 0.03 < len(sets["valid"]) / 4000 < 0.07 and 0.08 < len(sets["test"]) / 4000 < 0.12
    for split in SPLITS:  # ordered by hash
        hashes = [document_hash(t) for t in a.splits[split]]
        assert hashes == sorted(hashes)
    # the split depends on the document and the seed only
    assert all(split_of(document_hash(t), 0.05, 0.1, 3) == "valid" for t in a.splits["valid"])
    assert dedup_and_split(texts, 0.05, 0.1, seed=4).splits["valid"] != a.splits["valid"]


# ---- user files: clear errors -----------------------------------------------------------------


def test_jsonl_missing_field_names_source_path_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n\n" + json.dumps({"body": "no text"}) + "\n")
    source = Source(name="web", kind="jsonl", paths=(str(path),), field="text")
    expected = r"source 'web': .*d\.jsonl:3: record has no field 'text' \(its fields: \['body'\]\)"
    with pytest.raises(DataError, match=expected):
        read_file_source(source)


def test_jsonl_bad_json_and_non_string(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(DataError, match=r"source 's': .*bad\.jsonl:2: not valid JSON"):
        read_file_source(Source(name="s", kind="jsonl", paths=(str(bad),)))
    number = tmp_path / "num.jsonl"
    number.write_text('{"text": 3}\n')
    with pytest.raises(DataError, match="field 'text' must be a string, got int"):
        read_file_source(Source(name="s", kind="jsonl", paths=(str(number),)))


def test_empty_glob_names_source_and_pattern(tmp_path):
    pattern = str(tmp_path / "nothing" / "*.jsonl")
    with pytest.raises(DataError, match=re.escape(f"source 'web': path '{pattern}' matches no files")):
        expand_paths(Source(name="web", kind="jsonl", paths=(pattern,)))


def test_parquet_reads_field_and_names_missing_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"content": ["one", "two"], "n": [1, 2]}), path)
    assert read_file_source(Source(name="pq", kind="parquet", paths=(str(path),), field="content")) == ["one", "two"]
    expected = r"source 'pq': .*d\.parquet: no column 'text' \(its columns: \['content', 'n'\]\)"
    with pytest.raises(DataError, match=expected):
        read_file_source(Source(name="pq", kind="parquet", paths=(str(path),), field="text"))
    with pytest.raises(DataError, match="column 'n' must hold strings"):
        read_file_source(Source(name="pq", kind="parquet", paths=(str(path),), field="n"))


def test_text_files_are_whole_documents_in_path_order(tmp_path):
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first\nline")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    texts = read_file_source(Source(name="t", kind="text", paths=(str(tmp_path / "[ab].txt"),)))
    assert texts == ["first\nline", "second"]
    with pytest.raises(DataError, match=r"source 't': .*bad\.txt: not UTF-8"):
        read_file_source(Source(name="t", kind="text", paths=(str(tmp_path / "bad.txt"),)))
