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

from . import _dtensor as _dt
from . import _errors as E
from ._dtensor import placed_inputs as _placed_inputs
from ._dtensor import set_placed as _set_placed
from ._td import Key, TensorDict, _check_key, _new, _set_checked, _set_path

__all__ = ["Module", "as_keys"]

_EMPTY = None


def _empty_params() -> TensorDict:
    global _EMPTY
    if _EMPTY is None:
        _EMPTY = _new({}, torch.Size([]))
    return _EMPTY


def as_keys(keys: Any, what: str) -> tuple[Key, ...]:
    """Normalise ``in_keys``/``out_keys``: a str, or a sequence of str/tuple keys."""
    if isinstance(keys, str | tuple) and (
        isinstance(keys, str) or all(isinstance(k, str) for k in keys)
    ):
        keys = [keys]
    if not isinstance(keys, Sequence):
        raise TypeError(f"{what} must be a list of keys (str or tuple of str), got {keys!r}")
    out = []
    for k in keys:
        path = _check_key(k)
        out.append(path[0] if len(path) == 1 else path)
    return tuple(out)


def _kwarg_name(key: Key) -> str:
    return key if isinstance(key, str) else "_".join(key)


def _is_layer(fn: Any) -> bool:
    from .nn import Layer

    return isinstance(fn, Layer)


def _lower(fn: torch.nn.Module):
    from .nn import FunctionalCall, lower

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


class Module:
    """One pure step: read ``in_keys``, apply ``fn``, write ``out_keys``.

    Args:
        fn: a functd layer, a ``torch.nn.Module`` or a callable without params.
        in_keys: keys read, passed positionally in order; or a dict mapping td
            keys to keyword-argument names.
        out_keys: keys written, one per output (a tuple output or a mapping
            read by key).

    Raises:
        TypeError: keys are malformed, or a Python function's arity differs
            from ``in_keys``.
        ValueError: ``out_keys`` has duplicates.

    Example:
        >>> add = fd.Module(lambda x, y: x + y, in_keys=["x", "a"], out_keys=["y"])
        >>> add(None, td)  # no params
    """

    __slots__ = (
        "_fn",
        "_has_params",
        "_kind",
        "_kwargs",
        "_plain",
        "_random",
        "_run",
        "_source",
        "_stateful",
        "in_keys",
        "out_keys",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        in_keys: Sequence[Key] | Mapping[Key, str] | Key,
        out_keys: Sequence[Key] | Key,
    ) -> None:
        kwargs = None
        if isinstance(in_keys, Mapping):
            kwargs = tuple(in_keys.values())
            in_keys = list(in_keys.keys())
        ins = as_keys(in_keys, "in_keys")
        outs = as_keys(out_keys, "out_keys")
        if len(set(outs)) != len(outs):
            dup = sorted({E.fmt_key(k) for k in outs if outs.count(k) > 1})
            raise ValueError(
                f"Module out_keys has duplicates: {', '.join(dup)}; each output needs its own key."
            )
        if not outs:
            raise ValueError("Module needs at least one out_key.")
        source = None
        if isinstance(fn, torch.nn.Module) and not _is_layer(fn):
            source, fn = fn, _lower(fn)
        elif not callable(fn):
            raise TypeError(
                f"Module(fn) takes a callable, a torch.nn.Module or a functd layer; got {type(fn).__name__}"
            )
        layer = _is_layer(fn)
        plain = None  # a param-free layer's plain function, called directly on the hot path
        if layer and not fn.has_params and not fn.random and hasattr(fn, "function"):
            plain = fn.function()
        set_ = object.__setattr__
        set_(self, "_fn", fn)
        set_(self, "_source", source)
        set_(self, "in_keys", ins)
        set_(self, "out_keys", outs)
        set_(self, "_kwargs", kwargs)
        set_(self, "_has_params", layer and fn.has_params)
        set_(self, "_random", layer and fn.random)
        set_(self, "_stateful", layer and fn.stateful)
        # how _step calls fn: 0 layer with params, 1 layer without, 2 callable, 3 keywords
        set_(self, "_kind", (0 if fn.has_params else 1) if layer else (3 if kwargs else 2))
        set_(self, "_plain", fn)
        if plain is not None:
            set_(self, "_kind", 2)
            set_(self, "_plain", plain)
        if not layer:
            _check_arity(fn, len(ins), kwargs, self._label())
        set_(self, "_run", _make_run(self))

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

    def _identity(self) -> tuple:
        return (self._fn, self.in_keys, self.out_keys, self._kwargs)

    def __eq__(self, other: object) -> bool:
        return type(other) is Module and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __setattr__(self, name: str, value: Any) -> None:
        raise E.FrozenError(
            f"Module is immutable: cannot set {name!r}; build a new Module instead."
        )

    def _label(self) -> str:
        name = getattr(self._fn, "__name__", None) or type(self._fn).__name__
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

    def __rshift__(self, other: Any):
        from ._sequential import Sequential

        return Sequential(self, other)

    # ---------------------------------------------------------------- params
    def init(self, key: Any, dtype: torch.dtype = torch.float32, device: Any = None) -> TensorDict:
        """Fresh parameters (a TensorDict), deterministic in ``key``; empty when none.

        ``key`` is a ``fd.random`` key (or an int seed). Usable under vmap over keys.
        """
        if not self._has_params:
            return _new({}, torch.Size([]))
        return self._fn.init(key, dtype=dtype, device=device)

    # ---------------------------------------------------------------- call
    def __call__(
        self,
        params: TensorDict | None = None,
        td: TensorDict | None = None,
        /,
        *,
        key: Any = None,
        **tensors: torch.Tensor,
    ):
        """``m(params, td)`` -> new td; or ``m(params, x=x)`` -> tensor(s) of ``out_keys``."""
        return call_td(self, params, td, key, tensors, self._run)

    def apply_with_state(
        self, params: TensorDict | None, td: TensorDict, /, *, key: Any = None
    ) -> tuple[TensorDict, TensorDict]:
        """``m(params, td)`` that also returns the new running statistics.

        Returns:
            ``(out, new_state)``: ``new_state`` holds the new statistics of the
            stateful layers (BatchNorm in training mode), laid out like their
            entries in ``params`` (empty when there are none). Apply them with
            ``fd.nn.update_state(params, new_state)``. Nothing is written.

        Example:
            >>> bn = fd.Module(nn.BatchNorm1d(3), in_keys=["x"], out_keys=["y"])
            >>> params = fd.from_module(bn)
            >>> out, new_state = bn.apply_with_state(params, td)
            >>> params = fd.nn.update_state(params, new_state)
        """
        return apply_with_state(self, params, td, key)

    def _step(self, params: TensorDict | None, data: dict, bs: torch.Size, key: Any) -> None:
        """Read from the working dict ``data``, compute, write into it (internal)."""
        if self._stateful and data.get(STATE, _NOPE) is not COLLECT:
            raise RuntimeError(E.STATE_DROPPED.format(label=self._label(), what="it"))
        args = []
        for k in self.in_keys:
            v = data.get(k, _NOPE) if type(k) is str else _get_path(data, k)
            if v is _NOPE:
                _missing_input(self, k, data)
            args.append(v)
        fn, kind = self._fn, self._kind
        if kind == 2:
            out = self._plain(*args)
        elif kind == 0:
            if type(params) is not TensorDict:
                _bad_params(self, params)
            if params._checked is not fn:  # DTensor params: plain inputs replicated
                args = _placed_inputs(self, params, args)
            out = fn(params, *args, key=key) if self._random else fn(params, *args)
        elif kind == 1:
            p = _empty_params()
            out = fn(p, *args, key=key) if self._random else fn(p, *args)
        else:
            out = fn(**dict(zip(self._kwargs, args)))
        if self._stateful:
            out, data[STATE] = out
        _write_outputs(self, data, bs, out)


def call_td(m: Any, params: Any, td: Any, key: Any, tensors: dict, run: Any, *extra: Any):
    """The body every module's ``__call__`` shares: the keyword form ``m(params, x=x)``,
    the argument checks, then ``run(params, data, batch_size, key, *extra)`` on a
    working copy of the td's entries, which becomes the new td."""
    if td is None:
        return _keyword_call(m, params, key, tensors, *extra)
    if tensors:
        raise TypeError(f"{m._label()}: pass either a TensorDict or keyword tensors, not both.")
    if not isinstance(td, TensorDict):
        _bad_td(m, params, td)
    data = dict(td._data)
    run(params, data, td._batch_size, key, *extra)
    return _new(data, td._batch_size)


def _write_outputs(self: Module, data: dict, bs: torch.Size, out: Any) -> None:
    outs = self.out_keys
    if len(outs) == 1 and isinstance(out, torch.Tensor):
        _write(self, data, bs, outs[0], out)
        return
    if isinstance(out, Mapping):
        for k in outs:
            if k not in out:
                raise KeyError(
                    f"{self._label()}: the function returned a mapping without {E.fmt_key(k)}; it has {E.fmt_keys(out)}."
                )
            _write(self, data, bs, k, out[k])
        return
    if not isinstance(out, tuple | list):
        out = (out,)
    if len(out) != len(outs):
        raise ValueError(
            f"{self._label()}: the function returned {len(out)} output(s) but out_keys has "
            f"{len(outs)} ({E.fmt_keys(outs)}); give one out_key per output."
        )
    for k, v in zip(outs, out):
        _write(self, data, bs, k, v)


_NOPE = object()
_Tensor = torch.Tensor
#: Slot of the working dict where a stateful module leaves its new state: present
#: (holding COLLECT) only under ``apply_with_state``. An int: no TensorDict key (always
#: a str) can equal it, and torch.compile traces int dict keys.
STATE = -1
COLLECT = object()


def apply_with_state(m: Any, params: Any, td: Any, key: Any) -> tuple[TensorDict, TensorDict]:
    """``m(params, td)`` returning ``(out, new_state)``; see ``Module.apply_with_state``."""
    if not isinstance(td, TensorDict):
        _bad_td(m, params, td)
    data = dict(td._data)
    data[STATE] = COLLECT
    m._run(params, data, td._batch_size, key)
    state = data.pop(STATE)
    if state is COLLECT:
        state = _new({}, torch.Size([]))
    return _new(data, td._batch_size), state


def _make_run(m: Module):
    """The function a call runs: ``m._step``, or a specialised copy of it for the
    common case of one str in_key and one str out_key (the hot path of a chain)."""
    ins, outs, fn, kind, rnd = m.in_keys, m.out_keys, m._fn, m._kind, m._random
    if m._stateful:
        return m._step
    if kind == 2:
        fn = m._plain
    if not (all(type(k) is str for k in ins) and len(outs) == 1 and type(outs[0]) is str):
        return m._step
    if len(ins) != 1:
        if kind != 2:
            return m._step
        o0 = outs[0]

        def run_n(params, data, bs, key):
            try:
                args = [data[k] for k in ins]
            except KeyError:
                _missing_input(m, next(k for k in ins if k not in data), data)
            out = fn(*args)
            if type(out) is not _Tensor or out.shape[: len(bs)] != bs:
                return _write_outputs(m, data, bs, out)
            data[o0] = out

        return run_n
    k0, o0 = ins[0], outs[0]
    if kind == 2:

        def run(params, data, bs, key):
            x = data.get(k0, _NOPE)
            if x is _NOPE:
                _missing_input(m, k0, data)
            out = fn(x)
            if type(out) is not _Tensor or out.shape[: len(bs)] != bs:
                return _write_outputs(m, data, bs, out)
            data[o0] = out

    elif kind == 0:

        def run(params, data, bs, key):
            x = data.get(k0, _NOPE)
            if x is _NOPE:
                _missing_input(m, k0, data)
            if type(params) is not TensorDict:
                _bad_params(m, params)
            if params._checked is not fn:  # DTensor params: plain inputs replicated
                (x,) = _placed_inputs(m, params, (x,))
            out = fn(params, x, key=key) if rnd else fn(params, x)
            if type(out) is not _Tensor or out.shape[: len(bs)] != bs:
                return _write_outputs(m, data, bs, out)
            data[o0] = out

    elif kind == 1:
        empty = _empty_params()

        def run(params, data, bs, key):
            x = data.get(k0, _NOPE)
            if x is _NOPE:
                _missing_input(m, k0, data)
            out = fn(empty, x, key=key) if rnd else fn(empty, x)
            if type(out) is not _Tensor or out.shape[: len(bs)] != bs:
                return _write_outputs(m, data, bs, out)
            data[o0] = out

    else:
        return m._step
    return run


def _get_path(data: dict, key: tuple) -> Any:
    v = data.get(key[0], _NOPE)
    for part in key[1:]:
        if type(v) is not TensorDict:
            return _NOPE
        v = v._data.get(part, _NOPE)
    return v


def _write(m: Module, data: dict, bs: torch.Size, key: Key, value: Any) -> None:
    if not isinstance(value, torch.Tensor):
        if isinstance(value, TensorDict) and value._batch_size[: len(bs)] == bs:
            pass
        else:
            raise TypeError(
                f"{m._label()}: output {E.fmt_key(key)} is a {type(value).__name__}, not a tensor. "
                "Return tensors (or a tuple of them, one per out_key)."
            )
    elif value.shape[: len(bs)] != bs:
        raise ValueError(
            f"{m._label()}: output {E.fmt_key(key)} has shape {list(value.shape)}, which does not "
            f"start with the batch size {list(bs)} of the tensordict. Keep the batch dims in front."
        )
    if type(key) is str:
        data[key] = value
    else:
        head = data.get(key[0], _NOPE)
        child = head if type(head) is TensorDict else _new({}, bs)
        data[key[0]] = _set_path(child, key[1:], value, 1, check=False)


def _missing_input(m: Module, key: Key, data: dict):
    has = E.fmt_keys(_TensorDictKeys(data))
    raise KeyError(
        f"{m._label()} reads {E.fmt_key(key)}, which the tensordict lacks; it has: {has}"
    )


def _TensorDictKeys(data: dict) -> list:
    out = []
    for k, v in data.items():
        if type(k) is not str:
            continue  # the STATE slot
        if type(v) is TensorDict:
            out.extend((k, *(sk if isinstance(sk, tuple) else (sk,))) for sk in v.keys(True, True))
        else:
            out.append(k)
    return out


def _bad_td(m, params, td):
    if isinstance(params, TensorDict) and td is None:
        raise TypeError(f"{m._label()} takes (params, td); got one TensorDict.")
    raise TypeError(
        f"{m._label()}: the second argument must be a TensorDict, got {type(td).__name__}. "
        "Call m(params, td) or m(params, x=tensor)."
    )


def _bad_params(m: Module, params: Any):
    what = "nothing" if params is None else f"a {type(params).__name__}"
    raise TypeError(
        f"{m._label()} has parameters but was given {what} as params. Call "
        "m(params, td) with params = m.init(fd.random.key(0)) or fd.from_module(m)."
    )


_LAYOUTS: dict = {}


def _layout(fn) -> tuple[dict, tuple | None]:
    """A layer's expected params, computed once per layer value: ``{path: shape}``,
    and ``((name, shape), ...)`` when every path is top-level (the fast check) or None."""
    cached = _LAYOUTS.get(fn)
    if cached is None:
        shapes = getattr(fn, "param_shapes", None)
        if shapes is not None:
            lay = dict(shapes())
        else:
            with torch.device("meta"):
                p = fn.init(0)
            lay = {
                k if isinstance(k, tuple) else (k,): tuple(v.shape) for k, v in p.items(True, True)
            }
        flat = None
        if all(len(k) == 1 for k in lay):
            flat = tuple((k[0], tuple(shape)) for k, shape in lay.items())
        cached = _LAYOUTS[fn] = (lay, flat)
    return cached


def _check_params(m: Module, params: TensorDict) -> None:
    # Under torch.compile the check is traced (it costs nothing at run time: the
    # shapes are guarded anyway) but neither the layout cache nor the params'
    # ``_checked`` slot is written: a side effect on an input or on a global
    # would make the next call fail a guard and recompile (notes/gotchas.md).
    compiling = torch.compiler.is_compiling()
    if not compiling:  # fast path: a flat layout whose entries all match
        flat = _layout(m._fn)[1]
        if flat is not None and len(params._data) == len(flat):
            data = params._data
            for k, shape in flat:
                v = data.get(k)
                if type(v) is not _Tensor or v.shape != shape:  # DTensors: the slow path
                    break
            else:  # after a DTensor was met, look under torch.func's wrappers too
                _set_checked(params, _dt.placed_mark(m, data.items()) if _dt.SEEN else m._fn)
                return
    expected = dict(m._fn.param_shapes()) if compiling else _layout(m._fn)[0]
    got = {k if isinstance(k, tuple) else (k,): v for k, v in params.items(True, True)}
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    if missing or extra:
        raise KeyError(
            f"{m._label()}: params do not match the layout of {m._fn!r}: missing "
            f"{E.fmt_keys(missing)}; unexpected {E.fmt_keys(extra)}. Were these params made "
            "for another module? Use m.init(key) or fd.from_module(m)."
        )
    for k, shape in expected.items():
        if tuple(got[k].shape) != tuple(shape):
            raise ValueError(
                f"{m._label()}: params entry {E.fmt_key(k)} has shape {list(got[k].shape)}, "
                f"expected {list(shape)}. (An ensemble's stacked params are called with fd.vmap.)"
            )
    if not compiling:  # the layer, or a Placed mark when params hold DTensors
        _set_placed(params, m, got.items())


def _keyword_call(m, params, key, tensors: dict, interaction=None):
    """``m(params, x=x)``: build the td from keyword tensors, return the out tensors."""
    if not tensors:
        if isinstance(params, TensorDict):
            raise TypeError(
                f"{m._label()} takes (params, td); got one TensorDict. Call m(params, td); a "
                "module without parameters takes m(None, td)."
            )
        raise TypeError(f"{m._label()} takes (params, td) or (params, **tensors); got no data.")
    names = {_kwarg_name(k): k for k in m.in_keys}
    unknown = [n for n in tensors if n not in names]
    missing = [n for n in names if n not in tensors]
    if unknown or missing:
        raise TypeError(
            f"{m._label()}: keyword call got unknown name(s) {unknown or '(none)'} and lacks "
            f"{missing or '(none)'}; it takes {list(names)}."
        )
    td = TensorDict({}, [])
    for n, v in tensors.items():
        td = td.set(names[n], v)
    out = (
        m(params, td, key=key)
        if interaction is None
        else m(params, td, key=key, interaction=interaction)
    )
    vals = tuple(out.get(k) for k in m.out_keys)
    return vals[0] if len(vals) == 1 else vals
