"""``fd.vmap``: ``torch.func.vmap`` that knows TensorDicts.

The transform is thin: split the arguments into leaves and structure (optree,
functd's namespace) and give every leaf its own in_dim from an ``in_dims`` prefix
tree that may name TensorDict entries, checking that the mapping keeps every
TensorDict valid and naming the path when it does not (``_in_dims.py``); call
``torch.func.vmap`` on a function of the flat leaves; put the mapped dim of each
output where ``out_dims`` asks.

Example:
    >>> ens = fd.stack([block.init(k) for k in fd.random.split(fd.random.key(0), 4)])
    >>> out = fd.vmap(block, in_dims=(0, None))(ens, td)   # 4 members, same data
    >>> out.batch_size                                      # [4, *td.batch_size]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import optree
import torch

from .._td import TensorDict, from_parts
from .._td._tree import NAMESPACE
from . import _axes
from ._compose import derived
from ._in_dims import in_leaves
from ._in_dims import is_dim as _is_dim
from ._paths import fmt_path

__all__ = ["vmap"]

# torch.func's messages we translate (matched on these fixed phrases only)
_TORCH_CONTROL_FLOW = "data-dependent control flow"
_TORCH_ITEM = "calling .item() on a Tensor"
_TORCH_RANDOM = "randomness error mode"

CONTROL_FLOW = (
    "fd.vmap({name}): the function branches on the value of a mapped tensor "
    "(`if x > 0`, `while`, `bool(x)`, `.item()`, `int(x)`), which has a different value "
    "for each element of the batch. Compute both branches and select with "
    "torch.where(cond, a, b) (or masks: x * mask, torch.clamp, torch.maximum); for loops "
    "run a fixed number of steps and mask the finished ones. If the tensor is not meant "
    "to be mapped, give it in_dims=None. (torch.func: {torch_msg})"
)
RANDOM = (
    "fd.vmap({name}): the function drew random numbers from torch's global generator "
    "(torch.randn, torch.rand, nn.Dropout...). In functd randomness comes from keys: "
    "pass a key per element as an input, e.g. fd.vmap(f)(fd.random.split(key, n), ...), "
    "and draw with fd.random.normal(key, shape) or call modules with key=. "
    "(torch.func: {torch_msg})"
)


class TransformError(RuntimeError):
    """A torch.func error rewritten by functd (what failed and what to use instead)."""


# ------------------------------------------------------------------ out_dims
def _zeroed(dims: Any, name: str) -> Any:
    """What torch.func.vmap gets as out_dims: every int is 0 (the dim is moved afterwards)
    and mappings that say the same thing for every entry collapse to that value."""
    if dims is None:
        return None
    if _is_dim(dims):
        return 0
    if isinstance(dims, tuple | list):
        z = type(dims)(_zeroed(d, name) for d in dims)
        return z[0] if len(z) == 1 and _is_dim(z[0]) else z  # (d,): also for one output
    if isinstance(dims, Mapping | TensorDict):
        items = dims._data.items() if isinstance(dims, TensorDict) else dims.items()
        z = {k: _zeroed(d, name) for k, d in items}  # type: ignore[assignment]
        vals = list(z.values())  # type: ignore[union-attr]
        if vals and all(_is_dim(v) and v == vals[0] for v in vals):
            return vals[0]
        return z  # per entry: a TensorDict output there is passed as a dict (see _plain)
    raise TypeError(
        f"fd.vmap({name}): out_dims must be an int, None, or a tuple/dict of them; got "
        f"{type(dims).__name__}."
    )


def _mixed(dims: Any) -> bool:
    """True when a mapping in ``dims`` gives its entries different out_dims."""
    if isinstance(dims, tuple | list):
        return any(_mixed(d) for d in dims)
    if isinstance(dims, Mapping | TensorDict):
        return not _is_dim(_zeroed(dims, ""))
    return False


def _plain(out: Any, dims: Any, path: tuple[Any, ...], name: str, converted: set[Any]) -> Any:
    """Inside vmap: give torch a dict for each TensorDict output whose entries get
    different out_dims (only valid for batch_size [], where entries are independent)."""
    if isinstance(dims, tuple | list) and isinstance(out, tuple | list):
        return type(out)(
            _plain(v, d, (*path, i), name, converted) for i, (v, d) in enumerate(zip(out, dims))
        )
    if not isinstance(dims, Mapping | TensorDict) or not _mixed(dims):
        return out
    if isinstance(out, TensorDict):
        if out._batch_size:
            _uniform(dims, path, name)  # raises: entries share the batch dims
        converted.add(path)
        out = out._data
    if isinstance(out, dict):
        if set(out) != set(dims.keys()):
            raise ValueError(
                f"fd.vmap({name}): out_dims at {fmt_path(path, 'output')} has keys "
                f"{sorted(dims.keys(), key=str)} but the output there has {sorted(out, key=str)}."
            )
        return {k: _plain(v, dims[k], (*path, k), name, converted) for k, v in out.items()}
    return out


def _uniform(dims: Any, path: tuple[Any, ...], name: str) -> Any:
    """A mapping given for a TensorDict output must say one thing for all its entries."""
    items = dims._data.items() if isinstance(dims, TensorDict) else dims.items()
    vals = []
    for _, d in items:
        vals.append(_uniform(d, path, name) if isinstance(d, Mapping | TensorDict) else d)
    if vals and all(_is_dim(v) and v == vals[0] for v in vals):
        return vals[0]
    raise ValueError(
        f"fd.vmap({name}): out_dims at {fmt_path(path, 'output')} gives different dims "
        f"({dims!r}) for the entries of a TensorDict output of batch_size [...] inside "
        "vmap; its entries share its batch dims, so give one out_dim for the whole "
        "TensorDict (per-entry out_dims fit a TensorDict of batch_size [])."
    )


def _place(out: Any, dims: Any, path: tuple[Any, ...], name: str, converted: set[Any]) -> Any:
    """Move the mapped dim (at 0 after torch.func.vmap) to where ``dims`` says, and turn
    the dicts that stood for TensorDicts (``converted``) back into TensorDicts."""
    if dims is None or (_is_dim(dims) and dims == 0):
        return out
    if isinstance(dims, Mapping | TensorDict):
        if isinstance(out, TensorDict):
            return _place(out, _uniform(dims, path, name), path, name, converted)
        data = {k: _place(v, dims[k], (*path, k), name, converted) for k, v in out.items()}
        return from_parts(data, torch.Size()) if path in converted else data
    if isinstance(dims, tuple | list):
        if not isinstance(out, tuple | list) and len(dims) == 1:  # torch: (d,) for one output
            return _place(out, dims[0], path, name, converted)
        return type(out)(
            _place(v, d, (*path, i), name, converted) for i, (v, d) in enumerate(zip(out, dims))
        )
    d = dims
    if isinstance(out, TensorDict):
        nb = len(out._batch_size)  # includes the mapped dim, now in front
        if not -nb <= d < nb:
            raise ValueError(
                f"fd.vmap({name}): out_dims {d} at {fmt_path(path, 'output')} is not a batch dim "
                f"of the TensorDict returned there, which has {nb - 1} batch dim(s) inside vmap "
                f"(batch_size {list(out._batch_size[1:])}); choose an out_dim in [{-nb}, "
                f"{nb - 1}] so that the mapped dim becomes a batch dim."
            )
        return _move_td(out, d % nb)
    if isinstance(out, torch.Tensor):
        return torch.movedim(out, 0, d)
    if isinstance(out, tuple | list):
        return type(out)(_place(v, d, (*path, i), name, converted) for i, v in enumerate(out))
    if isinstance(out, dict):
        return {k: _place(v, d, (*path, k), name, converted) for k, v in out.items()}
    return out


def _move_td(td: TensorDict, d: int) -> TensorDict:
    bs = td._batch_size
    data = {}
    for k, v in td._data.items():
        data[k] = _move_td(v, d) if isinstance(v, TensorDict) else torch.movedim(v, 0, d)
    return from_parts(data, torch.Size((*bs[1 : d + 1], bs[0], *bs[d + 1 :])))


_NONE_OUTPUT = "got type <class 'NoneType'>"
_P = ParamSpec("_P")
_R = TypeVar("_R")  # vmap keeps f's types: a mapped TensorDict or tensor is one still


def _without_nones(out: Any, nones: list[int]) -> Any:
    """``out`` with each None leaf replaced by an unmapped 0-d tensor (torch.func.vmap
    returns only tensors); ``nones`` gets their positions among the leaves."""
    leaves, tree = optree.tree_flatten(out, none_is_leaf=True, namespace=NAMESPACE)
    nones[:] = [k for k, v in enumerate(leaves) if v is None]
    filler = torch.zeros(())
    return optree.tree_unflatten(tree, [filler if v is None else v for v in leaves])


def _with_nones(out: Any, nones: list[int]) -> Any:
    """The mapped output with None back at the positions ``_without_nones`` filled."""
    leaves, tree = optree.tree_flatten(out, none_is_leaf=True, namespace=NAMESPACE)
    for k in nones:
        leaves[k] = None
    return optree.tree_unflatten(tree, leaves)


# ------------------------------------------------------------------ vmap
def _name(f: Callable[..., Any]) -> str:
    return getattr(f, "__name__", None) or type(f).__name__


def _translate(e: RuntimeError, name: str) -> Exception | None:
    msg = str(e)
    if isinstance(e, TransformError):  # already ours (a nested fd transform)
        return None
    if _TORCH_CONTROL_FLOW in msg or _TORCH_ITEM in msg:
        return TransformError(CONTROL_FLOW.format(name=name, torch_msg=msg))
    if _TORCH_RANDOM in msg:
        return TransformError(RANDOM.format(name=name, torch_msg=msg))
    return None


def vmap(
    f: Callable[_P, _R],
    in_dims: Any = 0,
    out_dims: Any = 0,
    randomness: str = "error",
    *,
    chunk_size: int | None = None,
    axis_name: str | None = None,
) -> Callable[_P, _R]:
    """Vectorise ``f`` over a dim of its inputs: ``torch.func.vmap`` that knows TensorDicts.

    Inside ``f`` a mapped TensorDict has the batch size without the mapped dim;
    the outputs get it back (at ``out_dims``).

    Args:
        f: the function to map; any pytrees of tensors in and out.
        in_dims: for each positional argument, the dim to map (an int), None
            (not mapped), or for a TensorDict/dict argument a dict (or a
            TensorDict of ints/None) with one entry per key, at any depth:
            ``in_dims=({"params": 0, "td": None},)``. An int given to a
            TensorDict maps that batch dim of every entry; negative ints count
            from its last batch dim. Keyword arguments are never mapped.
        out_dims: where the mapped dim goes in each output: an int, None, or a
            tuple/dict prefix of the outputs. For a TensorDict output it must
            be a batch dim (``0`` to ``len(batch_size)`` inside).
        randomness: as ``torch.func.vmap``. Keep ``"error"``: in functd
            randomness comes from ``fd.random`` keys given as inputs.
        chunk_size: map this many elements at a time (less memory).
        axis_name: name the mapped axis for ``fd.psum``/``fd.pmean`` inside ``f``
            (as ``jax.vmap``); not with ``chunk_size``.

    Returns:
        The mapped function (it keeps ``f``'s ``__name__``, ``__doc__`` and
        signature through ``__wrapped__``).

    Raises:
        ValueError: an in_dim is not a batch dim of the TensorDict holding it
            (names the key and its shape), in_dims do not match the inputs
            (names the path), the mapped sizes differ, entries of one
            TensorDict are mapped differently, or an out_dim is not a batch
            dim of a TensorDict output.
        TypeError: in_dims or out_dims have a wrong type somewhere.
        RuntimeError: ``f`` branches on a mapped value (use ``torch.where``)
            or draws from torch's global generator (use ``fd.random`` keys).

    Example:
        >>> ens = fd.vmap(block.init)(fd.random.split(fd.random.key(0), 8))
        >>> out = fd.vmap(block, in_dims=(0, None))(ens, td)       # shared data
        >>> out = fd.vmap(block, in_dims=(0, 0))(ens, td_per_member)
    """
    key = ("vmap", in_dims, out_dims, randomness, chunk_size, axis_name)

    def build(g: Callable[..., Any]) -> Callable[..., Any]:
        return vmap(g, in_dims, out_dims, randomness, chunk_size=chunk_size, axis_name=axis_name)

    jitted = derived(f, key, build)
    if jitted is not None:  # fd.vmap(fd.jit(f)) is fd.jit(fd.vmap(f)) (_compose)
        return jitted
    name = _name(f)
    if axis_name is not None:
        _axes.check_name(axis_name, f"fd.vmap({name})")
        if chunk_size is not None:
            raise ValueError(
                f"fd.vmap({name}): axis_name={axis_name!r} needs all elements at once, so "
                "chunk_size cannot be given with it; drop chunk_size."
            )
    mapped = _mapped(f, name, in_dims, out_dims, randomness, chunk_size, axis_name)
    return functools.wraps(f)(mapped)


def _mapped(f, name, in_dims, out_dims, randomness, chunk_size, axis_name) -> Callable[..., Any]:
    """The function ``fd.vmap`` returns (before ``functools.wraps``): per call, the leaves
    and their dims (``in_leaves``), ``torch.func.vmap`` of a function of the leaves, and
    the mapped dims moved to ``out_dims``."""
    torch_out = _zeroed(out_dims, name)
    moved = not (_is_dim(out_dims) and out_dims == 0)
    mixed = _mixed(out_dims)

    def mapped(*args: Any, **kwargs: Any) -> Any:
        flat: Sequence[Any]
        dims: Sequence[Any]
        flat, dims, spec = in_leaves(name, args, in_dims)

        converted: set[Any] = set()
        nones: list[int] = []  # None outputs: their positions (see _without_nones)

        def run(fill: bool) -> Any:
            def flat_f(*leaves: Any) -> Any:
                out = f(*spec.unflatten(leaves), **kwargs)
                out = _plain(out, out_dims, (), name, converted) if mixed else out
                return _without_nones(out, nones) if fill else out

            fn, xs, ds = flat_f, flat, dims
            if axis_name is not None:  # one more leaf: the marker of the named level
                fn, xs, ds = _axes.named_call(axis_name, flat_f, flat, dims)
            return torch.func.vmap(
                fn, in_dims=tuple(ds), out_dims=torch_out, randomness=randomness,
                chunk_size=chunk_size,
            )(*xs)  # fmt: skip

        try:
            try:
                out = run(False)
            except ValueError as e:  # torch refuses None outputs; JAX returns None
                if _NONE_OUTPUT not in str(e):
                    raise
                converted.clear()
                out = _with_nones(run(True), nones)
        except RuntimeError as e:
            new = _translate(e, name)
            if new is None:
                raise
            raise new from e
        return _place(out, out_dims, (), name, converted) if moved else out

    return mapped
