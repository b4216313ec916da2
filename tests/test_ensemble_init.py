"""One-shot ensemble init: ``fd.vmap(m.init)(keys)`` for every module kind of the
conformance registry is one batched kernel draw per parameter leaf (each over every
member), and member ``i`` is ``m.init(keys[i])`` bitwise."""

from __future__ import annotations

import re

import pytest
import torch

import functd as fd
import functd.random as fr
from functd import _fused
from tests._support.conformance import ENTRIES

N = 5


@pytest.fixture
def calls(monkeypatch):
    """The kernel's calls as (mode, elements), the rare tail steps of normal left out."""
    fn = _fused._load()
    if not fn:
        pytest.skip("the fused kernel is not in use (FUNCTD_FUSED_RANDOM=0)")
    seen: list = []

    def spy(op, keys, total, *rest):
        if op & 255 not in (_fused.MODE_ERFINV_GATHER, _fused.MODE_ERFINV_GT):  # |x| > 0.9966
            seen.append((op & 255, total))
        return fn(op, keys, total, *rest)

    monkeypatch.setattr(_fused, "_KERNEL", spy)
    return seen


def bits(t: torch.Tensor) -> torch.Tensor:
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.itemsize]) if t.is_floating_point() else t


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_vmapped_init_is_one_draw_per_leaf_and_the_members_inits(calls, name):
    m = ENTRIES[name].make()
    keys = fr.split(fr.key(len(name)), N)
    calls.clear()
    try:
        first = m.init(keys[0])
    except NotImplementedError as e:  # weights read from a torch module: no init at all
        with pytest.raises(NotImplementedError, match=re.escape(str(e))):
            fd.vmap(m.init)(keys)
        return
    single = list(calls)
    calls.clear()
    ens = fd.vmap(m.init)(keys)
    assert calls == [(mode, total * N) for mode, total in single]  # not once per member
    if fd.tree.leaves(first):  # (a parameter-free init is an empty TensorDict)
        assert ens.batch_size == torch.Size([N])
    members = [first, *(m.init(k) for k in keys[1:])]
    assert fd.tree.structure(ens) == fd.tree.structure(fd.stack(members))
    for got, *want in zip(fd.tree.leaves(ens), *map(fd.tree.leaves, members)):
        assert got.dtype == want[0].dtype
        assert torch.equal(bits(got), bits(torch.stack(want)))


def test_a_random_leaf_is_drawn_in_one_call_over_all_members(calls):
    block = ENTRIES["Sequential(tutorial block)"].make()
    keys = fr.split(fr.key(0), 64)
    calls.clear()
    ens = fd.vmap(block.init)(keys)
    draws = [total for mode, total in calls if mode == _fused.MODE_RANGE32]
    sizes = sorted(v[0].numel() * 64 for v in fd.tree.leaves(ens))
    assert sorted(draws) == sizes  # one uniform draw per weight and bias, 64 members each
    assert len(calls) == len(draws) + 4  # + one fold_in per Linear child, one split in each
