"""Named axes, as JAX: ``fd.psum(x, name)`` / ``fd.pmean(x, name)`` over a named
``fd.vmap`` axis or over the ranks of a process group.

``fd.vmap(f, axis_name="members")`` maps one more input into ``f``: a marker,
``torch.arange(n)`` mapped over dim 0, which is a tensor batched exactly at that
vmap level. ``psum(x, "members")`` calls ``_PSum`` (a ``torch.autograd.Function``)
on ``(x, marker)``; torch.func hands it, at each vmap level where one of them is
batched, to its ``vmap`` rule with the ``in_dims`` of both. At the level where the
marker is batched (the named one) the rule sums x over its batch dim and
broadcasts the sum back to every member; at any other level it keeps the dim and
calls ``_PSum`` again one level down. Its backward is ``psum`` of the cotangent
(the transpose of psum), so values and gradients follow ``jax.vmap(...,
axis_name=...)`` under ``fd.grad`` inside or outside the vmap and under
``.backward()``.

``fd.distributed.axis("ranks", group=None)`` names the ranks of a process group:
inside it, ``psum(x, "ranks")`` all-reduces x (sum) over the group,
differentiably (its backward all-reduces the cotangent), so one loss function runs
vmapped on one device or spread over ranks.

Example:
    >>> f = lambda x: x - fd.pmean(x, "members")
    >>> fd.vmap(f, axis_name="members")(torch.tensor([1.0, 2.0, 6.0]))
    tensor([-2., -1.,  3.])
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils._pytree as torch_pytree

__all__ = ["axis", "axis_size", "pmean", "psum"]


class _Frame:
    """One named axis in scope: a vmap level (``marker``) or a process group."""

    __slots__ = ("group", "marker", "name", "size")
    group: Any
    marker: Any
    name: Any
    size: Any

    def __init__(self, name: str, size: int, marker: Any = None, group: Any = None) -> None:
        self.name, self.size, self.marker, self.group = name, size, marker, group


_LOCAL = threading.local()


def _stack() -> list[_Frame]:
    s = getattr(_LOCAL, "stack", None)
    if s is None:
        s = _LOCAL.stack = []
    return s


@contextmanager
def named_level(name: str, size: int, marker: torch.Tensor) -> Iterator[None]:
    """Used by ``fd.vmap(axis_name=...)`` inside the mapped function."""
    s = _stack()
    s.append(_Frame(name, size, marker=marker))
    try:
        yield
    finally:
        s.pop()


def check_name(name: Any, where: str) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{where}: an axis name is a non-empty str; got {name!r}.")


@contextmanager
def axis(name: str, group: Any = None) -> Iterator[None]:
    """Name the ranks of a process group ``name`` for ``fd.psum``/``fd.pmean``.

    Inside the block, ``fd.psum(x, name)`` all-reduces ``x`` (sum) over ``group``
    (default: the world), differentiably: the gradient of each rank's input is the
    sum of the cotangents over the ranks, as under ``fd.vmap(axis_name=name)``.

    Args:
        name: the axis name, as given to ``fd.psum``.
        group: a ``torch.distributed`` process group; None for the world.

    Raises:
        RuntimeError: no process group is initialised (start one with torchrun).

    Example:
        >>> with fd.distributed.axis("ranks"):
        ...     loss = fd.pmean(local_loss, "ranks")
    """
    check_name(name, "fd.distributed.axis")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"fd.distributed.axis({name!r}): no process group is initialised. Launch with "
            "`torchrun --nproc-per-node N script.py` and call "
            "torch.distributed.init_process_group() first (backend 'gloo' on CPU, 'nccl' on GPU)."
        )
    s = _stack()
    s.append(_Frame(name, dist.get_world_size(group), group=group))
    try:
        yield
    finally:
        s.pop()


def _find(name: Any, where: str) -> _Frame:
    check_name(name, where)
    s = _stack()
    for frame in reversed(s):
        if frame.name == name:
            return frame
    known = [f.name for f in reversed(s)]
    raise NameError(
        f"{where}: unknown axis name {name!r}; the axes in scope are "
        f"{known if known else '(none)'}. Name an axis with fd.vmap(f, axis_name={name!r}) "
        f"or, over ranks, `with fd.distributed.axis({name!r}):`."
    )


class _PSum(torch.autograd.Function):
    """Sum of x over the vmap level where ``marker`` is batched, broadcast back."""

    @staticmethod
    def forward(x: torch.Tensor, marker: torch.Tensor, size: int) -> torch.Tensor:
        return x * size  # x constant over the axis (its level never saw it batched)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.marker, ctx.size = inputs[1], inputs[2]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return _PSum.apply(g, ctx.marker, ctx.size), None, None

    @staticmethod
    def jvp(ctx: Any, x_t: torch.Tensor, marker_t: Any, size_t: Any) -> torch.Tensor:
        return _PSum.apply(x_t, ctx.marker, ctx.size)  # linear: psum of the tangent

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], x: torch.Tensor, marker: torch.Tensor, size: int):
        xd, md = in_dims[0], in_dims[1]
        if md is None:  # another vmap level: keep its dim, go one level down
            return _PSum.apply(x, marker, size), xd
        if xd is None:  # the named level, x the same for every member
            return x * size, None
        return x.sum(xd, keepdim=True).expand_as(x), xd


class _AllReduceSum(torch.autograd.Function):
    """``dist.all_reduce(SUM)`` on a copy; the backward all-reduces the cotangent."""

    @staticmethod
    def forward(x: torch.Tensor, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        out = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.group = inputs[1]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return _AllReduceSum.apply(g, ctx.group), None

    @staticmethod
    def jvp(ctx: Any, x_t: torch.Tensor, group_t: Any) -> torch.Tensor:
        return _AllReduceSum.apply(x_t, ctx.group)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], x: torch.Tensor, group: Any):
        return _AllReduceSum.apply(x, group), in_dims[0]


def _psum_leaf(x: Any, frame: _Frame) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    if frame.group is not None or frame.marker is None:
        return _AllReduceSum.apply(x, frame.group)
    return _PSum.apply(x, frame.marker, frame.size)


def _frames(axis_name: Any, where: str) -> list[_Frame]:
    names = axis_name if isinstance(axis_name, tuple | list) else (axis_name,)
    return [_find(n, where) for n in names]


@torch.compiler.disable(
    reason="fd.psum over a named vmap axis runs eagerly: torch.compile would trace the "
    "autograd.Function's forward and drop its vmap rule"
)
def psum(x: Any, axis_name: str | tuple[str, ...]) -> Any:
    """Sum of ``x`` over the named axis, the same value for every member (``jax.lax.psum``).

    Under ``fd.vmap(f, axis_name=name)``, the sum over the mapped elements; under
    ``fd.distributed.axis(name)``, the all-reduce (sum) over the ranks. A tuple of
    names sums over each. Differentiable: the gradient reaching each member is the
    sum of the cotangents of all members.

    Args:
        x: a tensor, or a tree of them (TensorDict, dict, list...).
        axis_name: the name (or a tuple of names) of axes in scope.

    Raises:
        NameError: no axis of that name is in scope (the message lists those that are).

    Example:
        >>> fd.vmap(lambda x: fd.psum(x, "i"), axis_name="i")(torch.arange(3.0))
        tensor([3., 3., 3.])
    """
    frames = _frames(axis_name, "fd.psum")
    for frame in frames:
        x = torch_pytree.tree_map(lambda v, f=frame: _psum_leaf(v, f), x)
    return x


@torch.compiler.disable(reason="fd.pmean runs eagerly, as fd.psum")
def pmean(x: Any, axis_name: str | tuple[str, ...]) -> Any:
    """Mean of ``x`` over the named axis (``psum / size``), the same for every member.

    Example:
        >>> fd.vmap(lambda x: fd.pmean(x, "i"), axis_name="i")(torch.arange(3.0))
        tensor([1., 1., 1.])
    """
    frames = _frames(axis_name, "fd.pmean")
    n = 1
    for frame in frames:
        n *= frame.size
    s = psum(x, axis_name)
    return torch_pytree.tree_map(lambda v: v / n if isinstance(v, torch.Tensor) else v, s)


def axis_size(axis_name: str) -> int:
    """The size of a named axis in scope (vmapped elements, or ranks).

    Example:
        >>> fd.vmap(lambda x: x * fd.axis_size("i"), axis_name="i")(torch.ones(3))
        tensor([3., 3., 3.])
    """
    return _find(axis_name, "fd.axis_size").size


def named_call(
    axis_name: str, flat_f: Any, flat: Sequence[Any], dims: Sequence[Any]
) -> tuple[Any, list[Any], list[Any]]:
    """``fd.vmap(axis_name=...)``'s hook: the function, leaves and in_dims to give
    ``torch.func.vmap`` so that ``flat_f`` runs with the named axis in scope (one more
    leaf, the marker ``arange(n)`` mapped over dim 0)."""
    leaf, d = next((v, d) for v, d in zip(flat, dims) if d is not None)
    n = leaf.shape[d]
    marker = torch.arange(n, device=leaf.device)

    def with_axis(*leaves: Any) -> Any:
        with named_level(axis_name, n, leaves[-1]):
            return flat_f(*leaves[:-1])

    return with_axis, [*flat, marker], [*dims, 0]
