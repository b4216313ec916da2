"""Testing helpers: ``assert_close`` for trees, compile assertions, hypothesis strategies.

The compile assertions are what chex gives JAX users: ``assert_max_compiles`` and
``count_compiles`` count the compilations of ``fd.jit`` and ``torch.compile``,
``assert_no_graph_break`` fails on a dynamo graph break, and ``variants`` runs
one test under eager, ``fd.jit``, ``fd.vmap`` and ``fd.grad``.

Use them in your own property tests:

Example:
    >>> from hypothesis import given
    >>> from functd.testing import tensordicts, assert_close
    >>> @given(tensordicts(batch_shape=(3,), max_depth=2))
    ... def test_clone_is_close(td):
    ...     assert_close(td.clone(), td)

``hypothesis`` is only needed for the strategies (install the ``dev`` extra);
``assert_close`` needs nothing beyond torch.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ._td import TensorDict
from ._td._shape import stack
from ._td._tree import tree
from ._transforms import _jit
from ._transforms._autodiff import grad
from ._transforms._vmap import vmap

__all__ = [
    "EXAMPLES",
    "VARIANTS",
    "CompileCount",
    "Variant",
    "assert_close",
    "assert_max_compiles",
    "assert_no_graph_break",
    "batch_shapes",
    "count_compiles",
    "example_tensordicts",
    "tensordicts",
    "variants",
]


def assert_close(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = False,
    check_batch_size: bool = True,
) -> None:
    """Assert two pytrees (TensorDicts, dicts, tuples, tensors) are equal within tolerances.

    Compares the tree structures (keys), then every leaf with
    ``torch.testing.assert_close`` (same dtype, device and shape), and the batch
    sizes of TensorDicts. The message names the key path of the first difference.

    Raises:
        AssertionError: the structures, a batch size, or a leaf differ.

    Example:
        >>> assert_close(td.clone(), td)
    """
    a_paths, a_leaves, a_spec = tree.flatten_with_path(actual, none_is_leaf=True)
    e_paths, e_leaves, e_spec = tree.flatten_with_path(expected, none_is_leaf=True)
    if a_spec != e_spec:
        raise AssertionError(
            f"tree structures differ:\n  actual:   {a_spec}\n  expected: {e_spec}\n"
            f"  keys only in actual: {sorted(set(a_paths) - set(e_paths), key=str)}\n"
            f"  keys only in expected: {sorted(set(e_paths) - set(a_paths), key=str)}"
        )
    if check_batch_size:
        _check_batch_sizes(actual, expected, ())
    for path, a, e in zip(a_paths, a_leaves, e_leaves):
        try:
            if isinstance(a, torch.Tensor) or isinstance(e, torch.Tensor):
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan)
            elif a != e:
                raise AssertionError(f"{a!r} != {e!r}")
        except AssertionError as err:
            raise AssertionError(f"leaf at {path} differs: {err}") from None


def _check_batch_sizes(a: Any, e: Any, path: tuple[Any, ...]) -> None:
    if isinstance(a, TensorDict) and isinstance(e, TensorDict):
        if a.batch_size != e.batch_size:
            raise AssertionError(
                f"batch sizes differ at {path or 'the root'}: {list(a.batch_size)} vs "
                f"{list(e.batch_size)}"
            )
        for k in a.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch)
            _check_batch_sizes(a[k], e[k], (*path, k))
    elif isinstance(a, dict | list | tuple) and type(a) is type(e):
        items: Any = a.items() if isinstance(a, dict) else enumerate(a)
        for j, v in items:
            _check_batch_sizes(v, e[j], (*path, j))


# ------------------------------------------------------------------ compile assertions
def _dynamo_counts() -> tuple[int, int]:
    """(graphs dynamo compiled, graph breaks) so far in this process."""
    import sys

    if "torch._dynamo" not in sys.modules:  # nothing compiled yet: do not import it
        return 0, 0
    from ._torch.dynamo import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


class CompileCount:
    """Compilations since the block began (live while it runs, frozen after).

    Attributes:
        jit: signatures ``fd.jit`` traced and compiled.
        torch: graphs ``torch.compile`` (dynamo) compiled.
        graph_breaks: dynamo graph breaks.
    """

    def __init__(self) -> None:
        self._start = (_jit.compiles(), *_dynamo_counts())
        self._end: tuple[Any, ...] | None = None

    def _now(self) -> tuple[Any, ...]:
        return self._end or (_jit.compiles(), *_dynamo_counts())

    @property
    def jit(self) -> int:
        return self._now()[0] - self._start[0]

    @property
    def torch(self) -> int:
        return self._now()[1] - self._start[1]

    @property
    def graph_breaks(self) -> int:
        return self._now()[2] - self._start[2]

    @property
    def total(self) -> int:
        """``jit + torch``."""
        return self.jit + self.torch

    def __repr__(self) -> str:
        return f"CompileCount(jit={self.jit}, torch={self.torch}, graph_breaks={self.graph_breaks})"


@contextlib.contextmanager
def count_compiles() -> Iterator[CompileCount]:
    """Count the compilations of ``fd.jit`` and ``torch.compile`` inside a block.

    Example:
        >>> with count_compiles() as n:
        ...     jstep(params, td)
        >>> n.jit
        1
    """
    count = CompileCount()
    try:
        yield count
    finally:
        count._end = count._now()


class _MaxCompiles(contextlib.ContextDecorator):
    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> CompileCount:
        self._count = CompileCount()
        return self._count

    def __exit__(self, *exc: Any) -> None:
        c = self._count
        c._end = c._now()
        if exc[0] is None and c.total > self.n:
            raise AssertionError(
                f"expected at most {self.n} compilation(s), got {c.total} ({c}): a "
                "signature changed (fd.jit: jstep.lower(...) shows one; torch.compile: "
                "TORCH_LOGS=recompiles says why)."
            )


def assert_max_compiles(fn_or_n: Callable[..., Any] | int, n: int | None = None) -> Any:
    """Fail when more than ``n`` compilations (``fd.jit`` + ``torch.compile``) happen.

    Two forms: ``with assert_max_compiles(n): ...`` checks the block;
    ``assert_max_compiles(f, n)`` wraps ``f`` and checks the compilations made by
    all its calls together (as chex's ``assert_max_traces``).

    Raises:
        AssertionError: more than ``n`` compilations (the message says which kind).

    Example:
        >>> step = assert_max_compiles(fd.jit(step), 1)
        >>> for batch in batches: step(params, batch)   # fails on a second compile
        >>> with assert_max_compiles(2):
        ...     for n in range(1, 25): jblock(params, td_of_batch(n))
    """
    if not callable(fn_or_n):
        return _MaxCompiles(int(fn_or_n))
    if n is None:
        raise TypeError("assert_max_compiles(f, n): give the most compilations n.")
    f, start = fn_or_n, [None]

    @functools.wraps(f)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if start[0] is None:
            start[0] = CompileCount()  # type: ignore[call-overload]
        out = f(*args, **kwargs)
        c = start[0]
        if c.total > n:  # type: ignore[attr-defined]
            raise AssertionError(
                f"{getattr(f, '__name__', f)!s}: expected at most {n} compilation(s) over "
                f"its calls, got {c.total} ({c})."  # type: ignore[attr-defined]
            )
        return out

    return checked


@contextlib.contextmanager
def assert_no_graph_break() -> Iterator[CompileCount]:
    """Fail when torch.compile (dynamo) breaks a graph inside the block (``fd.jit``
    never breaks one: it raises).

    Example:
        >>> with assert_no_graph_break():
        ...     torch.compile(lambda p, t: block(p, t))(params, td)
    """
    with count_compiles() as c:
        yield c
    if c.graph_breaks:
        from ._torch.dynamo import counters

        raise AssertionError(
            f"{c.graph_breaks} graph break(s) in the block: {dict(counters['graph_break'])}"
        )


# ------------------------------------------------------------------ variants
VARIANTS = ("eager", "jit", "vmap", "grad")


class Variant:
    """One way to run a function that must not change its result: ``variant(f)`` is
    ``f`` itself (``"eager"``), ``fd.jit(f)``, ``f`` under ``fd.vmap`` over a batch of
    one (every tensor argument stacked once, the output's entry 0), or ``f`` under
    ``fd.grad`` (differentiating the sum of its floating outputs with respect to its
    last all-floating argument, e.g. the data of ``m(params, td)``; the result is
    ``f``'s output)."""

    def __init__(self, name: str, **jit_options: Any) -> None:
        if name not in VARIANTS:
            raise ValueError(f"variants: unknown variant {name!r}; choose from {VARIANTS}.")
        self.name, self.jit_options = name, jit_options

    def __repr__(self) -> str:
        return self.name

    def __call__(self, f: Callable[..., Any]) -> Callable[..., Any]:
        if self.name == "jit":
            return _jit.jit(f, **self.jit_options)
        if self.name == "vmap":
            return functools.partial(_vmapped, f)
        if self.name == "grad":
            return functools.partial(_under_grad, f)
        return f


def _has_tensor(a: Any) -> bool:
    return any(isinstance(v, torch.Tensor) for v in tree.leaves(a))


def _vmapped(f: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    def one(v: Any) -> Any:
        if isinstance(v, TensorDict):
            return stack([v])
        return tree.map(lambda t: t.unsqueeze(0) if isinstance(t, torch.Tensor) else t, v)

    dims = tuple(0 if _has_tensor(a) else None for a in args)
    batched = [one(a) if d == 0 else a for a, d in zip(args, dims)]
    out = vmap(lambda *a: f(*a, **kwargs), in_dims=dims)(*batched)
    return tree.map(lambda t: t[0] if isinstance(t, torch.Tensor) else t, out)


def _floating(a: Any) -> bool:
    leaves = [v for v in tree.leaves(a) if isinstance(v, torch.Tensor)]
    return bool(leaves) and all(v.is_floating_point() for v in leaves)


def _under_grad(f: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    i = next((i for i in reversed(range(len(args))) if _floating(args[i])), None)
    if i is None:
        return f(*args, **kwargs)

    def loss(x: Any) -> tuple[Any, ...]:
        out = f(*args[:i], x, *args[i + 1 :], **kwargs)
        floats = [
            v for v in tree.leaves(out) if isinstance(v, torch.Tensor) and v.is_floating_point()
        ]
        total = sum((v.sum() for v in floats), torch.zeros((), dtype=torch.float64))
        return total, out

    return grad(loss, has_aux=True)(args[i])[1]


def variants(*names: str, **jit_options: Any) -> Any:
    """A pytest parametrization that runs a test once per variant (default: all of
    ``VARIANTS``); the test takes a ``variant`` argument and calls ``variant(f)``
    where it would call ``f``. ``jit_options`` go to ``fd.jit`` (e.g.
    ``backend="fx"`` for a fast trace-only check).

    Example:
        >>> @fd.testing.variants()
        ... def test_block(variant):
        ...     assert_close(variant(block)(params, td), block(params, td))
    """
    import pytest

    chosen = names or VARIANTS
    return pytest.mark.parametrize(
        "variant", [Variant(n, **jit_options) for n in chosen], ids=list(chosen)
    )


def example_tensordicts() -> dict[str, TensorDict]:
    """A small shared corpus: empty, flat, nested, batch ``[]``, ``[2, 3]``, mixed dtypes."""
    g = torch.Generator().manual_seed(0)

    def r(*shape, dtype=torch.float32):
        x = torch.randn(shape, generator=g)
        return x.to(dtype) if dtype != torch.bool else x > 0

    return {
        "empty": TensorDict({}, []),
        "empty_batched": TensorDict({}, [4]),
        "scalar_batch": TensorDict({"x": r(3), "y": r()}, []),
        "flat": TensorDict({"x": r(5, 3), "y": r(5)}, [5]),
        "nested": TensorDict({"x": r(5, 3), "obs": {"pos": r(5, 2), "deep": {"z": r(5)}}}, [5]),
        "batch_2x3": TensorDict({"a": r(2, 3, 4), "b": {"c": r(2, 3)}}, [2, 3]),
        "mixed_dtypes": TensorDict(
            {
                "f64": r(4, 2, dtype=torch.float64),
                "i64": r(4, dtype=torch.int64),
                "b": r(4, 1, dtype=torch.bool),
                "f16": r(4, dtype=torch.float16),
            },
            [4],
        ),
        "longer_child": TensorDict({"x": r(3), "c": TensorDict({"y": r(3, 2, 5)}, [3, 2])}, [3]),
    }


EXAMPLES = tuple(example_tensordicts())


# ------------------------------------------------------------------ hypothesis
def batch_shapes(max_dims: int = 3, max_side: int = 4) -> Any:  # a SearchStrategy
    """Strategy of batch shapes: tuples of up to ``max_dims`` sizes in ``[1, max_side]``."""
    from hypothesis import strategies as st

    return st.lists(st.integers(1, max_side), max_size=max_dims).map(tuple)


_KEYS = ("a", "b", "c", "x", "y", "obs", "h0", "a.b")


def tensordicts(
    batch_shape: Sequence[int] | Any | None = None,
    *,
    max_depth: int = 2,
    min_keys: int = 0,
    max_keys: int = 4,
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    devices: Sequence[str | torch.device] = ("cpu",),
    max_feature_dims: int = 2,
    max_side: int = 3,
    max_extra_dims: int = 0,
) -> Any:  # a hypothesis SearchStrategy of TensorDicts
    """Hypothesis strategy of TensorDicts.

    Args:
        batch_shape: a fixed batch shape, a strategy of shapes, or None for
            ``batch_shapes()``.
        max_depth: nesting depth (1 means no nested TensorDict).
        min_keys: least number of entries per level.
        max_keys: largest number of entries per level.
        dtypes: dtypes drawn for the leaves (floating, integer or bool).
        devices: devices drawn for the leaves (one per TensorDict).
        max_feature_dims: feature dims of each leaf, after the batch dims.
        max_side: largest size of a feature dim.
        max_extra_dims: extra batch dims a nested TensorDict may have beyond its
            parent's (0: nested levels share their parent's batch size).

    Example:
        >>> @given(tensordicts(batch_shape=batch_shapes(), dtypes=(torch.float64,)))
        ... def test_roundtrip(td): ...
    """
    from hypothesis import strategies as st

    if batch_shape is None:
        shape_st = batch_shapes()
    elif isinstance(batch_shape, st.SearchStrategy):
        shape_st = batch_shape
    else:
        shape_st = st.just(tuple(batch_shape))

    @st.composite
    def build(draw):
        bs = draw(shape_st)
        device = torch.device(draw(st.sampled_from(list(devices))))
        seed = draw(st.integers(0, 2**31 - 1))
        g = torch.Generator().manual_seed(seed)
        return TensorDict(_level(draw, bs, max_depth, g, device), bs)

    def _level(draw, bs, depth, g, device):
        keys = draw(
            st.lists(st.sampled_from(_KEYS), min_size=min_keys, max_size=max_keys, unique=True)
        )
        out = {}
        for k in keys:
            if depth > 1 and draw(st.booleans()):
                extra = draw(st.lists(st.integers(1, max_side), max_size=max_extra_dims))
                sub = (*bs, *extra)
                level = _level(draw, sub, depth - 1, g, device)
                out[k] = TensorDict(level, sub) if extra else level
                continue
            feat = draw(st.lists(st.integers(1, max_side), max_size=max_feature_dims))
            dtype = draw(st.sampled_from(list(dtypes)))
            x = torch.randn((*bs, *feat), generator=g)
            if dtype == torch.bool:
                x = x > 0
            elif not dtype.is_floating_point:
                x = (x * 10).round()
            out[k] = x.to(device=device, dtype=dtype)
        return out

    return build()
