"""Module: one pure step ``(params, td) -> new td`` that reads and writes named entries.

A Module is a frozen, hashable description: the function it applies, the keys
it reads and the keys it writes. It holds no tensors. The function may be a
functd pure layer (``fd.nn.Linear``), a ``torch.nn.Module`` (lowered to a pure
layer when functd knows it, else run with ``torch.func.functional_call`` on a
private copy) or any callable without parameters (``torch.relu``, a lambda).

Example:
    >>> lin = fd.Module(nn.Linear(3, 4), in_keys=["x"], out_keys=["h"])
    >>> params = lin.init(fd.random.key(0))
    >>> out = lin(params, fd.TensorDict({"x": torch.randn(5, 3)}, [5]))
    >>> out["h"].shape
    torch.Size([5, 4])
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .. import _errors as E
from .._td import Key, TensorDict, from_parts, plain_str
from ..nn._base import Layer
from ..nn._lower import FunctionalCall, lower
from ._binding import Bound, held_paths
from ._call import ModuleKind, Options, positional_call
from ._keys import as_keys
from ._sequential import Sequential
from ._step import Form, Step, run_step

__all__ = ["Module", "as_keys", "positional_call"]


def _is_layer(fn: Any) -> bool:
    return isinstance(fn, Layer)


def _lower(fn: torch.nn.Module):
    layer = lower(fn)
    return layer if layer is not None else FunctionalCall(fn)


def _check_arity(fn: Callable, n: int, kwargs: tuple | None, label: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins such as torch.relu: nothing to check
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params) and kwargs is None:
        return
    if kwargs is not None:
        try:
            sig.bind(**dict.fromkeys(kwargs))
        except TypeError as e:
            raise TypeError(
                f"{label}: the function cannot take keywords {list(kwargs)}: {e}"
            ) from None
        return
    try:
        sig.bind(*range(n))
    except TypeError:
        required = [
            p.name
            for p in params
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        raise TypeError(
            f"{label}: the function takes {len(required)} positional argument(s) "
            f"({', '.join(required)}) but in_keys has {n}; give one in_key per argument."
        ) from None


class Module(ModuleKind):
    """One pure step: read ``in_keys``, apply ``fn``, write ``out_keys``.

    Args:
        fn: a functd layer, a ``torch.nn.Module`` or a callable without params.
        in_keys: keys read, passed positionally in order; or a dict mapping td
            keys to keyword-argument names (see ``out_to_in_map``). Nested
            tuples are flattened as in tensordict (``("c", ("d",))``).
        out_keys: keys written, one per output (a tuple output; or a mapping
            or a TensorDict that holds every out_key, read by key).
        out_to_in_map: the direction of a dict ``in_keys``. ``None`` (functd's
            default) and ``False`` read ``{td_key: argument}``; ``True`` reads
            ``{argument: td_key}``, tensordict's default (one td key may then
            feed several arguments).

    Raises:
        TypeError: keys are malformed, or a Python function's arity differs
            from ``in_keys``.
        ValueError: ``out_keys`` has duplicates; ``out_to_in_map`` without a
            dict ``in_keys``.

    Example:
        >>> add = fd.Module(lambda x, y: x + y, in_keys=["x", "a"], out_keys=["y"])
        >>> add(None, td)  # no params
        >>> add(None, x, a)  # tensors in in_keys order -> the output tensor
    """

    __slots__ = (
        "_desc",
        "_fn",
        "_has_params",
        "_held",
        "_kwargs",
        "_out_all",
        "_random",
        "_source",
        "_stateful",
        "in_keys",
        "out_keys",
    )
    _desc: Any
    _fn: Any
    _has_params: Any
    _held: Any
    _kwargs: Any
    _out_all: Any
    _random: Any
    _source: Any
    _stateful: Any
    _FROZEN_HINT = "build a new Module instead."

    def __init__(
        self,
        fn: Callable[..., Any],
        in_keys: Sequence[Key] | Mapping[Key, str] | Key,
        out_keys: Sequence[Key] | Key,
        *,
        out_to_in_map: bool | None = None,
    ) -> None:
        kwargs = None
        if isinstance(in_keys, Mapping):
            if out_to_in_map:  # tensordict's default: {argument: td_key}
                kwargs = tuple(in_keys.keys())
                in_keys = list(in_keys.values())
            else:
                kwargs = tuple(in_keys.values())
                in_keys = list(in_keys.keys())
            bad = [a for a in kwargs if not isinstance(a, str)]
            if bad:
                raise TypeError(
                    f"Module: a dict in_keys maps td keys to argument names (str); got "
                    f"argument name(s) {bad!r}. With {{argument: td_key}} pass out_to_in_map=True."
                )
            kwargs = tuple(plain_str(a) for a in kwargs)  # type: ignore[arg-type]  # a str subclass: its value
        elif out_to_in_map is not None:
            raise ValueError(
                "Module: out_to_in_map only applies to a dict in_keys ({td_key: argument} or, "
                f"with out_to_in_map=True, {{argument: td_key}}); in_keys is {in_keys!r}."
            )
        ins = as_keys(in_keys, "in_keys")
        outs = as_keys(out_keys, "out_keys")
        if len(set(outs)) != len(outs):
            dup = sorted({E.fmt_key(k) for k in outs if outs.count(k) > 1})
            raise ValueError(
                f"Module out_keys has duplicates: {', '.join(dup)}; each output needs its own key."
            )
        if not outs:
            raise ValueError("Module needs at least one out_key.")
        if kwargs is not None and len(set(kwargs)) != len(kwargs):
            dup = sorted({a for a in kwargs if kwargs.count(a) > 1})  # type: ignore[misc]
            raise ValueError(
                f"Module: in_keys gives the argument(s) {dup} more than one td key; each "
                "argument takes one entry."
            )
        source = None
        if isinstance(fn, torch.nn.Module) and not _is_layer(fn):
            source, fn = fn, _lower(fn)
        elif not callable(fn):
            raise TypeError(
                f"Module(fn) takes a callable, a torch.nn.Module or a functd layer; got {type(fn).__name__}"
            )
        self._setup(fn, source, ins, outs, kwargs)

    def _setup(self, fn: Any, source: Any, ins: tuple, outs: tuple, kwargs: tuple | None) -> None:
        """Fill the slots from the (lowered) function, the torch module it came from and
        the normalised keys; ``with_training`` rebuilds through it too."""
        layer = _is_layer(fn)
        set_ = object.__setattr__
        set_(self, "_fn", fn)
        set_(self, "_source", source)
        set_(self, "in_keys", ins)
        set_(self, "out_keys", outs)
        set_(self, "_out_all", outs)  # every output fn returns (select_out_keys keeps some)
        set_(self, "_kwargs", kwargs)
        set_(self, "_has_params", layer and fn.has_params)
        set_(self, "_random", layer and fn.random)
        set_(self, "_stateful", layer and fn.stateful)
        # paths of params that torch would not train (buffers, requires_grad=False)
        set_(self, "_held", held_paths(fn, source) if layer else ())
        if not layer:
            _check_arity(fn, len(ins), kwargs, self._label())
        set_(self, "_desc", _describe(self, fn, source, kwargs))

    # ---------------------------------------------------------------- value
    @property
    def fn(self) -> Callable[..., Any]:
        """The function applied: a functd layer or a plain callable."""
        return self._fn

    @property
    def has_params(self) -> bool:
        return self._has_params

    @property
    def random(self) -> bool:
        """True when a call needs a PRNG ``key``."""
        return self._random

    @property
    def stateful(self) -> bool:
        """True when a call computes new running statistics (BatchNorm in training
        mode): call it with ``apply_with_state``; a plain call raises."""
        return self._stateful

    @property
    def out_keys_source(self) -> tuple[Key, ...]:
        """Every output the function returns, before ``select_out_keys``
        (tensordict's name)."""
        return self._out_all

    def select_out_keys(self, *keys: Key) -> Module:
        """A new Module that writes only ``keys`` of its outputs; ``self`` is unchanged.

        The function still computes every output; the others are not written (the
        input entries stay). A keyword or positional call returns the selected
        tensors only. ``m.out_keys`` is the selection, ``m.out_keys_source`` all.

        Raises:
            KeyError: a key is not one of ``out_keys``.

        Example:
            >>> m = fd.Module(lambda x, y: (x, y, x), ["a", "b"], ["c", "d", "e"])
            >>> m.select_out_keys("d").out_keys
            ('d',)
        """
        if len(keys) == 1 and isinstance(keys[0], list):
            raise KeyError(
                f"{self._label()}.select_out_keys takes keys, not a list: pass them "
                f"unpacked, m.select_out_keys(*{keys[0]!r})."
            )
        sel = as_keys(list(keys), "select_out_keys")
        bad = [k for k in sel if k not in self.out_keys]
        if bad or not sel:
            raise KeyError(
                f"{self._label()}.select_out_keys: it writes no {E.fmt_keys(bad) or '(no key given)'}; "
                f"its out_keys are {E.fmt_keys(self.out_keys)}."
            )
        new = object.__new__(Module)
        for name in Module.__slots__:
            object.__setattr__(new, name, getattr(self, name))
        keep = tuple(k for k in self._out_all if k in sel)
        object.__setattr__(new, "out_keys", keep)
        object.__setattr__(new, "_desc", self._desc._replace(keep=keep))
        return new

    def _identity(self) -> tuple:
        return (self._fn, self.in_keys, self.out_keys, self._kwargs, self._out_all)

    # ---------------------------------------------------------------- protocol
    def with_training(self, training: bool) -> Module:
        """The same Module with its layer switched to training or eval mode (BatchNorm,
        Dropout, a torch module run through ``FunctionalCall``); ``self`` if unchanged."""
        fn = self._fn.with_training(training) if _is_layer(self._fn) else self._fn
        if fn is self._fn:
            return self
        new = object.__new__(Module)
        new._setup(fn, self._source, self.in_keys, self._out_all, self._kwargs)
        if new.out_keys != self.out_keys:
            new = new.select_out_keys(*self.out_keys)
        return new

    def own_buffer_paths(self) -> tuple[tuple[str, ...], ...]:
        return self._fn.buffer_paths() if _is_layer(self._fn) else ()

    def own_held_paths(self) -> tuple[tuple[str, ...], ...]:
        return self._held

    def torch_source(self) -> torch.nn.Module | None:
        return self._source

    def describe(self) -> Step:
        """The description of this Module's step (``_step.py``): what the reference loop
        runs and the plan writes out."""
        return self._desc

    def _label(self) -> str:
        src = self._source
        name = type(src).__name__ if src is not None else None
        name = name or getattr(self._fn, "__name__", None) or type(self._fn).__name__
        if name == "<lambda>":
            name = "lambda"
        outs = ", ".join(E.fmt_key(k) for k in self.out_keys)
        return f"Module({name} -> {outs})"

    def __repr__(self) -> str:
        fn = (
            self._fn
            if _is_layer(self._fn)
            else getattr(self._fn, "__name__", type(self._fn).__name__)
        )
        return f"Module({fn}, in_keys={list(self.in_keys)}, out_keys={list(self.out_keys)})"

    def __rshift__(self, other: Any) -> Sequential:
        return Sequential(self, other)

    # ---------------------------------------------------------------- params
    def init(self, key: Any, dtype: torch.dtype = torch.float32, device: Any = None) -> TensorDict:
        """Fresh parameters (a TensorDict), deterministic in ``key``; empty when none.

        ``key`` is a ``fd.random`` key (or an int seed). Usable under vmap over keys.
        """
        if not self._has_params:
            return from_parts({}, torch.Size([]))
        return self._fn.init(key, dtype=dtype, device=device)

    # ---------------------------------------------------------------- call
    # __call__, run_td and apply_with_state: ModuleKind's (functd/_modules/_call.py)
    def run(
        self, params: TensorDict | None, data: dict, bs: torch.Size, opts: Options | None
    ) -> TensorDict | None:
        """The step on the working dict ``data``: its description run (``_step.run_step``)."""
        return run_step(self, self._desc, params, data, bs, opts)


#: Functions whose output has the shape of their (tensor) input: the batch-dims check
#: of their output is implied by their input's, which is already checked.
_SHAPE_KEEPING = frozenset(
    {
        torch.relu,
        torch.tanh,
        torch.sigmoid,
        torch.neg,
        torch.exp,
        torch.abs,
        F.relu,
        F.gelu,
        F.silu,
        F.elu,
        F.leaky_relu,
        F.softplus,
        F.mish,
        F.hardtanh,
        F.relu6,
    }
)


def _keeps_shape(fn: Any) -> bool:
    try:
        return fn in _SHAPE_KEEPING
    except TypeError:  # an unhashable callable
        return False


def _describe(m: Module, fn: Any, source: Any, kwargs: tuple | None) -> Step:
    """The Step of Module ``m`` around its (lowered) function ``fn``."""
    layer, key, names, token = _is_layer(fn), False, None, None
    if not layer:
        form, names = (Form.KEYWORDS, kwargs) if kwargs else (Form.PLAIN, None)
    elif kwargs:  # bound by name to the layer's positions (or a forward's names)
        fn, form, key = Bound(fn, source, kwargs, m._label()), Form.LAYER, fn.random
    elif not fn.has_params and not fn.random and hasattr(fn, "function"):
        fn, form = fn.function(), Form.PLAIN  # a param-free layer's plain function
    else:
        form, key = Form.LAYER, fn.random
    if m._has_params:
        token = m._fn
    elif form is Form.LAYER:
        form = Form.EMPTY
    same = form is Form.PLAIN and len(m.in_keys) == 1 and _keeps_shape(fn)
    inline = getattr(fn, "plan_inline", None) if form is Form.LAYER and not key else None
    if inline is not None and (len(m.in_keys) != 1 or type(fn).__call__ is not inline.call):
        inline = None
    outs = m._out_all
    return Step(
        m.in_keys, fn, form, key, names, token, m._held, outs, outs, m._stateful, same, inline
    )
