"""Every repository path quoted in the notes, the docs and functd's docstrings and
comments exists: a file that moves or goes takes its mentions with it.

A quoted path is a backquoted (``` `x` ``` or ``` ``x`` ```) name ending in ``.py``,
``.md`` or ``.c``, optionally followed by ``:line`` (ignored). One that starts with a
top-level folder of the repository (``functd/``, ``tests/``, ``notes/``...) must exist
as written; a shorter one (``_tree.py``, ``optim/_base.py``) must be the end of some
file's path. Changelogs are history and are not read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("functd", "tests", "benchmarks", "examples", "notes", "docs", "tools")
#: Quoted on purpose although not in the repository: the project's shared API contract.
OUTSIDE = {"shared/design.md"}
QUOTED = re.compile(r"`{1,2}([\w./-]*\w\.(?:py|md|c))(?::[\d-]+)?(?=[`:,;)( ])")
SKIP_DIRS = {".git", ".venv", "build", "dist", "site", "node_modules", "__pycache__"}


def repo_files(root: Path) -> set[str]:
    """The repository's files, as paths relative to ``root`` (``/``-separated)."""
    out = set()
    for here, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        rel = Path(here).relative_to(root)
        out.update((rel / n).as_posix() for n in names)
    return out


def quoted_paths(text: str) -> list[tuple[int, str]]:
    """``(line number, path)`` for each path quoted in ``text``."""
    return [
        (i, m.group(1))
        for i, line in enumerate(text.splitlines(), 1)
        for m in QUOTED.finditer(line)
    ]


def missing(text: str, files: set[str]) -> list[tuple[int, str]]:
    """The quoted paths of ``text`` that name no file of ``files``."""
    ends = {f.split("/", i)[-1] for f in files for i in range(f.count("/") + 1)}
    out = []
    for line, path in quoted_paths(text):
        top = path.split("/", 1)[0] in TOP
        if path not in OUTSIDE and path not in (files if top else ends):
            out.append((line, path))
    return out


def documents() -> list[Path]:
    docs = [*ROOT.glob("notes/*.md"), *ROOT.glob("docs/**/*.md"), ROOT / "README.md"]
    docs = [p for p in docs if p.exists() and "changelog" not in p.name.lower()]
    return sorted(docs) + sorted((ROOT / "functd").rglob("*.py"))


pytestmark = pytest.mark.skipif(
    not (ROOT / "notes").is_dir(), reason="needs the repository checkout (notes/)"
)


def test_every_quoted_path_exists():
    files = repo_files(ROOT)
    stale = [
        f"{doc.relative_to(ROOT)}:{line}: {path}"
        for doc in documents()
        for line, path in missing(doc.read_text(), files)
    ]
    assert stale == []


def test_the_reader_finds_quoted_paths():
    # a broken reader passes everything: it sees the forms the notes use
    text = (
        "See `functd/_td/_tree.py:262-284` and ``_tree.py``, `tests/test_x.py: Residual`,\n"
        "(`notes/design.md`) but not `functd.random` nor `x.py_thing` nor functd/a.py.\n"
    )
    assert quoted_paths(text) == [
        (1, "functd/_td/_tree.py"),
        (1, "_tree.py"),
        (1, "tests/test_x.py"),
        (2, "notes/design.md"),
    ]
    files = {"functd/_td/_tree.py", "notes/design.md"}
    assert missing(text, files) == [(1, "tests/test_x.py")]
    gone = [(1, "_td/_gone.py"), (1, "gone/_tree.py")]
    assert missing("`_td/_gone.py` and `gone/_tree.py`", files) == gone
    assert len(quoted_paths((ROOT / "notes/design.md").read_text())) > 10
