"""Differential fuzzing of TensorDict ops against tensordict 0.15 (skipped without it).

Random nested TensorDicts (``functd.testing.tensordicts``, nested levels with extra
batch dims and empty levels included) go through random ops — indexing, stack, cat,
unbind, select/exclude/rename/set/update/get, apply, reshape/unsqueeze/squeeze/expand,
keys — in functd and in tensordict. Either both give the same result (batch sizes,
keys in order, leaves bit for bit), or both raise and functd's error is its own (raised
by a ``raise`` statement in functd, not a raw torch/Python error from inside). The
input is never changed. Differences that are deliberate (notes/porting.md, "TensorDict
ops") are written out below, not skipped silently:

- ``keys(include_nested=True)`` without ``leaves_only``: functd lists a nested
  TensorDict's key before its entries (pre-order), tensordict after them; the test
  checks tensordict's order is the post-order of the same walk and functd's the pre-order.
- ``td[()]``: ``()`` is the empty key in functd (a KeyError that says to write
  ``td[...]``); tensordict returns the TensorDict.
- ``select(k, (k, sub))``: functd keeps the whole entry ``k`` (the union of what each
  key selects); tensordict keeps only ``(k, sub)``. Compared against tensordict's
  ``select`` of the keys that lie below no other key.

Where tensordict 0.15.3 itself fails, the reference is built from its other ops:
``squeeze()`` raises a TypeError from its ``view()`` on some nested layouts, so
``squeeze()`` is compared with tensordict's ``squeeze(d)`` over each size-1 dim; it
indexes a TensorDict without leaves with an out-of-range index tensor without an
error, so such an index must first index a tensor of the batch shape.

``FUZZ_EXAMPLES=10000`` runs a larger campaign (the ``ci`` profile runs 20 examples of
``OPS`` ops each); ``FUZZ_REPORT=1`` prints the count of ops compared per kind.
"""

from __future__ import annotations

import collections
import linecache
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import functd as fd
from functd.testing import batch_shapes, tensordicts

tensordict = pytest.importorskip("tensordict")

OPS = 6  # ops per example
_FUNCTD = os.path.dirname(fd.__file__)
COUNTS: collections.Counter = collections.Counter()
FAILS: collections.Counter = collections.Counter()  # FUZZ_COLLECT=1: (op, message) -> count
_COLLECT = bool(os.environ.get("FUZZ_COLLECT"))
EXAMPLE: dict = {}
LAST_OP: list = [""]


# ----------------------------------------------------------------- the two sides
def to_ref(td: fd.TensorDict):
    data = {k: to_ref(v) if isinstance(v, fd.TensorDict) else v.clone() for k, v in td.items()}
    return tensordict.TensorDict(data, batch_size=td.batch_size)


def snapshot(td: fd.TensorDict) -> list:
    return [(k, v.batch_size if isinstance(v, fd.TensorDict) else v.clone())
            for k, v in td.items(include_nested=True)]  # fmt: skip


def unchanged(td: fd.TensorDict, snap: list) -> None:
    now = td.items(include_nested=True)
    assert [k for k, _ in now] == [k for k, _ in snap], "the input's keys changed"
    for (k, v), (_, w) in zip(now, snap):
        if isinstance(v, fd.TensorDict):
            assert v.batch_size == w, f"the input's batch size at {k} changed"
        else:
            assert torch.equal(v, w), f"the input's leaf {k} changed"


def same(a, b, path=()) -> None:
    """functd's result ``a`` equals tensordict's ``b``: types, batch sizes, keys in
    order at every level, leaves bit for bit."""
    if isinstance(b, tuple | list):
        assert isinstance(a, tuple | list) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, (*path, i))
        return
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), (path, type(a))
        assert a.shape == b.shape and a.dtype == b.dtype, (path, a.shape, b.shape)
        assert torch.equal(a, b) or torch.equal(a.isnan(), b.isnan()), path
        return
    if isinstance(b, tensordict.TensorDictBase):
        assert isinstance(a, fd.TensorDict), (path, type(a))
        assert a.batch_size == b.batch_size, (path, a.batch_size, b.batch_size)
        assert tuple(a.keys()) == tuple(b.keys()), (path, a.keys(), tuple(b.keys()))
        for k in a.keys():  # noqa: SIM118 (a TensorDict iterates its batch)
            same(a[k], b[k], (*path, k))
        return
    assert a == b, (path, a, b)


def raised_by_functd(e: BaseException) -> bool:
    """The error comes from a ``raise`` statement in functd (its own, clear error), not
    from torch or Python inside a functd function."""
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    name = tb.tb_frame.f_code.co_filename
    line = linecache.getline(name, tb.tb_lineno).strip()
    return name.startswith(_FUNCTD) and line.startswith("raise")


def compare(kind: str, mine, theirs, td: fd.TensorDict, args=None) -> None:
    """Run ``mine()`` (functd) and ``theirs()`` (tensordict) and compare."""
    COUNTS[kind] += 1
    snap = snapshot(td)
    LAST_OP[0] = f"{kind} {args!r}"
    try:
        a, a_err = mine(), None
    except Exception as e:
        a, a_err = None, e
    unchanged(td, snap)
    try:
        b, b_err = theirs(), None
    except Exception as e:
        b, b_err = None, e
    if a_err is not None:
        assert raised_by_functd(a_err), f"{kind}: a raw error from inside functd: {a_err!r}"
        assert b_err is not None, f"{kind}: functd refused what tensordict does: {a_err!r}"
        return
    assert b_err is None, f"{kind}: functd returned what tensordict refuses ({b_err!r})"
    same(a, b, (kind,))


# ----------------------------------------------------------------- the ops
def _indices(draw, bs: torch.Size):
    n = len(bs)

    def one(size):
        return draw(st.one_of(
            st.integers(-size - 1, size),
            st.builds(slice, st.none() | st.integers(-size - 1, size + 1),
                      st.none() | st.integers(-size - 1, size + 1), st.none() | st.integers(1, 3)),
            st.lists(st.integers(-size, size - 1), min_size=1, max_size=3).map(torch.tensor)
            if size else st.just(slice(None)),
            st.lists(st.booleans(), min_size=size, max_size=size).map(torch.tensor),
        ))  # fmt: skip

    form = draw(st.integers(0, 7))
    if form == 7:
        return ()  # rarely: the empty index
    items = [one(bs[i]) for i in range(draw(st.integers(min(n, 1), n)))]
    if form < 3 or not items:
        items.insert(draw(st.integers(0, len(items))), draw(st.sampled_from([None, Ellipsis])))
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


def _reshapes(draw, bs: torch.Size):
    numel = bs.numel()
    dims, left = [], numel
    for _ in range(draw(st.integers(0, 3))):
        divs = [d for d in range(1, left + 1) if left % d == 0] or [1]
        d = draw(st.sampled_from(divs))
        dims.append(d)
        left //= d if d else 1
    if left != 1 or not dims:
        dims.append(left)
    if draw(st.booleans()) and dims:
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    if draw(st.integers(0, 9)) == 0:
        dims.append(draw(st.integers(2, 3)))  # a wrong size: both must refuse
    return dims


def _paths(td: fd.TensorDict) -> list:
    return [*list(td.keys(include_nested=True)), "missing", ("missing", "x")]


def _union(keys: list) -> list:
    """``keys`` with each path that lies below another key replaced by that key, in the
    order of first mention (what functd's select keeps)."""
    paths = [(k,) if isinstance(k, str) else k for k in keys]
    out: list = []
    for p in paths:
        top = min((q for q in paths if p[: len(q)] == q), key=len)
        key = top[0] if len(top) == 1 else top
        if key not in out:
            out.append(key)
    return out


def _pre_post(ref, prefix=()):
    """(pre-order, post-order) of a tensordict's nested keys, from its per-level order."""
    pre, post = [], []
    for k in ref.keys():  # noqa: SIM118 (a TensorDict iterates its batch)
        key = (*prefix, k) if prefix else k
        v = ref.get(k)
        pre.append(key)
        if isinstance(v, tensordict.TensorDictBase):
            p, q = _pre_post(v, (*prefix, k))
            pre += p
            post += q
        post.append(key)
    return pre, post


def run_op(draw, td: fd.TensorDict) -> None:
    ref = to_ref(td)
    bs, n = td.batch_size, td.batch_dims
    other = td.apply(lambda x: x + 1 if x.dtype != torch.bool else ~x)
    ref2 = to_ref(other)
    op = draw(st.sampled_from([
        "index", "stack", "cat", "unbind", "select", "exclude", "rename", "set", "update", "get",
        "apply", "apply_batch", "reshape", "unsqueeze", "squeeze", "expand", "keys",
    ]))  # fmt: skip
    if op == "index":
        idx = _indices(draw, bs)
        if idx == ():  # deliberate: () is the empty key in functd (tensordict: td itself)
            COUNTS["index ()"] += 1
            with pytest.raises(KeyError, match=r"may not be the empty tuple \(\).*td\[\.\.\.\]"):
                td[()]
            return

        def theirs():  # tensordict does not check the index of a TensorDict without leaves
            if td.is_empty():
                torch.empty(bs)[idx]  # a tensor of the batch shape: raises if out of range
            return ref[idx]

        compare(op, lambda: td[idx], theirs, td, idx)
    elif op in ("stack", "cat"):
        dim = draw(st.integers(-n - 2, n + 1))
        fn = getattr(fd, op)
        tfn = getattr(torch, op)
        compare(op, lambda: fn([td, other], dim), lambda: tfn([ref, ref2], dim), td, dim)
    elif op == "unbind":
        dim = draw(st.integers(-n - 1, n))
        compare(op, lambda: td.unbind(dim), lambda: ref.unbind(dim), td, dim)
    elif op == "select":
        keys = draw(st.lists(st.sampled_from(_paths(td)), max_size=3, unique=True))
        strict = draw(st.booleans())
        # deliberate: with a key and a path below it, functd selects the whole entry (the
        # union of what each key selects); tensordict keeps only the path below
        compare(op, lambda: td.select(*keys, strict=strict),
                lambda: ref.select(*_union(keys), strict=strict), td, (keys, strict))  # fmt: skip
    elif op == "exclude":
        keys = draw(st.lists(st.sampled_from(_paths(td)), max_size=3, unique=True))
        compare(op, lambda: td.exclude(*keys), lambda: ref.exclude(*keys), td, keys)
    elif op == "rename":
        old = draw(st.sampled_from(_paths(td)))
        new = draw(
            st.sampled_from(["new", ("new",), old if isinstance(old, str) else (*old[:-1], "z")])
        )

        def theirs():
            return ref.clone(False).rename_key_(old, new)

        compare(op, lambda: td.rename({old: new}), theirs, td, (old, new))
    elif op == "set":
        key = draw(st.sampled_from([*_paths(td), "fresh"]))
        val = torch.full((*bs, 2), 7.0)
        compare(op, lambda: td.set(key, val), lambda: ref.clone(False).set(key, val), td, key)
    elif op == "update":
        upd = {"u": torch.zeros(*bs, 1)}
        compare(op, lambda: td.update(upd), lambda: ref.clone(False).update(upd), td)
    elif op == "get":
        key = draw(st.sampled_from(_paths(td)))
        compare(op, lambda: td.get(key, None), lambda: ref.get(key, None), td, key)
    elif op == "apply":
        compare(op, lambda: td.apply(lambda x: x * 2), lambda: ref.apply(lambda x: x * 2), td)
    elif op == "apply_batch":
        new_bs = list(bs[: draw(st.integers(0, n))])
        compare(op, lambda: td.apply(lambda x: x * 2, batch_size=new_bs),
                lambda: ref.apply(lambda x: x * 2, batch_size=new_bs), td, new_bs)  # fmt: skip
    elif op == "reshape":
        shape = _reshapes(draw, bs)
        compare(op, lambda: td.reshape(*shape), lambda: ref.reshape(*shape), td, shape)
    elif op == "unsqueeze":
        dim = draw(st.integers(-n - 2, n + 1))
        compare(op, lambda: td.unsqueeze(dim), lambda: ref.unsqueeze(dim), td, dim)
    elif op == "squeeze":
        dim = draw(st.none() | st.integers(-n - 1, n))

        def theirs():  # tensordict's squeeze() fails on some nested layouts: one dim at a time
            if dim is not None:
                return ref.squeeze(dim)
            out = ref
            for d in reversed([i for i, s in enumerate(bs) if s == 1]):
                out = out.squeeze(d)
            return out

        compare(op, lambda: td.squeeze(dim), theirs, td, dim)
    elif op == "expand":
        lead = draw(st.lists(st.integers(1, 3), max_size=2))
        tail = [draw(st.sampled_from([s, -1, s if s != 1 else 3, 2])) for s in bs]
        shape = [*lead, *tail]
        compare(op, lambda: td.expand(*shape), lambda: ref.expand(*shape), td, shape)
    else:
        nested, leaves = draw(st.booleans()), draw(st.booleans())
        mine = td.keys(include_nested=nested, leaves_only=leaves)
        theirs = list(ref.keys(include_nested=nested, leaves_only=leaves))
        COUNTS[op] += 1
        if nested and not leaves:  # deliberate: pre-order in functd, post-order in tensordict
            pre, post = _pre_post(ref)
            assert theirs == post and list(mine) == pre, (mine, theirs)
        else:
            assert list(mine) == theirs, (mine, theirs)


_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0")) or None
_DTYPES = (torch.float32, torch.int64, torch.bool)
_SHAPES = st.one_of(batch_shapes(), st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))


@settings(
    max_examples=_EXAMPLES or settings.default.max_examples,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    td=tensordicts(_SHAPES, max_depth=3, max_extra_dims=2, dtypes=_DTYPES, max_feature_dims=1),
    data=st.data(),
)
def test_functd_agrees_with_tensordict(td, data):
    for _ in range(OPS):
        if not _COLLECT:
            run_op(data.draw, td)
            continue
        try:  # a campaign: count the failures by kind instead of stopping at the first
            run_op(data.draw, td)
        except AssertionError as e:
            msg = str(e).split("\n")[0][:200]
            FAILS[msg] += 1
            EXAMPLE.setdefault(msg, f"{td!r} {LAST_OP[0]}")


def teardown_module():
    if os.environ.get("FUZZ_REPORT") or _COLLECT:
        print(f"\nops compared: {sum(COUNTS.values())} {dict(sorted(COUNTS.items()))}")
        print(f"failures: {sum(FAILS.values())}")
        for msg, k in FAILS.most_common():
            print(f"  {k:5d}  {msg}\n          e.g. {EXAMPLE[msg]}")
