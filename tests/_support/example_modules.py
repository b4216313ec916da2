"""Import a script of ``examples/`` (or ``benchmarks/``) as a module, once per process.

Those folders are not packages and are on no path; tests that check an example's pieces
load its file here (cached in ``sys.modules`` under ``<folder>_<name>``).
"""

import importlib.util
import pathlib
import sys
from types import ModuleType

ROOT = pathlib.Path(__file__).parents[2]


def load_example(name: str, folder: str = "examples") -> ModuleType:
    """``examples/<name>.py`` as a module (the same object on every call)."""
    key = f"{folder}_{name}"
    mod = sys.modules.get(key)
    if mod is None:
        spec = importlib.util.spec_from_file_location(key, ROOT / folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return mod
