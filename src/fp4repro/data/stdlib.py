"""The embedded offline corpora: the standard library of the running interpreter, and the Python
packages installed beside it.

Every Python installation carries a standard library, so the default experiment needs no
download; its installed packages (site-packages: for this project torch, triton, megatron-core,
pandas, ...) give a much larger one that still needs none. Two sources come out
of each:

- *prose*: what the standard library says about itself: every module, class and function
  docstring (found with ``ast``; nothing is imported or executed) and the ``pydoc_data.topics``
  help texts (the language reference sections that ``help()`` shows);
- *code*: the same modules' source with those docstrings removed, so that the two sources do not
  share text. Comments stay: they are part of how code is written.

Test suites (``test/``, ``tests/``, ``idlelib/idle_test`` ...) are left out, and the standard
library's reading leaves out installed third-party packages (``site-packages``), which the
packages' reading is. Files are listed in sorted path order, never filesystem order.
"""

from __future__ import annotations

import ast
import os
import sysconfig
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

# Folder names that hold test suites or third-party code, wherever they appear in the tree.
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
# The help-topics table: prose data written as one big Python dict, read as prose, not as code.
TOPICS_FILE = "pydoc_data/topics.py"

# files from which reading is spread over processes: below that (the standard library's size),
# starting them (each imports this package) costs more than it saves (measured: commit 8be9a42)
PARALLEL_FROM = 2000

_DOCSTRING_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
# where statements are held: a class or function definition is a statement, so these fields are
# all a walk for docstring owners has to follow (``ast.walk`` would visit every expression too,
# several times the work)
_STATEMENT_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def stdlib_root() -> Path:
    """The folder of the running interpreter's standard library (not the virtual environment's)."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[str]:
    """Relative POSIX paths of the standard library's ``.py`` files, sorted.

    Includes ``pydoc_data/topics.py`` (read as prose); excludes test suites and site-packages.
    """
    root = root or stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        folder = Path(dirpath).relative_to(root)
        found.extend((folder / name).as_posix() for name in filenames if name.endswith(".py"))
    return sorted(found)


def package_roots() -> list[Path]:
    """The folders of the running interpreter's installed packages (purelib and platlib, once each)."""
    paths = sysconfig.get_paths()
    return sorted({Path(paths[k]) for k in ("purelib", "platlib") if Path(paths[k]).is_dir()})


def package_distributions(roots: list[Path] | None = None) -> list[str]:
    """Every distribution installed in the package folders (``package_roots``), "name==version"
    sorted: the folders a packages source reads (all of them counted, whatever share of their
    files ``max_files`` reads). Others on the import path (PYTHONPATH's) add no text, so they are
    not part of what the corpus is made from."""
    # importlib.metadata reads installed distributions' metadata: there is no module to import by name
    from importlib.metadata import distributions

    found = distributions(path=[str(r) for r in roots or package_roots()])
    return sorted({f"{d.metadata['Name']}=={d.version}" for d in found})


def package_files(roots: list[Path] | None = None) -> list[Path]:
    """The ``.py`` files of the installed packages, sorted; test suites and the import hooks of
    editable installs (``__editable__*``, which are not a package's text) left out."""
    found = []
    for root in roots or package_roots():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
            found.extend(
                Path(dirpath) / name
                for name in filenames
                if name.endswith(".py") and not name.startswith("__editable__")
            )
    return sorted(found)


def spread_sample(items: list, count: int | None) -> list:
    """At most ``count`` items, evenly spaced over the (sorted) list: a small but varied subset."""
    if count is None or count >= len(items):
        return list(items)
    if count <= 0:
        return []
    stride = len(items) / count
    return [items[int(i * stride)] for i in range(count)]


def read_python_source(path: Path) -> str:
    """A Python file's text, decoded as the interpreter would (PEP 263 coding cookie or UTF-8)."""
    with tokenize.open(path) as f:
        return f.read()


def docstring_owners(tree: ast.Module) -> list[ast.AST]:
    """The module and every class and function definition in it (nested ones too), in no order."""
    owners, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, _DOCSTRING_OWNERS):
            owners.append(node)
        for name in _STATEMENT_FIELDS:
            stack.extend(getattr(node, name, ()))
    return owners


def docstrings(tree: ast.Module) -> list[str]:
    """The cleaned docstrings (``inspect.cleandoc`` style) of the module and of every class and
    function in it, in source order."""
    owners = docstring_owners(tree)
    owners.sort(key=lambda node: (getattr(node, "lineno", 0), getattr(node, "col_offset", 0)))
    found = (ast.get_docstring(node, clean=True) for node in owners)
    return [text for text in found if text]


def _docstring_node(node: ast.AST) -> ast.Expr | None:
    """The statement holding ``node``'s docstring, if it has one."""
    body = getattr(node, "body", None)
    if not body:
        return None
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def strip_docstrings(source: str, tree: ast.Module | None = None) -> str:
    """``source`` without its module, class and function docstrings; the result is still valid Python.

    A docstring on lines of its own is removed with those lines (a trailing comment on its last
    line goes with it); a body that held only a docstring gets ``pass``. A docstring sharing a
    line with other code (``def f(): "doc"``) is replaced by ``pass`` in place. Everything else,
    comments and blank lines included, is kept byte for byte.
    """
    tree = tree or ast.parse(source)
    # ast positions are line numbers and UTF-8 byte columns; bytes.splitlines breaks lines exactly
    # where the tokenizer does (\n, \r\n, \r), unlike str.splitlines.
    lines = source.encode("utf-8").splitlines(keepends=True)
    removals = []
    for node in docstring_owners(tree):
        if (doc := _docstring_node(node)) is not None:
            needs_pass = len(node.body) == 1 and not isinstance(node, ast.Module)
            removals.append((doc, needs_pass))
    # From the end backwards, so that earlier positions stay valid.
    for doc, needs_pass in sorted(removals, key=lambda r: (r[0].lineno, r[0].col_offset), reverse=True):
        first, last = doc.lineno - 1, doc.end_lineno - 1
        before = lines[first][: doc.col_offset]
        after = lines[last][doc.end_col_offset :]
        owns_its_lines = not before.strip() and (not after.strip() or after.lstrip().startswith(b"#"))
        if owns_its_lines:
            line_end = lines[last][len(lines[last].rstrip(b"\r\n")) :] or b"\n"
            replacement = [before + b"pass" + line_end] if needs_pass else []
        else:
            replacement = [before + b"pass" + after]
        lines[first : last + 1] = replacement
    return b"".join(lines).decode("utf-8")


def pydoc_topics() -> list[str]:
    """The help texts of ``pydoc_data.topics`` (language reference sections), sorted by topic."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def read_python_file(path: Path, name: str) -> tuple[list[str], str | None, str | None]:
    """One file's docstrings (prose), its docstring-free source (code) and, for a file this
    interpreter cannot decode or parse, why instead: ``(prose, code, None)`` or ``([], None, reason)``."""
    try:
        source = read_python_source(path)
        tree = ast.parse(source, filename=name)
    except (SyntaxError, UnicodeDecodeError, ValueError) as err:
        return [], None, f"{name}: {type(err).__name__}: {err}"
    return docstrings(tree), strip_docstrings(source, tree), None


def _read_python_file(item: tuple[Path, str]) -> tuple[list[str], str | None, str | None]:
    return read_python_file(*item)


@dataclass
class PythonCorpus:
    """Python files read once: prose documents, code documents, files that failed."""

    prose: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    files: int = 0
    unreadable: list[str] = field(default_factory=list)  # "path: reason"

    def add(self, prose: list[str], code: str | None, unreadable: str | None) -> None:
        """Add one file as ``read_python_file`` read it."""
        self.files += 1
        self.prose.extend(prose)
        if code is not None:
            self.code.append(code)
        if unreadable is not None:
            self.unreadable.append(unreadable)

    def read_all(self, items: list[tuple[Path, str]], desc: str, progress: bool, workers: int | None = None) -> None:
        """Add every (path, name) of ``items`` as ``read_python_file`` reads it, in their order,
        parsed in ``workers`` processes (default: the CPUs this process may use): the corpus is
        the same for any number of workers, and ``ast`` parsing is the slow part of reading
        20,000 files."""
        workers = workers or len(os.sched_getaffinity(0))
        bar = tqdm(total=len(items), desc=desc, unit="file", disable=not progress, dynamic_ncols=True)
        with bar:
            if workers <= 1 or len(items) < PARALLEL_FROM:
                for item in items:
                    self.add(*_read_python_file(item))
                    bar.update()
                return
            import multiprocessing

            # spawn: a fork of a process that holds torch's or tokenizers' threads may deadlock
            with multiprocessing.get_context("spawn").Pool(workers) as pool:
                for result in pool.imap(_read_python_file, items, chunksize=32):
                    self.add(*result)
                    bar.update()


def read_stdlib(
    max_files: int | None = None, progress: bool = False, root: Path | None = None, workers: int | None = None
) -> PythonCorpus:
    """Read the standard library (or an evenly spread subset of ``max_files`` files) into prose
    documents (one per docstring, plus one per pydoc topic) and code documents (one per module).

    A file that cannot be decoded or parsed by this interpreter is skipped and listed in
    ``unreadable``; with a healthy installation there are none.
    """
    root = root or stdlib_root()
    files = spread_sample(stdlib_files(root), max_files)
    corpus = PythonCorpus()
    at = files.index(TOPICS_FILE) if TOPICS_FILE in files else len(files)
    corpus.read_all([(root / f, f) for f in files[:at]], "read stdlib", progress, workers)
    if at < len(files):  # the topics' prose where the file falls in path order
        corpus.add(pydoc_topics(), None, None)
        corpus.read_all([(root / f, f) for f in files[at + 1 :]], "read stdlib", progress, workers)
    return corpus


def read_packages(
    max_files: int | None = None, progress: bool = False, roots: list[Path] | None = None, workers: int | None = None
) -> PythonCorpus:
    """Read the installed packages (or an evenly spread subset of ``max_files`` files) as
    ``read_stdlib`` reads the standard library: docstrings as prose, the rest of the source as code."""
    roots = roots or package_roots()
    files = spread_sample(package_files(roots), max_files)
    items = []
    for path in files:
        root = next(r for r in roots if path.is_relative_to(r))
        items.append((path, path.relative_to(root).as_posix()))
    corpus = PythonCorpus()
    corpus.read_all(items, "read packages", progress, workers)
    return corpus
