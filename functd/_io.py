"""Saving and loading TensorDicts (and any pytree of them) with torch's safe loader.

``load`` uses ``torch.load(weights_only=True)``: a file that holds pickled code
(any global other than tensors, containers and TensorDict) fails to load, with
a ``pickle.UnpicklingError``, and runs nothing.

Example:
    >>> fd.save(td, "td.pt")
    >>> fd.testing.assert_close(fd.load("td.pt"), td)
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch

__all__ = ["load", "save"]


def save(obj: Any, path: str | os.PathLike) -> None:
    """Save a TensorDict (or a pytree of tensors and TensorDicts) to ``path``."""
    torch.save(obj, path)


def load(path: str | os.PathLike, map_location: Any = None) -> Any:
    """Load what ``save`` wrote, with ``torch.load(weights_only=True)``.

    Raises:
        pickle.UnpicklingError: the file holds objects other than tensors,
            containers and TensorDicts (e.g. pickled code); nothing was run.
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise pickle.UnpicklingError(
            f"functd.load({os.fspath(path)!r}) refused the file: it holds objects that the "
            "safe loader (torch.load(weights_only=True)) does not allow, such as pickled "
            "code, and nothing was run. Only load such a file if you trust it, with "
            f"torch.load(path, weights_only=False). Details: {e}"
        ) from None
