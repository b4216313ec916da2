"""Proof that a call changed nothing it was given.

``Snapshot(obj)`` records the keys, leaf identities, leaf values and batch sizes of a
TensorDict or nested dict; ``check()`` fails if any of them changed. ``unchanged_example``
is the body of the error tests' ``td`` fixture: a small nested TensorDict, checked
unchanged after the test.

Example:
    >>> snap = Snapshot(td); fd.stack([td, other])  # raises
    >>> snap.check()
"""

from collections.abc import Iterator

import torch

import functd as fd


def example() -> fd.TensorDict:
    """The error tests' input: a batch of 5, a leaf and a nested leaf."""
    return fd.TensorDict({"x": torch.randn(5, 3), "obs": {"pos": torch.randn(5, 2)}}, [5])


class Snapshot:
    """Keys, leaf identities, leaf values and batch sizes of a TensorDict or nested dict."""

    def __init__(self, obj):
        self.obj = obj
        self.state = self._state(obj)

    @classmethod
    def _state(cls, obj):
        if isinstance(obj, fd.TensorDict):
            return (
                "td",
                tuple(obj.batch_size),
                tuple((k, cls._state(v)) for k, v in obj._data.items()),
            )
        if isinstance(obj, dict):
            return ("dict", tuple((k, cls._state(v)) for k, v in obj.items()))
        if isinstance(obj, torch.Tensor):
            return ("tensor", id(obj), obj.clone() if obj.device.type != "meta" else obj.shape)
        return ("other", id(obj))

    def check(self):
        assert self._equal(self._state(self.obj), self.state), "the input changed"

    @classmethod
    def _equal(cls, a, b):
        if type(a) is not type(b):
            return False
        if isinstance(a, torch.Tensor):
            return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(a, tuple):
            return len(a) == len(b) and all(cls._equal(x, y) for x, y in zip(a, b))
        return a == b


def unchanged_example() -> Iterator[fd.TensorDict]:
    """Yield ``example()``, then check it is exactly as before (a fixture's body)."""
    td = example()
    snap = Snapshot(td)
    yield td
    snap.check()


def snapshot(*trees) -> list:
    """Each tree (a pytree of tensors), its structure, and each leaf with a copy of its
    value and its version counter (an in-place write bumps it even when the value stays)."""
    return [
        (t, fd.tree.structure(t), [(v, v.clone(), v._version) for v in fd.tree.leaves(t)])
        for t in trees
    ]


def assert_unchanged(snap: list) -> None:
    """Every tree ``snap`` recorded has the same structure, the same leaf objects, and
    leaves neither written in place nor changed in value."""
    for tree, spec, leaves in snap:
        assert fd.tree.structure(tree) == spec, "the structure changed"
        now = fd.tree.leaves(tree)
        assert len(now) == len(leaves), "the structure changed"
        assert all(v is w for (v, _, _), w in zip(leaves, now)), "a leaf was swapped"
        for v, copy, version in leaves:
            assert v._version == version and torch.equal(v, copy), "a leaf was written"
