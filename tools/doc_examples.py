"""Run every ``python`` code block of the documentation, page by page.

The blocks of one page run top to bottom in one namespace (a page is one
story), in a fresh temporary folder as the current directory, on the CPU.
A block fenced as ```` ```python {.no-run} ```` would be skipped; none is (every
example runs). Used twice:

- as a mkdocs hook (``hooks:`` in mkdocs.yml): ``on_page_markdown`` runs the
  page's blocks while ``make docs`` builds, and a block that raises fails the
  build;
- by ``tests/test_docs.py``, which runs every page's blocks under pytest.

Example:
    >>> run_page(Path("docs/getting-started.md"))   # raises ExampleError on failure
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
_PAGE_MODULE = "functd_docs_page"
_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


class ExampleError(Exception):
    """A documentation example raised; the message names the page and the block."""


def blocks(text: str) -> list[str]:
    """The python blocks of a page, in order (``{.no-run}`` blocks left out)."""
    return [m.group(1) for m in _BLOCK.finditer(text) if "no-run" not in m.group(0).split("\n")[0]]


def pages() -> list[Path]:
    """Every markdown page of docs/ that has a python block."""
    return sorted(p for p in DOCS.rglob("*.md") if blocks(p.read_text()))


def run_page(path: Path, text: str | None = None, quiet: bool = True) -> dict[str, Any]:
    """Run the python blocks of ``path`` in order in one namespace; return it.

    Raises:
        ExampleError: a block raised (its page, index and first line are named).
    """
    text = path.read_text() if text is None else text
    name = str(path.relative_to(ROOT)) if path.is_absolute() else str(path)
    # the page's namespace is a real module: dynamo looks a function's globals up by name
    module = types.ModuleType(_PAGE_MODULE)
    sys.modules[_PAGE_MODULE] = module
    ns: dict[str, Any] = module.__dict__
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            for i, code in enumerate(blocks(text)):
                out = io.StringIO()
                try:
                    with _captured(out) if quiet else contextlib.nullcontext():
                        exec(compile(code, f"{name} python block {i}", "exec"), ns)
                except Exception as e:
                    first = code.strip().splitlines()[0] if code.strip() else ""
                    raise ExampleError(
                        f"{name}: python block {i} ({first!r}) raised {type(e).__name__}: {e}"
                    ) from e
        finally:
            os.chdir(here)
            sys.modules.pop(_PAGE_MODULE, None)
    return ns


# ------------------------------------------------------------------ the mkdocs hook
def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: run the page's examples; a failing one fails the build."""
    from mkdocs.exceptions import PluginError

    if os.environ.get("FUNCTD_DOCS_RUN", "1") == "0" or not blocks(markdown):
        return markdown
    path = Path(config["docs_dir"]) / page.file.src_path
    try:
        with warnings.catch_warnings():  # tests/test_docs.py pins which warnings occur
            warnings.simplefilter("ignore")
            run_page(path, markdown)
    except ExampleError as e:
        raise PluginError(str(e)) from e
    return markdown


@contextlib.contextmanager
def _captured(out: io.StringIO) -> Any:
    """Print and progress bars of a block go to ``out`` (shown when it fails)."""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        yield
