"""The one key-path formatter of the transforms' error messages.

A path is a tuple of steps into the arguments (or outputs) of a transformed
function: str keys (dict and TensorDict entries), ints (tuple and list
positions), or ``torch.utils._pytree`` key entries (``MappingKey``,
``SequenceKey``, ``GetAttrKey``), as torch's ``tree_flatten_with_path`` gives
them. (``functd._errors.fmt_key`` formats a TensorDict key as the user wrote
it, ``('obs', 'pos')``; a path here starts at an argument: ``args[0]['obs']``.)

Example:
    >>> fmt_path((0, "obs", "pos"))
    "args[0]['obs']['pos']"
    >>> fmt_call_path((1, "td", "x"))        # a path into (args, kwargs)
    "td=['x']"
"""

from __future__ import annotations

from typing import Any

import torch.utils._pytree as torch_pytree

__all__ = ["fmt_call_path", "fmt_path"]

_KEY_ENTRIES = (torch_pytree.MappingKey, torch_pytree.SequenceKey, torch_pytree.GetAttrKey)


def fmt_path(path: tuple[Any, ...], root: str = "args") -> str:
    """``root`` followed by one ``[key]`` per step (``.name`` for an attribute)."""
    return root + "".join(str(p) if isinstance(p, _KEY_ENTRIES) else f"[{p!r}]" for p in path)


def fmt_call_path(path: tuple[Any, ...]) -> str:
    """A path into the pair ``(args, kwargs)`` of a call: ``args[i]...`` or ``name=...``."""
    head, at, rest = path[0], path[1], path[2:]
    return fmt_path(rest, f"args[{at}]" if head == 0 else f"{at}=")
