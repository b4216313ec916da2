"""A griffe extension for the API reference: functd's docstrings title their examples
``Example:`` (the Google style of this codebase), which griffe reads as a plain
admonition; renamed ``Examples:``, the ``>>>`` lines render as code."""

from __future__ import annotations

import re
from typing import Any

import griffe

_TITLE = re.compile(r"^Example:[ \t]*$", re.M)


class ExampleSections(griffe.Extension):
    """Read every ``Example:`` section of a docstring as griffe's examples section."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _TITLE.sub("Examples:", obj.docstring.value)
