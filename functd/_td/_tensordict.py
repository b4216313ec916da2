"""TensorDict: an immutable mapping of names to tensors that share leading batch dims.

Every "write" returns a new TensorDict; leaves are never copied nor written.
Keys are ``str`` or tuples of ``str`` (a path into nested TensorDicts).
Shape operations (indexing, stack, cat, reshape...) live in ``_shape.py``; the
pytree registration in ``_tree.py``.

Example:
    >>> import torch, functd as fd
    >>> td = fd.TensorDict({"x": torch.zeros(5, 3), "obs": {"pos": torch.zeros(5, 2)}}, [5])
    >>> td2 = td.set("y", torch.ones(5, 1))
    >>> "y" in td, "y" in td2
    (False, True)
    >>> td2["obs", "pos"].shape
    torch.Size([5, 2])
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

import torch

from .. import _errors as E
from . import _shape
from ._construct import (
    _LEAF_TYPES,
    _SIZES,
    _check_batch_size,
    _common_prefix,
    _fast_leaves,
    _size1,
)
from ._key import key_path, plain_str
from ._repr import td_repr

Key = str | tuple[str, ...]
_T = TypeVar("_T")
# an index of the batch dims (anything but a key): td[0], td[1:3], td[mask], td[..., 0]
_BatchIndex = int | slice | torch.Tensor | list[Any] | types.EllipsisType | None | tuple[Any, ...]
_MISSING = object()  # "no default given"
_ABSENT = object()  # a default that no entry can be

__all__ = ["Key", "TensorDict"]


class TensorDict:
    """An immutable dict of tensors with common leading batch dims; a pytree.

    Args:
        source: a mapping of str keys to tensors, nested mappings (which become
            nested TensorDicts) or TensorDicts. Leaves are not copied.
        batch_size: the leading dims every leaf shares. Defaults to ``[]``.
        device: optional; when given, every leaf must already be on it.

    Raises:
        TypeError: a key is not a str, a leaf is not a tensor, or batch_size is
            not a sequence of ints.
        ValueError: a leaf's leading dims differ from batch_size, a batch dim is
            negative, or a leaf is not on ``device``.

    ``td[key]`` is typed ``Tensor | TensorDict`` (an entry may be nested): the accessors
    ``td.get_tensor(key)`` and ``td.get_tensordict(key)`` are typed ``Tensor``/``TensorDict``.

    Example:
        >>> td = TensorDict({"x": torch.randn(5, 3)}, batch_size=[5])
        >>> td
        TensorDict(batch_size=[5], fields={x: f32[3]})
        >>> td.set("y", torch.zeros(5)).select("y").batch_size
        torch.Size([5])
    """

    __slots__ = ("_batch_size", "_check_cache", "_data", "_spec")
    _check_cache: Any  # the params-check cache: owned by _marks.py
    _spec: Any

    _data: dict[str, torch.Tensor | TensorDict]
    _batch_size: torch.Size

    def __init__(
        self,
        source: Mapping[str, Any] | None = None,
        batch_size: Sequence[int] | torch.Size | int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if type(source) is dict and device is None and not is_dynamo_compiling():
            if init_batch1(self, source, batch_size):  # TensorDict({str: tensor}, [n])
                return
            bs = batch_size if type(batch_size) is torch.Size else _check_batch_size(batch_size)
            data = _fast_leaves(source, bs)
            if data is not None:  # every key a str, every value a tensor with the batch dims
                init_unchecked(self, data, bs)
                return
        bs = batch_size if type(batch_size) is torch.Size else _check_batch_size(batch_size)
        dev = torch.device(device) if device is not None else None
        data = {}
        if source is None:
            source = {}
        elif isinstance(source, TensorDict):
            source = source._data
        elif not isinstance(source, Mapping):
            raise TypeError(
                f"TensorDict(source) takes a mapping of str keys to tensors; got a "
                f"{type(source).__name__}. Example: TensorDict({{'x': x}}, batch_size=[5])."
            )
        for k, v in source.items():
            if not isinstance(k, str):
                key_path(k)  # raises the bad-key error
                raise TypeError(  # a tuple of str at top level: say how to nest
                    f"TensorDict(source) keys must be str; got the tuple {k!r}. Nest "
                    f"mappings instead ({{'obs': {{'pos': x}}}}) or use td.set({k!r}, x)."
                )
            k = plain_str(k)
            if k in data:
                raise ValueError(E.DUPLICATE_KEY.format(key=E.fmt_key(k)))
            data[k] = _check_value((k,), v, bs, dev)
        _init(self, data, bs)

    # ------------------------------------------------------------------ reading
    @property
    def batch_size(self) -> torch.Size:
        """The leading dims shared by every leaf (inside ``vmap``: without the mapped dim)."""
        return self._batch_size

    @property
    def shape(self) -> torch.Size:
        """Alias of ``batch_size``, as in tensordict."""
        return self._batch_size

    @property
    def batch_dims(self) -> int:
        """Number of batch dims."""
        return len(self._batch_size)

    ndim = batch_dims

    @property
    def device(self) -> torch.device | None:
        """The device all leaves share, or None when they differ or there is none."""
        devices = {leaf.device for leaf in _leaves(self)}
        return devices.pop() if len(devices) == 1 else None

    def numel(self) -> int:
        """Number of elements of the batch (the product of ``batch_size``)."""
        return self._batch_size.numel()

    def is_empty(self) -> bool:
        """True when the TensorDict holds no tensor (nested empty TensorDicts count as none)."""
        return next(_leaves(self), None) is None

    @overload
    def get(self, key: Key) -> torch.Tensor | TensorDict: ...
    @overload
    def get(self, key: Key, default: _T) -> torch.Tensor | TensorDict | _T: ...

    def get(self, key: Key, default: Any = _MISSING) -> Any:
        """Return the entry at ``key`` (str or tuple path), or ``default`` if given.

        Example:
            >>> td.get(("obs", "pos")), td.get("missing", None)
        """
        if type(key) is str:
            value = self._data.get(key, _MISSING)
            if value is not _MISSING:
                return value
            if default is not _MISSING:
                return default
            raise KeyError(E.missing_key(key, (), self._data, None))
        path = key_path(key)
        node: Any = self
        for i, part in enumerate(path):
            if not isinstance(node, TensorDict):
                if default is not _MISSING:
                    return default
                raise KeyError(E.not_a_td(path, path[:i], type(node).__name__))
            value = node._data.get(part, _MISSING)
            if value is _MISSING:
                if default is not _MISSING:
                    return default
                raise KeyError(E.missing_key(path, path[:i], node._data, i))
            node = value
        return node

    def get_tensor(self, key: Key) -> torch.Tensor:
        """The tensor leaf at ``key`` (str or path), typed ``Tensor`` (a TensorDict there: TypeError).

        Example:
            >>> loss = (td.get_tensor("pred") - td.get_tensor(("obs", "y"))).pow(2).mean()
        """
        if isinstance(value := self.get(key), torch.Tensor):
            return value
        raise TypeError(E.wrong_entry("get_tensor", key, value))

    def get_tensordict(self, key: Key) -> TensorDict:
        """The nested TensorDict at ``key``, typed ``TensorDict`` (a tensor there: a TypeError).

        Example:
            >>> dist = actor.get_dist(params.get_tensordict("actor"), td)
        """
        if isinstance(value := self.get(key), TensorDict):
            return value
        raise TypeError(E.wrong_entry("get_tensordict", key, value))

    @overload
    def __getitem__(self, index: str | tuple[str, ...]) -> torch.Tensor | TensorDict: ...
    @overload
    def __getitem__(self, index: _BatchIndex) -> TensorDict: ...

    def __getitem__(self, index: Any) -> Any:
        """``td[key]``: the entry (a tensor or a nested TensorDict); ``td[i]``, ``td[a:b]``,
        ``td[mask]``...: the TensorDict indexed along its batch dims."""
        if type(index) is str:
            value = self._data.get(index, _MISSING)
            if value is _MISSING:
                raise KeyError(E.missing_key(index, (), self._data, None))
            return value
        if isinstance(index, str) or (
            isinstance(index, tuple) and all(isinstance(i, str) for i in index)
        ):
            return self.get(index)  # () included: the empty-key error; str subclasses
        return _shape.index(self, index)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return plain_str(key) in self._data
        if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
            return self.get(key, _ABSENT) is not _ABSENT
        return False

    def __len__(self) -> int:
        """The size of the first batch dim, 0 without batch dims (as in tensordict)."""
        return self._batch_size[0] if self._batch_size else 0

    def __iter__(self) -> Iterator[TensorDict]:
        """Iterate over the first batch dim, as tensordict does."""
        if not self._batch_size:
            raise TypeError(
                "iteration over a TensorDict with batch_size=[] is not defined: iterate "
                "over td.keys() or td.items() instead."
            )
        return (self[i] for i in range(self._batch_size[0]))

    def __bool__(self) -> bool:
        raise TypeError(
            "the truth value of a TensorDict is ambiguous: use td.is_empty() or len(td.keys())."
        )

    def keys(self, include_nested: bool = False, leaves_only: bool = False) -> tuple[Key, ...]:
        """The keys, in insertion order.

        Args:
            include_nested: also list the keys of nested TensorDicts, as tuples.
            leaves_only: leave out keys whose value is a TensorDict.
        """
        if not include_nested and not leaves_only:
            return tuple(self._data)
        return tuple(k for k, _ in _items(self, include_nested, leaves_only))

    def values(self, include_nested: bool = False, leaves_only: bool = False) -> tuple[Any, ...]:
        """The values, in the order of ``keys`` with the same options."""
        return tuple(v for _, v in _items(self, include_nested, leaves_only))

    def items(
        self, include_nested: bool = False, leaves_only: bool = False
    ) -> tuple[tuple[Key, Any], ...]:
        """``(key, value)`` pairs, in the order of ``keys`` with the same options."""
        return tuple(_items(self, include_nested, leaves_only))

    # ------------------------------------------------------------------ writing
    def set(self, key: Key, value: Any) -> TensorDict:
        """Return a new TensorDict with ``key`` set to ``value``; ``self`` is unchanged.

        Example:
            >>> td2 = td.set(("obs", "vel"), torch.zeros(5, 2))
        """
        if type(key) is str:
            bs = self._batch_size
            if type(value) is not torch.Tensor or value.shape[: len(bs)] != bs:
                value = _check_value((key,), value, bs, None)  # raises, or builds nested
            data = self._data.copy()
            data[key] = value
            return from_parts(data, bs)
        return set_path(self, key_path(key), value, 0)

    def update(self, other: Mapping[str, Any] | TensorDict) -> TensorDict:
        """Return a new TensorDict with the entries of ``other`` added or replaced.

        Nested mappings are merged into nested TensorDicts, not replaced whole.
        """
        return _update(self, other, ())

    def select(self, *keys: Key, strict: bool = True) -> TensorDict:
        """Return a new TensorDict with only ``keys`` (nested paths keep their parents).

        Args:
            strict: raise a KeyError for a missing key (else skip it).
        """
        bs = self._batch_size
        data: dict[str, Any] = {}
        for key in keys:
            value = self.get(key, _ABSENT)
            if value is _ABSENT:
                if strict:
                    self.get(key)  # raises the detailed KeyError
                continue
            if type(key) is str:  # no copy of the growing dict per key
                data[key] = value
                continue
            path = key_path(key)
            data = set_path(from_parts(data, bs), path, value, 0, check=False, template=self)._data
        return from_parts(data, bs)

    def exclude(self, *keys: Key) -> TensorDict:
        """Return a new TensorDict without ``keys``; missing keys are ignored."""
        data: dict[str, Any] = dict(self._data)
        for key in keys:
            path = key_path(key)
            if len(path) == 1:
                data.pop(path[0], None)
            elif isinstance(data.get(path[0]), TensorDict):
                data[path[0]] = data[path[0]].exclude(path[1:])
        return from_parts(data, self._batch_size)

    def rename(self, mapping: Mapping[Key, Key] | None = None, **names: str) -> TensorDict:
        """Return a new TensorDict with keys renamed: ``td.rename({"x": "x0"})``.

        Raises:
            KeyError: an old key is missing.
        """
        pairs: dict[Any, Any] = {**(mapping or {}), **names}
        values = {old: self.get(old) for old in pairs}
        pairs = {old: new for old, new in pairs.items() if key_path(old) != key_path(new)}
        out = self.exclude(*pairs)
        for old, new in pairs.items():
            out = out.set(new, values[old])
        return out

    def apply(
        self,
        fn: Callable[..., torch.Tensor | None],
        *others: TensorDict,
        batch_size: Sequence[int] | None = None,
    ) -> TensorDict:
        """Map ``fn`` over the leaves (of ``self`` and ``others``, matched by key).

        ``fn`` returning None drops the entry. The batch size is kept unless
        ``batch_size`` is given (it is validated).

        Example:
            >>> td.apply(lambda x, y: x + y, td)
        """
        for i, o in enumerate(others):
            if not isinstance(o, TensorDict):
                raise TypeError(
                    f"apply: argument {i + 1} is a {type(o).__name__}, not a TensorDict"
                )
        new_bs = None if batch_size is None else _check_batch_size(batch_size)
        return _apply(self, fn, others, new_bs)

    # --------------------------------------------------------- frozen-ness
    def __setattr__(self, name: str, value: Any) -> None:
        raise E.FrozenError(E.SETATTR.format(name=name))

    def __delattr__(self, name: str) -> None:
        raise E.FrozenError(E.SETATTR.format(name=name))

    def __setitem__(self, key: Any, value: Any) -> None:
        raise E.FrozenError(E.SETITEM.format(key=E.fmt_key(key)))

    def __delitem__(self, key: Any) -> None:
        raise E.FrozenError(E.DELITEM.format(key=E.fmt_key(key)))

    def __getattr__(self, name: str) -> Any:
        # Only reached for missing attributes: explain the pure alternative of
        # tensordict's in-place methods (``set_``, ``update_``, ``apply_``...).
        if name.endswith("_") and not name.startswith("_"):
            pure = name.rstrip("_")
            pure = pure if hasattr(TensorDict, pure) else "apply"
            raise E.InplaceError(E.INPLACE.format(name=name, pure=pure))
        raise AttributeError(f"'TensorDict' object has no attribute {name!r}")

    def __reduce__(self):
        return (TensorDict, (self._data, list(self._batch_size)))

    def __repr__(self) -> str:
        return td_repr(self)

    # --------------------------------------------------------- leafwise helpers
    def to(self, *args: Any, **kwargs: Any) -> TensorDict:
        """Apply ``Tensor.to(*args, **kwargs)`` to every leaf (device or dtype)."""
        return self.apply(lambda x: x.to(*args, **kwargs))

    def clone(self) -> TensorDict:
        """A TensorDict of cloned leaves."""
        return self.apply(torch.clone)

    def detach(self) -> TensorDict:
        """A TensorDict of detached leaves."""
        return self.apply(torch.Tensor.detach)

    def cpu(self) -> TensorDict:
        return self.to("cpu")

    def cuda(self, device: int | None = None) -> TensorDict:
        return self.to("cuda" if device is None else f"cuda:{device}")

    def to_dict(self) -> dict[str, Any]:
        """A nested ``dict`` of the leaves (not copied)."""
        return {k: v.to_dict() if isinstance(v, TensorDict) else v for k, v in self._data.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], batch_size: Sequence[int] | None = None):
        """Build from a nested dict; with ``batch_size=None`` the batch size is the
        longest leading shape common to all leaves (as tensordict's ``from_dict``)."""
        if batch_size is None:
            shapes = [v.shape for v in _mapping_leaves(data)]
            batch_size = _common_prefix(shapes)
        return cls(data, batch_size)

    # shape methods (implemented in _shape.py)
    def reshape(self, *shape: int) -> TensorDict:
        """Reshape the batch dims: ``td.reshape(2, -1)``."""
        return _shape.reshape(self, *shape)

    def unsqueeze(self, dim: int) -> TensorDict:
        return _shape.unsqueeze(self, dim)

    def squeeze(self, dim: int | None = None) -> TensorDict:
        return _shape.squeeze(self, dim)

    def expand(self, *shape: int) -> TensorDict:
        return _shape.expand(self, *shape)

    def unbind(self, dim: int = 0) -> tuple[TensorDict, ...]:
        return _shape.unbind(self, dim)


def _cast(dtype: torch.dtype, name: str):
    def method(self: TensorDict) -> TensorDict:
        return self.apply(lambda x: x.to(dtype))

    method.__name__ = name
    method.__doc__ = f"Cast every leaf to {dtype}."
    return method


for _name, _dtype in [
    ("float", torch.float32),
    ("double", torch.float64),
    ("half", torch.float16),
    ("bfloat16", torch.bfloat16),
    ("int", torch.int32),
    ("long", torch.int64),
    ("bool", torch.bool),
]:
    type.__setattr__(TensorDict, _name, _cast(_dtype, _name))


# ---------------------------------------------------------------- internals
# Slot setters: calling the slot descriptors directly is about twice as fast as
# object.__setattr__, and from_parts runs on every write and every pytree unflatten.
# Dynamo cannot trace ``member_descriptor.__set__``: under torch.compile from_parts
# takes the object.__setattr__ path (is_compiling() is a constant there).
set_data_slot = vars(TensorDict)["_data"].__set__
set_batch_size_slot = vars(TensorDict)["_batch_size"].__set__
set_spec_slot = vars(TensorDict)["_spec"].__set__
_set_check_cache = vars(TensorDict)["_check_cache"].__set__  # construction only: _marks.py
alloc_uninit = object.__new__
# "tracing by dynamo": the one case where the slot setters cannot be used (_tree.py too);
# 4x cheaper than torch.compiler.is_compiling, and dynamo folds it to True.
is_dynamo_compiling = torch.compiler.is_dynamo_compiling


def _init_traceable(td: TensorDict, data: dict[Any, Any], batch_size: torch.Size) -> None:
    object.__setattr__(td, "_data", data)
    object.__setattr__(td, "_batch_size", batch_size)
    object.__setattr__(td, "_spec", None)
    object.__setattr__(td, "_check_cache", None)  # _marks.py


def _init_slots(td: TensorDict, data: dict[Any, Any], batch_size: torch.Size) -> None:
    set_data_slot(td, data)
    set_batch_size_slot(td, batch_size)
    set_spec_slot(td, None)
    _set_check_cache(td, None)


def _new_slots(data: dict[Any, Any], batch_size: torch.Size) -> TensorDict:
    td = alloc_uninit(TensorDict)
    _init_slots(td, data, batch_size)
    return td


def _init_batch1(td: TensorDict, source: dict[Any, Any], batch_size: Any) -> bool:
    """The constructor's common case, ``TensorDict({str: tensor}, [n])``: True when
    every key is a str and every value a tensor (or Parameter) whose shape starts with
    ``n >= 0`` (td then holds a copy of ``source``); False, with nothing written,
    otherwise (the general path converts or raises)."""
    if type(batch_size) is not list or len(batch_size) != 1:
        return False
    b0 = batch_size[0]
    if type(b0) is not int or b0 < 0 or b0 >= 1 << 63:  # past int64: the general path refuses
        return False
    bs = _SIZES.get(b0) or _size1(b0)
    data = _fast_leaves(source, bs)
    if data is None:
        return False
    _init_slots(td, data, bs)
    return True


# The slot writes in one C call (_alloc_ext.c, built with the package), and the common
# constructor's checks there too; without the extension, the same in Python above.
try:
    from . import _alloc_ext  # type: ignore[attr-defined]

    _alloc_ext.bind(TensorDict, _LEAF_TYPES, _SIZES, _size1)
    new_unchecked = _alloc_ext.new  # (data, batch_size) -> TensorDict: eager only
    init_unchecked = _alloc_ext.init  # (td, data, batch_size): eager only
    init_batch1 = _alloc_ext.init_batch1  # (td, source, batch_size) -> bool: eager only
except ImportError:  # pragma: no cover - a build without a C compiler
    new_unchecked = _new_slots
    init_unchecked = _init_slots
    init_batch1 = _init_batch1


def _init(td: TensorDict, data: dict[Any, Any], batch_size: torch.Size) -> None:
    if is_dynamo_compiling():
        return _init_traceable(td, data, batch_size)
    init_unchecked(td, data, batch_size)


def from_parts(data: dict[Any, Any], batch_size: torch.Size) -> TensorDict:
    """Build without validation (internal: the caller guarantees the invariants)."""
    if is_dynamo_compiling():
        # spelled out, not through the alias: dynamo before torch 2.13 traces the
        # literal ``object.__new__(cls)`` but not the same builtin under another name
        td = object.__new__(TensorDict)
        _init_traceable(td, data, batch_size)
        return td
    return new_unchecked(data, batch_size)


# The instance's own constructor, for the files below this one (_shape): they reach the
# class only through the TensorDicts they are given (and know one by this attribute).
TensorDict._from_parts = staticmethod(from_parts)  # type: ignore[attr-defined]

#: The empty TensorDict (batch size ``[]``): the params of every parameter-free layer
#: and module, shared (made at import, so no lazy global is first made under dynamo).
EMPTY = from_parts({}, torch.Size([]))


def _check_value(path: tuple[Any, ...], value: Any, bs: torch.Size, device) -> Any:
    n = len(bs)
    if isinstance(value, torch.Tensor):
        if value.shape[:n] != bs:
            _raise_batch_mismatch(path, value.shape, bs)
        if device is not None and value.device != device:
            raise ValueError(
                E.DEVICE_MISMATCH.format(
                    device=str(device), key=E.fmt_key(path), leaf_device=value.device
                )
            )
        return value
    if isinstance(value, TensorDict):
        if value._batch_size[:n] != bs:
            _raise_batch_mismatch(path, value._batch_size, bs, nested=True)
        if device is not None:
            for k, leaf in value.items(True, True):
                _check_value(path + key_path(k), leaf, leaf.shape[:0], device)
        return value
    if isinstance(value, Mapping):
        data = {}
        for k, v in value.items():
            if not isinstance(k, str):
                key_path(k)
                raise TypeError(f"nested mapping keys must be str; got {k!r} under {path!r}")
            k = plain_str(k)
            if k in data:
                raise ValueError(E.DUPLICATE_KEY.format(key=E.fmt_key((*path, k))))
            data[k] = _check_value((*path, k), v, bs, device)
        return from_parts(data, bs)
    raise TypeError(E.NON_TENSOR.format(key=E.fmt_key(path), type=type(value).__name__))


def _raise_batch_mismatch(path, shape, bs, nested: bool = False):
    what = "a nested TensorDict of batch_size" if nested else "shape"
    msg = E.BATCH_MISMATCH.format(
        key=E.fmt_key(path),
        shape=list(shape),
        batch_size=list(bs),
        suggest=list(shape[: len(bs)]),
    )
    raise ValueError(msg.replace("has shape", f"has {what}", 1))


def set_path(
    td: TensorDict,
    path: tuple[Any, ...],
    value: Any,
    depth: int,
    check: bool = True,
    template=None,
    prefix: tuple[Any, ...] = (),
) -> TensorDict:
    head = path[0]
    data = dict(td._data)
    if len(path) == 1:
        full = (*prefix, head)
        data[head] = _check_value(full, value, td._batch_size, None) if check else value
        return from_parts(data, td._batch_size)
    child = data.get(head, _MISSING)
    if child is _MISSING:
        # a new nested level takes the batch size of the template's level, if any
        sub = template._data.get(head) if template is not None else None
        child = from_parts({}, sub._batch_size if isinstance(sub, TensorDict) else td._batch_size)
    elif not isinstance(child, TensorDict):
        raise KeyError(
            f"cannot set {E.fmt_key((*prefix, *path))}: {E.fmt_key((*prefix, head))} holds a "
            f"{type(child).__name__}, not a nested TensorDict."
        )
    sub_template = template._data.get(head) if template is not None else None
    data[head] = set_path(
        child, path[1:], value, depth + 1, check, sub_template, prefix=(*prefix, head)
    )
    return from_parts(data, td._batch_size)


def _update(td: TensorDict, other, prefix: tuple[Any, ...]) -> TensorDict:
    items = other._data.items() if isinstance(other, TensorDict) else other.items()
    bs = td._batch_size
    data = dict(td._data)
    for k, v in items:
        if isinstance(k, str):
            k = plain_str(k)
        old = data.get(k) if isinstance(k, str) else None
        if isinstance(old, TensorDict) and isinstance(v, Mapping | TensorDict):
            data[k] = _update(old, v, (*prefix, k))
        elif isinstance(k, str):
            data[k] = _check_value((*prefix, k), v, bs, None)
        else:
            path = key_path(k)
            data = dict(set_path(from_parts(data, bs), path, v, 0, prefix=prefix)._data)
    return from_parts(data, bs)


def _items(
    td: Any, include_nested: bool, leaves_only: bool, prefix: tuple[Any, ...] = ()
) -> Iterator[Any]:
    for k, v in td._data.items():
        key = (*prefix, k) if prefix else k
        is_td = isinstance(v, TensorDict)
        if not (leaves_only and is_td):
            yield key, v
        if is_td and include_nested:
            yield from _items(v, include_nested, leaves_only, key if prefix else (k,))


def _leaves(td: TensorDict) -> Iterator[torch.Tensor]:
    for v in td._data.values():
        if isinstance(v, TensorDict):
            yield from _leaves(v)
        else:
            yield v


def _mapping_leaves(data: Mapping[Any, Any]) -> Iterator[torch.Tensor]:
    for v in data.values():
        if isinstance(v, Mapping | TensorDict):
            yield from _mapping_leaves(v._data if isinstance(v, TensorDict) else v)
        elif isinstance(v, torch.Tensor):
            yield v


def _apply(
    td: TensorDict, fn, others: Sequence[Any], new_bs, prefix: tuple[Any, ...] = ()
) -> TensorDict:
    bs = td._batch_size if new_bs is None else new_bs
    data = {}
    for k, v in td._data.items():
        try:
            ov = [o._data[k] for o in others]
        except KeyError:
            missing = [i + 1 for i, o in enumerate(others) if k not in o._data]
            raise KeyError(
                f"apply: key {E.fmt_key((*prefix, k))} of the first TensorDict is missing in "
                f"argument(s) {missing}; all TensorDicts given to apply must have the same keys."
            ) from None
        if isinstance(v, TensorDict):
            data[k] = _apply(v, fn, ov, new_bs, (*prefix, k))
        else:
            r = fn(v, *ov)
            if r is not None:
                if not isinstance(r, torch.Tensor) or r.shape[: len(bs)] != bs:
                    _check_value((*prefix, k), r, bs, None)  # raises the clear error
                data[k] = r
    return from_parts(data, bs)
