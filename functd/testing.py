"""Testing helpers: ``assert_close`` for trees and hypothesis strategies.

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

from collections.abc import Sequence
from typing import Any

import torch

from ._td import TensorDict
from ._td._tree import tree

__all__ = ["EXAMPLES", "assert_close", "batch_shapes", "example_tensordicts", "tensordicts"]


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


def _check_batch_sizes(a: Any, e: Any, path: tuple) -> None:
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
