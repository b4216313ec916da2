"""The documentation site: every public name of functd, functd.nn, functd.optim,
functd.random, functd.distributed and functd.testing has an entry in the API
reference (docs/reference/*.md), every page is in the navigation, and every python
block of every page runs (tools/doc_examples.py, the same runner ``make docs`` uses as
a build hook). ``make docs`` itself (mkdocs, strict) is run by .ci/run."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

import functd as fd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import doc_examples  # noqa: E402

MODULES = ["functd", "functd.nn", "functd.optim", "functd.random", "functd.distributed"]
MODULES += ["functd.testing"]
SUBPACKAGES = {"distributed", "nn", "optim", "random", "testing"}


def public_names(name: str) -> list[str]:
    """``__all__``, or every name without a leading underscore that is not one of
    functd's documented subpackages."""
    mod = importlib.import_module(name)
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n in dir(mod) if not n.startswith("_")]
    if name == "functd":
        names = [n for n in names if n not in SUBPACKAGES]
    return sorted(
        n for n in names if not isinstance(getattr(mod, n), types.ModuleType) or n == "tree"
    )


def reference_entries() -> set[str]:
    text = "\n".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md"))
    return set(re.findall(r"^::: ([\w.]+)\s*$", text, re.M))


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_is_in_the_reference(module):
    entries = reference_entries()
    missing = [n for n in public_names(module) if f"{module}.{n}" not in entries]
    assert not missing, (
        f"{module}: add these public names to docs/reference/ (a `::: {module}.NAME` line "
        f"in the right section): {missing}"
    )


def test_the_reference_names_only_public_names():
    public = {f"{m}.{n}" for m in MODULES for n in public_names(m)}
    assert reference_entries() <= public, sorted(reference_entries() - public)
    assert len(reference_entries()) == len(public)


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    missing = [p for p in pages if f": {p}" not in nav]
    assert not missing, missing


def test_the_readme_links_the_guides_and_names_make_docs():
    readme = (ROOT / "README.md").read_text()
    assert "make docs" in readme
    for page in ("docs/getting-started.md", "docs/guides/", "docs/reference/"):
        assert page in readme, page
    two = re.search(r"## Two commands\n\n```sh\n(.*?)```", readme, re.S).group(1)
    assert [line.split()[1] for line in two.strip().splitlines()] == ["demo", "test"]


PAGES = [p.relative_to(ROOT).as_posix() for p in doc_examples.pages()]
SEPARATE = {"docs/guides/data-parallel.md"}  # starts a process group: its own process
NEEDS = {"docs/guides/hf-models.md": "transformers", "docs/guides/files.md": "transformers"}


def test_the_guides_have_examples():
    assert len(PAGES) >= 14, PAGES
    for must in ("docs/getting-started.md", "docs/tutorial.md", "docs/guides/training.md"):
        assert must in PAGES


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=pytest.mark.compile) if "compile" in p else p for p in PAGES],
)
def test_every_example_of_the_page_runs(page):
    if page in NEEDS and importlib.util.find_spec(NEEDS[page]) is None:
        pytest.skip(f"needs {NEEDS[page]}")
    if page in SEPARATE:
        code = f"import sys; sys.path.insert(0, 'tools'); import doc_examples as d, pathlib; d.run_page(pathlib.Path({page!r}).resolve())"
        run = subprocess.run(
            [sys.executable, "-W", "error", "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        doc_examples.run_page(ROOT / page)
    allowed = [fd.CudaGraphWarning] if "compile" in page and not torch.cuda.is_available() else []
    assert [w.category for w in caught] == allowed, [str(w.message) for w in caught]
