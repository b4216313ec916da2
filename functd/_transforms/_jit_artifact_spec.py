"""A compiled artifact's signature and output tree as JSON: no pickle, no user code.

A saved artifact (``_jit_artifact``) must check a call's signature and rebuild the
output tree in a process that never ran ``f``, from a file that is data only. This
module writes both as JSON-able lists and dicts, and reads them back:

- ``inputs(flat)``: per argument its name, kind, structure (a TensorDict's nodes:
  keys, entry types, batch size; another tree's optree structure in words), and per
  leaf its path and either ``[shape, dtype, stride, device]`` (a tensor) or its value
  (``value``: a tagged ``[type, value]``, floats by their hex digits so ``0.0`` and
  ``-0.0`` differ and ``nan`` equals itself). The same function describes a call: the
  signatures match when both descriptions are equal (``mismatch`` says where not).
- ``outputs(out, sources)``: the output tree, each tensor leaf as ``["c", k]`` (the
  k-th computed output) or ``["i", j]`` (input j passed through), TensorDicts with
  their keys and batch size; ``rebuild(tree, computed, ins)`` makes the tree again.

Example:
    >>> desc = inputs(Flat((td,), {}, {}))
    >>> mismatch("load", desc, inputs(Flat((td,), {}, {}))) is None
    True
"""

from __future__ import annotations

import enum
from typing import Any

import optree
import torch

from .._td import TensorDict, from_parts
from .._td._tree import NAMESPACE
from ._jit_trace import Static
from ._signature import Flat

__all__ = ["inputs", "mismatch", "outputs", "rebuild", "value"]

BAD_VALUE = (
    "{name}: {where} is a {kind}; a saved artifact compares non-tensor inputs and "
    "rebuilds constant outputs by value from JSON, which holds None, bools, ints, "
    "floats, complex numbers, strings, tuples of them, torch dtypes, devices, sizes and "
    "enum members (compared by repr). Close over the value in the function instead (it is "
    "then baked into the compiled code), or pass it as a tensor."
)
BAD_NODE = (
    "{name}: the output{where} is a {kind}; a saved artifact rebuilds TensorDicts, "
    "tuples, lists and dicts (string keys) of tensors and plain values without importing "
    "your code. Return a dict or a TensorDict instead (a named tuple: its ._asdict())."
)


def value(v: Any, name: str = "fd.jit", where: str = "a value") -> list[Any]:
    """``v`` as ``[type, value]`` in JSON's terms (see the module doc)."""
    t = type(v)
    if v is None or t in (bool, int, str):
        return [t.__name__, v]
    if t is float:
        return ["float", v.hex()]
    if t is complex:
        return ["complex", [v.real.hex(), v.imag.hex()]]
    if t is tuple:
        return ["tuple", [value(w, name, where) for w in v]]
    if t is torch.dtype or t is torch.device:
        return [t.__name__, str(v)]
    if t is torch.Size:
        return ["Size", list(v)]
    if isinstance(v, enum.Enum):
        return ["enum", repr(v)]
    raise TypeError(BAD_VALUE.format(name=name, where=where, kind=t.__name__))


def _const(tagged: list[Any]) -> Any:
    """The value back from ``value``'s form (outputs only)."""
    kind, v = tagged
    if kind in ("NoneType", "bool", "int", "str"):
        return v
    if kind == "float":
        return float.fromhex(v)
    if kind == "complex":
        return complex(float.fromhex(v[0]), float.fromhex(v[1]))
    if kind == "tuple":
        return tuple(_const(w) for w in v)
    if kind == "dtype":
        return getattr(torch, v.removeprefix("torch."))
    if kind == "device":
        return torch.device(v)
    if kind == "Size":
        return torch.Size(v)
    raise ValueError(f"functd: a saved artifact holds an unknown constant {tagged!r}")


def _path(p: tuple[Any, ...]) -> str:
    return "".join(f"[{k!r}]" for k in p)


def inputs(flat: Flat, name: str = "fd.jit") -> list[dict[str, Any]]:
    """Per argument of the call: its name, kind, structure and leaves (module doc)."""
    names = [f"args[{i}]" for i in range(flat.nargs)] + [f"{k}=" for k in flat.sig[1]]
    out = []
    for n, d in zip(names, flat.descs):
        struct, _, layout, _ = d.key.value
        if d.kind == "tree" and type(d.value) is Static:
            v = value(d.value.value, name, f"the static argument {n}")
            out.append({"name": n, "kind": "static", "value": v})
            continue
        if d.kind == "td":
            shape: Any = [[list(k), [t.__name__ for t in ts], list(b)] for k, ts, b in struct]
        elif d.kind == "tensor":
            shape = "tensor"
        else:
            shape = [str(d.spec), [list(b) for b in layout]]
        leaves = []
        for p, v in zip(d.paths(), d.leaves):
            if isinstance(v, torch.Tensor):
                meta = [list(v.shape), str(v.dtype), list(v.stride()), str(v.device)]
                leaves.append([_path(p), "tensor", meta])
            else:
                leaves.append([_path(p), "value", value(v, name, n + _path(p))])
        out.append({"name": n, "kind": d.kind, "struct": shape, "leaves": leaves})
    return out


def _shown(leaf: list[Any]) -> str:
    if leaf[1] == "tensor":
        shape, dtype, _, device = leaf[2]
        return f"a {dtype.removeprefix('torch.')} tensor of shape {shape} on {device}"
    return _value(leaf[2])


def mismatch(name: str, want: list[dict[str, Any]], got: list[dict[str, Any]]) -> str | None:
    """None when the call's description ``got`` is the saved ``want``; else what
    differs, in words: the first argument (and leaf) that changed, expected vs got."""
    if want == got:
        return None
    names = [a["name"] for a in want], [a["name"] for a in got]
    if names[0] != names[1]:
        return f"the arguments: expected {', '.join(names[0])}; got {', '.join(names[1])}"
    for a, b in zip(want, got):
        if a == b:
            continue
        n = a["name"]
        if a["kind"] == "static" and b["kind"] == "static":
            return f"{n}: expected the static value {_value(a['value'])}; got {_value(b['value'])}"
        if a["kind"] != b["kind"] or a["struct"] != b["struct"]:
            return f"{n}: expected {_struct(a)}; got {_struct(b)}"
        for x, y in zip(a["leaves"], b["leaves"]):
            if x == y:
                continue
            if x[1] == y[1] == "tensor":
                for what, i in (("shape", 0), ("dtype", 1), ("stride", 2), ("device", 3)):
                    if x[2][i] != y[2][i]:
                        return f"{n}{x[0]}: expected {what} {x[2][i]}; got {y[2][i]}"
            return f"{n}{x[0]}: expected {_shown(x)}; got {_shown(y)}"
    return "the signature"


def _value(tagged: list[Any]) -> str:
    return str(tagged[1]) if tagged[0] == "enum" else repr(_const(tagged))


def _struct(a: dict[str, Any]) -> str:
    """An argument's structure in words: a TensorDict's keys and batch size."""
    kind = a["kind"]
    if kind == "td":
        keys = [path for path, *_ in a["leaves"]]
        return f"a TensorDict with keys {keys} and batch size {a['struct'][0][2]}"
    if kind == "static":
        return f"the static value {_value(a['value'])}"
    return "a tensor" if kind == "tensor" else f"the tree {a['struct'][0]}"


def outputs(out: Any, sources: dict[int, list[Any]], name: str) -> Any:
    """The output tree as JSON: ``sources`` maps ``id(tensor leaf)`` to ``["c", k]`` or
    ``["i", j]``; every other leaf is a ``value``."""

    def enc(v: Any, where: str) -> Any:
        if isinstance(v, torch.Tensor):
            return sources[id(v)]
        t = type(v)
        if t is TensorDict:
            items = [[k, enc(w, f"{where}[{k!r}]")] for k, w in v._data.items()]
            return ["TensorDict", items, list(v.batch_size)]
        if t is tuple or t is list:
            return [t.__name__, [enc(w, f"{where}[{i}]") for i, w in enumerate(v)]]
        if t is dict:
            if not all(type(k) is str for k in v):
                kind = "dict with keys that are not strings"
                raise TypeError(BAD_NODE.format(name=name, where=where, kind=kind))
            return ["dict", [[k, enc(w, f"{where}[{k!r}]")] for k, w in v.items()]]
        if optree.tree_is_leaf(v, namespace=NAMESPACE) or v is None:
            tagged = value(v, name, f"the output{where}")
            if tagged[0] != "enum":  # (an enum would need its class imported to rebuild)
                return ["const", tagged]
        raise TypeError(BAD_NODE.format(name=name, where=where, kind=t.__name__))

    return enc(out, "")


def rebuild(tree: Any, computed: list[torch.Tensor], ins: list[torch.Tensor]) -> Any:
    """The output tree of ``outputs``' JSON, with the computed tensors and inputs."""
    kind = tree[0]
    if kind == "c":
        return computed[tree[1]]
    if kind == "i":
        return ins[tree[1]]
    if kind == "const":
        return _const(tree[1])
    if kind == "TensorDict":
        data = {k: rebuild(w, computed, ins) for k, w in tree[1]}
        return from_parts(data, torch.Size(tree[2]))
    if kind == "dict":
        return {k: rebuild(w, computed, ins) for k, w in tree[1]}
    items = [rebuild(w, computed, ins) for w in tree[1]]
    return tuple(items) if kind == "tuple" else items
