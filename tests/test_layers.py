"""functd's import graph: no circle, no upward import, no internal import of a façade,
no underscored name imported from another room (files are private, names are not).

The rooms and what each may import are the layer diagram of notes/design.md
("Layers"). Every ``import`` counts, also one inside a function: a lazy import
still makes the lower file depend on the upper one. A façade (a package
``__init__`` that re-exports) sits in its own room and is checked like any other
file: ``functd.nn`` in nn, ``functd.optim`` in optim, ``functd.distributed`` in
distributed, ``functd`` itself in top.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import functd

ROOT = pathlib.Path(functd.__file__).parent

#: Package ``__init__`` files only re-export: nothing inside functd imports them but
#: their parent package (``functd`` makes ``fd.nn`` an attribute); each sits in its own
#: room (see ``room``).
FACADES = {"functd", "functd.nn", "functd.optim", "functd.distributed"}

#: room -> the rooms it may import (besides itself); a room is a set of files.
ALLOWED = {
    "base": set(),
    "random": {"base"},
    "td": {"base", "random"},
    "nn": {"base", "random", "td"},
    "transforms": {"base", "random", "td"},
    "optim": {"base", "random", "td"},
    "modules": {"base", "random", "td", "nn"},
    "distributed": {"base", "random", "td", "transforms", "optim"},
    "top": {"base", "random", "td", "nn", "transforms", "optim", "modules", "distributed"},
}


def room(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 2 and parts[1] in {
        "_errors",
        "_frozen",
        "_eager",
        "_ambient",
        "_threefry",
        "_fused",
        "_fused_ext",
        "_triton_draws",
        "_triton_kernels",
        "_erfinv",
        "_version",
    }:
        return "base"
    sub = parts[1] if len(parts) > 1 else ""
    return {
        "_torch": "base",  # torch's private APIs (functd/_torch/): imports torch only
        "": "top",  # the package itself: fd.*
        "random": "random",
        "_bits_to_numbers": "random",
        "_td": "td",
        "nn": "nn",
        "_transforms": "transforms",
        "optim": "optim",
        "_modules": "modules",
        "distributed": "distributed",
        "_train": "top",
        "_checkpoint": "top",
        "testing": "top",
    }[sub]


def modules() -> dict[str, pathlib.Path]:
    """Module name -> file: the Python files and the C sources of extension modules
    (``functd/_fused_ext.c`` builds ``functd._fused_ext``; it imports nothing of functd)."""
    out = {}
    for p in [*ROOT.rglob("*.py"), *ROOT.rglob("*.c")]:
        parts = ["functd", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def source_of(pkg: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` reads, a relative one resolved in package ``pkg``."""
    if node.level:
        base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module or ""


def import_graph() -> dict[str, set[str]]:
    """``module -> modules it imports`` over functd's own files (``from pkg import mod``
    counts as importing ``mod``)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        if path.suffix != ".py":
            graph[name] = set()
            continue
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = source_of(pkg, node)
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


GRAPH = import_graph()


def test_graph_is_read():
    # the reader itself: it sees the known arrows (a broken reader passes everything)
    assert "functd._td._tensordict" in GRAPH["functd"] or "functd._td" in GRAPH["functd"]
    assert "functd._td" in GRAPH["functd.nn._linear"]
    assert len(GRAPH) > 50


def test_no_import_circle():
    assert cycles(GRAPH) == []


def test_no_upward_import():
    bad = []
    for mod, deps in sorted(GRAPH.items()):
        for dep in sorted(deps):
            if dep in FACADES and mod != dep.rpartition(".")[0]:
                bad.append(f"{mod} imports the façade {dep}")
            elif room(dep) != room(mod) and room(dep) not in ALLOWED[room(mod)]:
                bad.append(f"{mod} ({room(mod)}) imports {dep} ({room(dep)})")
    assert bad == []


def test_cycles_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("mod", sorted(modules()))
def test_every_file_is_in_a_room(mod):
    assert room(mod) in ALLOWED


def private_names_across_rooms(sources: dict[str, tuple[str, bool]], mods: set[str]) -> list[str]:
    """Each name starting with ``_`` (not a dunder) that a file imports from a file of
    another room. ``sources``: module -> (its source, whether it is a package ``__init__``);
    ``mods``: every module name (to tell ``from pkg import _mod``, a private *module*, which
    is allowed, from ``from mod import _name``)."""

    def room_of(mod: str) -> str:
        return "top" if mod == "functd" else room(mod)

    bad = []
    for mod, (text, is_pkg) in sorted(sources.items()):
        pkg = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = source_of(pkg, node)
            if target not in mods or room_of(target) == room_of(mod):
                continue
            for alias in node.names:
                name = alias.name
                private = name.startswith("_") and not (
                    name.startswith("__") and name.endswith("__")
                )
                if private and f"{target}.{name}" not in mods:
                    bad.append(
                        f"{mod} ({room_of(mod)}) imports {name} from {target} ({room_of(target)})"
                    )
    return bad


def test_no_private_name_across_rooms():
    # a name that another room imports is public: the file may be private, the name may not
    mods = modules()
    sources = {
        m: (p.read_text(), p.name == "__init__.py") for m, p in mods.items() if p.suffix == ".py"
    }
    assert private_names_across_rooms(sources, set(mods)) == []


def test_private_names_across_rooms_finds_one():
    mods = {"functd._td", "functd._td._tensordict", "functd._td._shape", "functd._modules._call"}
    td = ("from ._tensordict import _new\n", True)  # same room: fine
    sources = {
        "functd._td": td,
        "functd._modules._call": (
            "from .._td import _shape, __all__, from_parts\n"  # a module, a dunder, a public name
            "def f():\n    from .._td import _new as new\n",  # lazy, aliased: still counts
            False,
        ),
    }
    assert private_names_across_rooms(sources, mods) == [
        "functd._modules._call (modules) imports _new from functd._td (td)"
    ]


def test_facades_sit_in_their_rooms():
    # a façade is checked like any other file: an upward import from it is an arrow too
    assert [room(f) for f in sorted(FACADES)] == ["top", "distributed", "nn", "optim"]
    assert "functd.nn._state" in GRAPH["functd.nn"]
    assert not any(room(d) == "modules" for d in GRAPH["functd.nn"])


#: The sizes issue 26 fixed: a file is read in one sitting, a function on one screen.
MAX_FILE_LINES, MAX_FUNCTION_LINES = 700, 80


def oversized(mods: dict[str, pathlib.Path]) -> list[str]:
    """Files over ``MAX_FILE_LINES`` lines and functions over ``MAX_FUNCTION_LINES``."""
    bad = []
    for name, path in sorted(mods.items()):
        if path.suffix != ".py":
            continue
        text = path.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES:
            bad.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    bad.append(f"{name}:{node.lineno} {node.name}: {n} lines")
    return bad


def test_no_file_or_function_over_the_size_limits():
    assert oversized(modules()) == []


def test_oversized_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def f():\n{body}\n")
    assert oversized({"functd.long": tmp_path / "long.py"}) == ["functd.long:1 f: 81 lines"]


#: The room of torch's private APIs (issue 37): only its files may touch ``torch._*``.
TORCH_ROOM = "functd._torch"


def private_torch_uses(name: str, text: str) -> list[str]:
    """Each access to torch's private API in module ``name`` (source ``text``) outside
    ``functd._torch``: ``import torch._x``, ``from torch._x import y``,
    ``from torch import _x``, ``torch._x`` and ``getattr(torch, "_x")``. The
    ``torch._foreach_*`` ops (what torch.optim itself runs) are allowed anywhere.
    Strings and comments do not count."""
    if name == TORCH_ROOM or name.startswith(TORCH_ROOM + "."):
        return []

    def private(attr: str) -> bool:
        dunder = attr.startswith("__") and attr.endswith("__")  # torch.__version__
        return attr.startswith("_") and not dunder and not attr.startswith("_foreach_")

    bad = []
    for node in ast.walk(ast.parse(text)):
        found = None
        if isinstance(node, ast.Import):
            found = next((a.name for a in node.names if a.name.startswith("torch._")), None)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.startswith("torch._"):
                found = f"from {node.module}"
            elif node.module == "torch" and any(private(a.name) for a in node.names):
                found = "from torch import _"
        elif isinstance(node, ast.Attribute) and private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id == "torch":
                found = f"torch.{node.attr}"
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
            args = node.args
            if len(args) >= 2 and getattr(args[0], "id", None) == "torch":
                attr = getattr(args[1], "value", None)
                if isinstance(attr, str) and private(attr):
                    found = f'getattr(torch, "{attr}")'
        if found:
            bad.append(f"{name}:{node.lineno} {found} (import it from {TORCH_ROOM})")
    return bad


def test_torch_private_apis_only_in_their_room():
    # torch._* changes between releases: every use goes through functd/_torch/, which
    # documents it and its versions (notes/torch-private.md)
    bad = []
    for name, path in sorted(modules().items()):
        if path.suffix == ".py":
            bad += private_torch_uses(name, path.read_text())
    assert bad == []


def test_private_torch_uses_finds_each_form():
    src = (
        '"""``torch._VF.lstm`` in a docstring is fine."""\n'
        "import torch\n"
        "import torch._dynamo\n"  # 3
        "from torch._guards import detect_fake_mode\n"  # 4
        "from torch import _VF, Tensor\n"  # 5
        "x = torch._C._functorch\n"  # 6
        "y = torch._foreach_add  # torch.optim's own ops: allowed\n"
        "def f():\n"
        '    return getattr(torch, "_native_multi_head_attention", None)\n'  # 9
        "z = torch.nn.functional.relu, torch.__version__  # public\n"
    )
    assert private_torch_uses("functd.nn._x", src) == [
        f"functd.nn._x:{line} {what} (import it from functd._torch)"
        for line, what in [
            (3, "torch._dynamo"),
            (4, "from torch._guards"),
            (5, "from torch import _"),
            (6, "torch._C"),
            (9, 'getattr(torch, "_native_multi_head_attention")'),
        ]
    ]
    assert private_torch_uses("functd._torch.ops", src) == []  # the room itself
