"""EmbeddingBag against torch.nn.EmbeddingBag: every mode, offsets, weights, padding, grads, vmap."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import functd as fd
import functd.nn as fnn

D = torch.float64


@st.composite
def bags(draw):
    """A torch EmbeddingBag config and call: a 1-D input with offsets (empty bags
    allowed) or a 2-D one, per-sample weights in sum mode, a padding row or not."""
    mode = draw(st.sampled_from(["sum", "mean", "max"]))
    pad = draw(st.sampled_from([None, 0, -1]))
    last = draw(st.booleans())
    scale = draw(st.booleans()) and mode != "max"  # torch refuses it (tested below)
    n = draw(st.integers(1, 12))
    idx = torch.tensor(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)))
    if draw(st.booleans()):  # 1-D with offsets
        starts = sorted(draw(st.lists(st.integers(0, n), min_size=1, max_size=5)))
        starts[0] = 0
        offsets = torch.tensor(starts + ([n] if last else []))
    else:
        idx, offsets = idx.repeat(2).view(2, n), None
    psw = torch.randn(idx.shape, dtype=D) if mode == "sum" and draw(st.booleans()) else None
    m = nn.EmbeddingBag(
        7, 3, mode=mode, padding_idx=pad, include_last_offset=last, scale_grad_by_freq=scale
    )
    return m.double(), idx, offsets, psw


@given(bags())
def test_embedding_bag_matches_torch(case):
    m, idx, offsets, psw = case
    layer = fnn.lower(m)
    assert isinstance(layer, fnn.EmbeddingBag)
    params = fd.from_module(m)
    out = layer(params, idx, offsets, psw)
    ref = m(idx, offsets, psw)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    if m.scale_grad_by_freq:  # torch 2.13's CPU grad is wrong there: see below
        return
    w = torch.randn(ref.shape, dtype=D)
    g = torch.func.grad(lambda p: (layer(p, idx, offsets, psw) * w).sum())(params)
    (g_ref,) = torch.autograd.grad((m(idx, offsets, psw) * w).sum(), m.weight)
    torch.testing.assert_close(g["weight"], g_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_scale_grad_by_freq(mode):
    """Each row's grad divided by its index's count in the batch (torch's documented
    semantics, and F.embedding's). torch 2.13's CPU embedding_bag divides by another
    index's count when counts differ (pytorch/pytorch#190063, fixed after 2.13), so
    torch is the reference only where every index has the same count."""
    m = nn.EmbeddingBag(6, 2, mode=mode, scale_grad_by_freq=True).double()
    layer, params = fnn.lower(m), fd.from_module(m)
    idx, off = torch.tensor([4, 1, 1, 4, 2, 2]), torch.tensor([0, 3])  # each twice
    w = torch.randn(2, 2, dtype=D)
    g = torch.func.grad(lambda p: (layer(p, idx, off) * w).sum())(params)["weight"]
    (g_ref,) = torch.autograd.grad((m(idx, off) * w).sum(), m.weight)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)
    # the case: index 1 twice, index 3 once, one bag; sum of ones
    one = fnn.EmbeddingBag(4, 1, True, mode)
    g = torch.func.grad(lambda p: one(p, torch.tensor([1, 1, 3]), torch.tensor([0])).sum())(
        one.init(0)
    )["weight"]
    per_index = 1.0 if mode == "sum" else 1.0 / 3
    assert g.flatten().tolist() == pytest.approx([0.0, per_index, 0.0, per_index])


def test_float32_and_padding_row_init():
    m = nn.EmbeddingBag(20, 4, mode="mean", padding_idx=3)
    layer = fnn.lower(m)
    idx, off = torch.randint(0, 20, (30,)), torch.tensor([0, 5, 5, 17])
    torch.testing.assert_close(layer(fd.from_module(m), idx, off), m(idx, off))
    p = layer.init(0)
    assert torch.equal(p["weight"][3], torch.zeros(4)) and p["weight"].std() > 0.5
    assert layer == fnn.EmbeddingBag(20, 4, padding_idx=-17)


def test_ensemble_under_vmap_equals_loop():
    layer = fnn.EmbeddingBag(10, 3, mode="max", padding_idx=0)
    ens = torch.func.vmap(layer.init)(fd.random.split(fd.random.key(0), 4))
    idx, off = torch.tensor([0, 1, 2, 0, 5, 9, 9]), torch.tensor([0, 1, 4])
    out = fd.vmap(layer, in_dims=(0, None, None))(ens, idx, off)
    for i in range(4):
        torch.testing.assert_close(out[i], layer(ens[i], idx, off))
    assert torch.equal(out[:, 0], torch.zeros(4, 3))  # a bag of padding only: zeros


def test_refused_configs_and_bad_calls():
    assert fnn.lower(nn.EmbeddingBag(5, 2, max_norm=1.0)) is None
    assert fnn.lower(nn.EmbeddingBag(5, 2, sparse=True)) is None
    layer = fnn.EmbeddingBag(5, 2, mode="mean")
    p = layer.init(0)
    with pytest.raises(ValueError, match="mode has to be one of"):
        fnn.EmbeddingBag(5, 2, mode="min")
    with pytest.raises(ValueError, match="1-D input needs offsets"):
        layer(p, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="takes no offsets"):
        layer(p, torch.tensor([[1, 2]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="per_sample_weights is only supported for mode='sum'"):
        layer(p, torch.tensor([[1, 2]]), None, torch.ones(1, 2))
    with pytest.raises(ValueError, match="max mode does not support scaling"):
        fnn.EmbeddingBag(5, 2, True, "max")(p, torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="one weight per index"):
        fnn.EmbeddingBag(5, 2, mode="sum")(p, torch.tensor([[1, 2]]), None, torch.ones(2))
