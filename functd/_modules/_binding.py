"""How a Module hands its inputs to a layer, and which params it must not train.

``bind_layer``: a dict ``in_keys`` names the arguments of the function it feeds.
For a layer lowered from a torch module the names are those of the torch
module's ``forward`` (``nn.MultiheadAttention``: ``query``, ``key``, ``value``,
...), resolved once to positions of the pure layer (which takes the same
inputs in the same order); for a functd layer, those of its ``__call__``; a
``FunctionalCall`` passes them to the wrapped ``forward`` by name.

``held_paths`` / ``raise_held``: the params entries torch would not train
(buffers and ``requires_grad=False`` parameters), and the check that none of
them is being differentiated (``fd.grad``, ``fd.train_step``, ``torch.func``:
their leaves then require grad), which would let an optimizer change them.

Example:
    >>> m = fd.Module(nn.MultiheadAttention(8, 2), {"q": "query", "k": "key", "v": "value"}, ["o", "w"])
    >>> m._desc.fn.slots, m._desc.fn.defaults[3:5]  # positions 0, 1, 2; torch's defaults after
    ((0, 1, 2), (None, True))
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .. import _errors as E
from ..nn._functional_call import FunctionalCall

__all__ = ["Bound", "bind_layer", "held_paths", "raise_held"]

Path = tuple[str, ...]
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def bind_layer(
    fn: Any, source: Any, names: tuple[str, ...], label: str
) -> tuple[tuple[int, ...], tuple] | None:
    """``(positions, defaults)`` for the argument ``names`` of a layer, or None when the
    layer takes them by name (a ``FunctionalCall``). ``defaults`` holds a value for every
    position up to the last one bound (the bound ones are placeholders)."""
    if isinstance(fn, FunctionalCall):
        sig = fn.signature()
        owner = f"{type(fn.module).__name__}.forward"
        if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            _unknown(label, owner, names, [n for n in sig.parameters])
        return None
    if source is not None:
        sig, owner = inspect.signature(source.forward), f"{type(source).__name__}.forward"
        params = [p for p in sig.parameters.values() if p.kind in _POSITIONAL]
    else:
        sig, owner = inspect.signature(type(fn).__call__), f"{type(fn).__name__}"
        params = [p for p in list(sig.parameters.values())[2:] if p.kind in _POSITIONAL]
    index = {p.name: i for i, p in enumerate(params)}
    _unknown(label, owner, names, list(index))
    slots = tuple(index[n] for n in names)
    defaults = []
    for p in params[: max(slots) + 1]:
        if p.name not in names and p.default is p.empty:
            raise TypeError(
                f"{label}: {owner} needs its argument {p.name!r}, which in_keys does not give; "
                f"add an entry for it ({{td_key: {p.name!r}}}), or give every argument "
                "positionally with a list in_keys."
            )
        defaults.append(None if p.name in names else p.default)
    return slots, tuple(defaults)


class Bound:
    """A layer called with inputs bound by name: ``bound(params, *args, key=None)``
    calls the layer with each arg at its position (``slots``) and ``defaults`` in the
    gaps, or (``slots`` None: a ``FunctionalCall``) its ``forward`` by name."""

    __slots__ = ("defaults", "fn", "names", "slots")

    def __init__(self, fn: Any, source: Any, names: tuple[str, ...], label: str) -> None:
        bound = bind_layer(fn, source, names, label)
        self.fn, self.names = fn, names
        self.slots: tuple[int, ...] | None = None if bound is None else bound[0]
        self.defaults: tuple | None = None if bound is None else bound[1]

    def __call__(self, params: Any, *args: Any, key: Any = None) -> Any:
        fn = self.fn
        if self.slots is None:  # a torch module's forward, by name
            return fn.call_with(params, (), dict(zip(self.names, args)), key)
        pos = list(self.defaults)  # type: ignore[arg-type]
        for i, v in zip(self.slots, args):
            pos[i] = v
        return fn(params, *pos, key=key) if fn.random else fn(params, *pos)


def _unknown(label: str, owner: str, names: tuple[str, ...], known: list[str]) -> None:
    bad = [n for n in names if n not in known]
    if bad:
        raise TypeError(
            f"{label}: in_keys names the argument(s) {bad}, which {owner} does not take; its "
            f"arguments are {known}. A dict in_keys maps td keys to argument names "
            "({td_key: argument}; with out_to_in_map=True, {argument: td_key})."
        )


def held_paths(fn: Any, source: Any) -> tuple[Path, ...]:
    """The params paths of a layer that torch would not train: its buffers, and the
    parameters that had ``requires_grad=False`` in the torch module it came from."""
    held = list(fn.buffer_paths())
    if isinstance(fn, FunctionalCall):
        held.extend(fn.frozen_paths())
    elif source is not None:
        held.extend(
            tuple(n.split(".")) for n, p in source.named_parameters() if not p.requires_grad
        )
    return tuple(held)


def raise_held(m: Any, params: Any) -> None:
    """Raise when an entry of ``m._held`` is being differentiated (it requires grad)."""
    bad = []
    for path in m._held:
        v: Any = params
        for part in path:
            v = v._data.get(part) if hasattr(v, "_data") else None
        if isinstance(v, torch.Tensor) and v.requires_grad:
            bad.append(path)
    if bad:
        raise ValueError(E.HELD_OUT.format(label=m._label(), paths=E.fmt_keys(bad)))
