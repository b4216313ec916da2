"""AOTInductor (``torch._inductor.aot_compile``, torch.export's PT2 archive writer,
``torch._C._aoti``'s package loader): what ``Lowered.compile()``, ``Compiled.save``
and ``fd.load_compiled`` build, write and load.

torch's public door is ``torch._inductor.aoti_compile_and_package`` of an
``ExportedProgram``; fd.jit already holds an ATen-level FX graph over the flat input
tensors, which ``aot_compile`` takes as it is (no second trace by ``torch.export``),
and functd's metadata goes into the same archive as an extra file (``package``).
Loading calls the C++ loader directly: it unzips the shared library and the weights
and opens them; nothing in the file is unpickled (``torch.export``'s Python loader,
``load_pt2``, would also deserialize exported programs). Importing this module
imports nothing heavy; ``aot_compile`` imports inductor on its first call. Versions:
behaves as used on torch 2.13 and 2.14.

>>> from functd._torch.aoti import EXTRA_DIR
>>> EXTRA_DIR
'extra/'
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["EXTRA_DIR", "aot_compile", "loader", "package"]

#: The folder of the archive (under its top folder) that holds the extra files.
EXTRA_DIR = "extra/"


def aot_compile(
    gm: torch.fx.GraphModule, inputs: Sequence[Any], options: dict[str, Any]
) -> list[Any]:
    """The files AOTInductor generates for ``gm`` (its C++ wrapper and kernels, their
    compile flags, the shared library built from them; weights), given example
    ``inputs`` (real tensors, in the graph's input order)."""
    from torch._inductor import aot_compile as compile_aot

    options = {**options, "aot_inductor.package": True}
    with warnings.catch_warnings():  # torch 2.13 pickles a treespec for its cache key
        warnings.filterwarnings("ignore", ".*LeafSpec.*", FutureWarning)
        files = compile_aot(gm, tuple(inputs), options=options)
    if not isinstance(files, list):
        raise RuntimeError(f"functd: AOTInductor gave {type(files).__name__}, not its files")
    return files


def package(path: str, files: list[Any] | None, extra: dict[str, str]) -> None:
    """Write the PT2 archive ``path``: AOTInductor's ``files`` as the model "model"
    and ``extra`` (name -> text) under ``EXTRA_DIR``."""
    from torch.export.pt2_archive._package import package_pt2

    package_pt2(path, aoti_files=files, extra_files=extra)


def loader(path: str) -> Any:
    """``torch._C._aoti.AOTIModelPackageLoader`` of the archive's model "model": its
    ``run(list_of_tensors)`` returns the outputs as a list (one runner, on the
    device the package was built for)."""
    return torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
