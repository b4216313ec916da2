"""The straight-line Python around a jitted call: check the arguments, rebuild outputs.

Once per compiled signature two small functions are generated as source and
``exec``'d (as ``functd._modules._plan`` does for Sequential calls), so that a
call of a known signature runs a handful of Python lines around the compiled code:

- ``match(args, kwargs)``: the call's tensor leaves when it has that signature,
  else None. An argument passed again (the same TensorDict object, as the
  wrapper's memo holds it) is recognised by identity; a TensorDict by its batch size, its keys in
  insertion order, at every level) and each leaf's type, shape, dtype, strides,
  device and ``requires_grad`` (dynamo's C++ ``TensorGuards``, one call per
  argument); a tensor by the same test; anything else by its signature key
  (``_signature.Desc``).
- ``outputs(ins)``: run the compiled code on the flat inputs and rebuild
  the output tree: TensorDicts are allocated with their dict, batch size (the
  traced one when static, the first leaf's when symbolic) and key spec through
  the slot setters; tuples, lists, None and constants are written out; any
  other node (dicts, named tuples) goes through ``optree.tree_unflatten``.

``source(fn)`` gives the generated text of either.

Example:
    >>> match = make_match(flat, memo)
    >>> ins = match((params, td), {})       # None when the signature differs
    >>> out = make_outputs(out, spec, sources, constants, run)(ins)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from .._td import TensorDict, new_unchecked, set_spec_slot
from .._td._tree import NAMESPACE, spec_of
from ._jit_trace import Direct
from ._signature import Desc, Flat

__all__ = ["make_match", "make_outputs", "source"]


class _Code:
    """Lines of one generated function and the constants they name."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {
            "_TD": TensorDict,
            "_new": new_unchecked,
            "_ss": set_spec_slot,
            "_Desc": Desc,
            "_unflatten": optree.tree_unflatten,
        }

    def const(self, prefix: str, value: Any) -> str:
        name = f"{prefix}{len(self.ns)}"
        self.ns[name] = value
        return name

    def build(self, header: str, filename: str) -> Callable[..., Any]:
        src = "\n".join([header, *("    " + ln for ln in self.lines)]) + "\n"
        self.ns["__source__"] = src
        exec(compile(src, filename, "exec"), self.ns)
        fn = self.ns[header.split()[1].split("(")[0]]
        fn.__source__ = src
        return fn


def source(fn: Callable[..., Any]) -> str:
    """The generated source of a ``make_match``/``make_outputs`` function."""
    return getattr(fn, "__source__", "")


# ------------------------------------------------------------------ match
def _guard(c: _Code, tensors: list[Tensor]) -> str:
    """The name of a check of ``tensors``' type, dispatch keys, shape, strides, dtype,
    device and requires_grad: dynamo's C++ ``TensorGuards`` (one call for all of
    them, ~0.1 µs a tensor), or the same tests in Python where torch lacks it."""
    try:
        from .._torch.dynamo import TensorGuards

        g = TensorGuards(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],  # type: ignore[misc]
            dynamic_dims_strides=[list(t.stride()) for t in tensors],  # type: ignore[misc]
        )
        return c.const("G", g.check)
    except (ImportError, TypeError, RuntimeError):
        return c.const("G", _PyCheck(tensors))


class _Meta(NamedTuple):
    """What ``_PyCheck`` compares of one tensor (besides ``requires_grad``, never set)."""

    type: type
    shape: torch.Size
    dtype: torch.dtype
    stride: tuple[int, ...]
    device: torch.device


class _PyCheck:
    """``TensorGuards.check`` written in Python, for a torch without it."""

    def __init__(self, tensors: list[Tensor]) -> None:
        self.metas = [_Meta(type(v), v.shape, v.dtype, v.stride(), v.device) for v in tensors]

    def __call__(self, *xs: Tensor) -> bool:
        for x, (ty, s, dt, st, dv) in zip(xs, self.metas):
            if (
                type(x) is not ty
                or x.shape != s
                or x.dtype is not dt
                or x.stride() != st
                or x.device != dv
                or x.requires_grad
            ):
                return False
        return True


def _td_lines(c: _Code, a: str, out: str, d: Desc) -> None:
    """Lines checking that ``a`` is a TensorDict laid out as ``d`` (its nodes' batch
    sizes, keys in order, entry kinds) and binding ``out`` to its leaves in order."""
    nodes = iter(d.key.value[0])  # preorder: (keys, entry types, batch size)
    leaves: list[str] = []

    def node(expr: str) -> None:
        keys, types, bs = next(nodes)
        n = f"n{len(c.lines)}"
        k, b = c.const("K", keys), c.const("BS", bs)
        c.lines.append(
            f"if type({expr}) is not _TD or {expr}._batch_size != {b} or tuple({expr}._data) != {k}:"
        )
        c.lines.append("    return None")
        c.lines.append(f"{n} = list({expr}._data.values())")
        for i, ty in enumerate(types):
            if ty is TensorDict:
                node(f"{n}[{i}]")
            else:
                leaves.append(f"{n}[{i}]")

    node(a)
    c.lines.append(f"{out} = [{', '.join(leaves)}]")


def make_match(
    flat: Flat, memo: dict[Any, Any]
) -> Callable[[tuple[Any, ...], dict[Any, Any]], list[Any] | None]:
    """``match(args, kwargs)``: the tensor leaves of a call with ``flat``'s signature
    (in ``flat.tensors`` order), or None. ``memo`` is the wrapper's ``Flat`` memo
    (argument position -> the latest TensorDict described there, and its
    description): a TensorDict found there is known by identity. The function holds
    no argument of its own (a data TensorDict would stay alive with it)."""
    c = _Code()
    c.ns["MEMO"] = memo
    n, kw = flat.nargs, flat.sig[1]
    c.lines.append(f"if len(args) != {n}:")
    c.lines.append("    return None")
    if kw:
        c.lines.append(f"if tuple(kwargs) != {kw!r}:")
        c.lines.append("    return None")
        c.lines.append("args = (*args, *kwargs.values())")
    else:
        c.lines.append("if kwargs:")
        c.lines.append("    return None")
    names = [f"a{i}" for i in range(len(flat.descs))]
    if names:
        c.lines.append(f"{', '.join(names)}, = args")
    parts = []
    for i, (a, d) in enumerate(zip(names, flat.descs)):
        out = f"i{i}"
        if d.kind == "tensor":
            c.lines.append(f"if not {_guard(c, [d.value])}({a}):")
            c.lines.append("    return None")
            parts.append(f"{a},")
            continue
        if d.value is None:
            c.lines.append(f"if {a} is not None:")
            c.lines.append("    return None")
            continue
        if d.kind == "td":  # passed again (the wrapper's memo): its layout is known
            g, key = _guard(c, d.tensors), c.const("KEY", d.key)
            c.lines.append(f"m = MEMO.get({i})")
            c.lines.append(f"if m is not None and {a} is m[0] and m[1].key == {key}:")
            c.lines.append(f"    {out} = m[1].tensors")
            c.lines.append("else:")
            at = len(c.lines)
            _td_lines(c, a, out, d)
            c.lines[at:] = ["    " + ln for ln in c.lines[at:]]
            # the leaves, in both cases (a leaf may have been switched in place since,
            # e.g. requires_grad_())
            c.lines.append(f"if not {g}(*{out}):")
            c.lines.append("    return None")
        else:
            _generic_lines(c, a, out, d)
        parts.append(f"*{out},")
    c.lines.append(f"return [{' '.join(parts)}]")
    return c.build("def match(args, kwargs):", "<fd.jit argument check>")


def _generic_lines(c: _Code, a: str, out: str, d: Desc) -> None:
    key = c.const("KEY", d.key)
    c.lines.append(f"e = _Desc({a})")
    c.lines.append(f"if e.key != {key} or e.grad:")
    c.lines.append("    return None")
    c.lines.append(f"{out} = e.tensors")


# ------------------------------------------------------------------ outputs
class _Unsupported(Exception):
    pass


def _node(c: _Code, v: Any, leaves: list[str]) -> str:
    """The expression of output ``v`` (statements for its TensorDicts go to ``c``)."""
    t = type(v)
    if t is TensorDict:
        return _td_node(c, v, leaves)
    if t is tuple or t is list:
        items = [_node(c, x, leaves) for x in v]
        if t is list:
            return "[" + ", ".join(items) + "]"
        return "(" + "".join(i + ", " for i in items) + ")"
    if v is None:
        return "None"
    if t is dict or not optree.tree_is_leaf(v, namespace=NAMESPACE):
        raise _Unsupported
    return leaves.pop(0)


def _td_node(c: _Code, td: TensorDict, leaves: list[str]) -> str:
    spec = spec_of(td)
    if not spec.all_full:
        raise _Unsupported  # an entry without tensors: its batch size is not in its leaves
    exprs = {}
    for k in spec.keys:  # leaves come in sorted-key order
        v = td._data[k]
        if not isinstance(v, Tensor | TensorDict):
            raise _Unsupported
        exprs[k] = _node(c, v, leaves)
    order = spec.order or spec.keys
    n = len(td._batch_size)
    if all(type(s) is int for s in td._batch_size):
        bs = c.const("BS", td._batch_size)
    else:  # symbolic: read from the first entry, as unflattening does
        first = exprs[order[0]]
        attr = "shape" if isinstance(td._data[order[0]], Tensor) else "_batch_size"
        bs = f"{first}.{attr}[:{n}]"
    name = f"t{len(c.lines)}"
    data = "{" + ", ".join(f"{k!r}: {exprs[k]}" for k in order) + "}"
    c.lines += [
        f"{name} = _new({data}, {bs})",
        f"_ss({name}, {c.const('SP', spec)})",
    ]
    return name


def make_outputs(
    out: Any,
    spec: optree.PyTreeSpec,
    sources: list[str],
    constants: list[Any],
    run: Callable[..., Any],
) -> Callable[[list[Any]], Any]:
    """``outputs(ins)``: run the compiled code on ``ins``, then build the output tree.
    ``sources`` is the expression of each output leaf (``c[i]``: the i-th computed
    output; ``ins[j]``: an input passed through or donated; ``K[i]``: the constant
    ``constants[i]``). ``run`` is called on a copy of ``ins`` (it may consume its
    list), or, for inductor's C++ entry point (``Direct``), inline."""
    c = _Code()
    c.ns["K"] = constants
    if isinstance(run, Direct):
        c.ns.update(_alloc_h=run.alloc, _entry=run.entry, _steal=run.steal)
        first = "c = _steal(_entry(_alloc_h(ins)))"
    else:
        c.ns["_run"] = run
        first = "c = _run(list(ins))"
    c.lines.append(first)
    try:
        body = _node(c, out, list(sources))
    except _Unsupported:
        c.lines = [first]
        body = f"_unflatten({c.const('SPEC', spec)}, [{', '.join(sources)}])"
    c.lines.append(f"return {body}")
    return c.build("def outputs(ins):", "<fd.jit outputs>")
