"""Types: functd ships py.typed; every public function and method (of functd, functd.nn,
functd.optim, functd.random, functd.distributed, functd.testing) annotates every
parameter and its return; and mypy passes on functd/ and on tests/typing/ (the public
types as users see them: ``td["x"]`` is ``Tensor | TensorDict``, ``td.set(...)`` a
``TensorDict``) is run by ``make lint`` and CI (``make typecheck``), with the
configuration in pyproject.toml (notes/docs.md, "Types")."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import functd

MODULES = ["functd", "functd.nn", "functd.optim", "functd.random", "functd.distributed"]
MODULES += ["functd.testing"]
SUBPACKAGES = {"distributed", "nn", "optim", "random", "testing"}


def _public(name: str) -> list[tuple[str, object]]:
    mod = importlib.import_module(name)
    names = getattr(mod, "__all__", None) or [
        n for n in dir(mod) if not n.startswith("_") and n not in SUBPACKAGES
    ]
    return [(f"{name}.{n}", getattr(mod, n)) for n in names]


def _unannotated(qual: str, fn: object) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    ann = getattr(fn, "__annotations__", {})
    out = [f"{qual}({p})" for p in sig.parameters if p not in ("self", "cls") and p not in ann]
    if "return" not in ann and getattr(fn, "__name__", "") != "__init__":
        out.append(f"{qual} -> (no return annotation)")
    return out


def _callables() -> list[tuple[str, object]]:
    found = []
    for module in MODULES:
        for qual, obj in _public(module):
            if inspect.isfunction(obj):
                found.append((qual, obj))
            elif inspect.isclass(obj):
                for klass in obj.__mro__:
                    if not klass.__module__.startswith("functd"):
                        continue
                    for name, attr in vars(klass).items():
                        public = not name.startswith("_") or name in ("__init__", "__call__")
                        if public and inspect.isfunction(attr):
                            found.append((f"{qual}.{name}", attr))
    return found


def test_the_package_ships_py_typed():
    assert (Path(functd.__file__).parent / "py.typed").is_file()


def test_every_public_function_and_method_is_annotated():
    found = _callables()
    assert len(found) > 300  # the sweep reaches the classes' methods
    missing = [m for qual, fn in found for m in _unannotated(qual, fn)]
    assert not missing, missing


def test_the_sweep_catches_a_missing_annotation():
    def f(x, y: int):
        return x

    assert _unannotated("f", f) == ["f(x)", "f -> (no return annotation)"]
