"""Errors raised inside a module's function, re-raised naming the module.

torch's own message for a layer given the wrong input (``mat1 and mat2 shapes
cannot be multiplied (5x4 and 3x8)``) names no module and no key. When a
Module's function (a lowered layer, a wrapped torch module, any callable) raises a
``RuntimeError``, ``ValueError``, ``TypeError``, ``IndexError`` or
``NotImplementedError`` (exactly those types: a subclass is someone's own error, such
as fd.jit's or dynamo's, and goes through untouched), it is re-raised as the same
type with a message naming the module, the keys it read with the shapes and
dtypes that came in (inside fd.vmap: one example's), a few of its params, and
torch's message last; torch's error is its ``__cause__``. A sequence the error
passes through adds the position of the child it ran (``module 1 of
Sequential(...)``), outermost last; the error keeps its type throughout.

The handlers are ``except`` clauses around the calls (free in CPython 3.11 until
something raises). Under dynamo (``torch.compile``) nothing is rewritten. Under
fd.jit's trace the new error carries torch's traceback on, so fd.jit still finds
the op that refused its operands and names it (its message then quotes this one).

Example:
    >>> lin = fd.Module(nn.Linear(3, 8), ["x"], ["h"])
    >>> lin(lin.init(0), fd.TensorDict({"x": torch.randn(5, 4)}, [5]))
    Traceback (most recent call last):
    RuntimeError: Module(Linear -> 'h') failed on its input 'x' float32[5, 4] (params:
    weight float32[8, 3], bias float32[8]): mat1 and mat2 shapes cannot be multiplied ...
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _errors as E
from .._td import TensorDict, is_dynamo_compiling

__all__ = ["CAUGHT", "in_module", "in_sequence"]

#: The exception types a module's call may raise for bad inputs (what the ``except``
#: clauses catch); only these exact types are rewritten.
CAUGHT = (RuntimeError, ValueError, TypeError, IndexError)
_REWRITTEN = frozenset({RuntimeError, ValueError, TypeError, IndexError, NotImplementedError})
_MAX_PARAMS = 6  # params leaves listed; more are counted
_ATTR = "_functd_raised_in"


class _Where:
    """What the message says: the module, its inputs and params (formatted once, where
    it raised), the sequence positions it ran at (innermost first), torch's message."""

    __slots__ = ("hint", "inputs", "label", "original", "params", "path")

    def __init__(self, label: str, inputs: str, params: str, e: BaseException) -> None:
        self.label, self.inputs, self.params, self.original = label, inputs, params, str(e)
        what = "shapes, dtypes and values" if type(e) is ValueError else "shapes and dtypes"
        self.hint = f"check their {what}"
        self.path: list[str] = []

    def message(self) -> str:
        where = f" ({', in '.join(self.path)})" if self.path else ""
        return f"{self.label}{where} failed on {self.inputs}{self.params} ({self.hint}): {self.original}"


def _leaf(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
    if isinstance(v, TensorDict):
        return f"TensorDict{list(v.batch_size)}"
    return type(v).__name__


def _inputs(in_keys: tuple[Any, ...], args: Any) -> str:
    if args is None:
        return f"its input(s) {E.fmt_keys(in_keys)}"
    parts = [f"{E.fmt_key(k)} {_leaf(v)}" for k, v in zip(in_keys, args)]
    return f"its input{'s' if len(parts) != 1 else ''} {', '.join(parts) or '(none)'}"


def _params(params: Any) -> str:
    if type(params) is not TensorDict:
        return ""
    leaves = list(params.items(True, True))
    if not leaves:
        return ""
    shown = [
        f"{'.'.join(k) if isinstance(k, tuple) else k} {_leaf(v)}" for k, v in leaves[:_MAX_PARAMS]
    ]
    more = f", ... ({len(leaves) - _MAX_PARAMS} more)" if len(leaves) > _MAX_PARAMS else ""
    return f" (params: {', '.join(shown)}{more})"


def in_module(m: Any, e: BaseException, args: Any, params: Any) -> BaseException | None:
    """The error to raise (``from e``) for ``e``, raised by the function of Module ``m``
    called on ``args`` (its inputs in ``m.in_keys`` order; None: unknown) with
    ``params``; None: re-raise ``e`` as it is (not one of ``CAUGHT``'s plain types,
    already named, or under dynamo)."""
    if type(e) not in _REWRITTEN or hasattr(e, _ATTR) or is_dynamo_compiling():
        return None
    try:
        where = _Where(m._label(), _inputs(m.in_keys, args), _params(params), e)
        new = type(e)(where.message())
    except Exception:  # a message we cannot build: torch's error as it is
        return None
    setattr(new, _ATTR, where)
    if torch.compiler.is_compiling():  # fd.jit's trace reads the op from the traceback
        new = new.with_traceback(e.__traceback__)
    return new


def in_sequence(seq: Any, name: str, e: BaseException) -> None:
    """Add ``module {name} of {seq}`` to the message of ``e`` (an error that
    ``in_module`` made), raised by child ``name`` of ``seq``; other errors are left as
    they are. The caller re-raises ``e``."""
    where = getattr(e, _ATTR, None)
    if type(where) is not _Where:
        return
    where.path.append(f"module {name} of {seq._label()}")
    e.args = (where.message(),)
