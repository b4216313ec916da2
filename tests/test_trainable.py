"""Trainable vs held-out leaves: fd.trainable, fd.partition, fd.combine, and the guard.

torch.optim trains what ``model.parameters()`` yields with ``requires_grad=True``;
buffers and frozen parameters never move. functd's natural path either trains
exactly that (params split with ``fd.partition(params, fd.trainable(model))``) or
raises, naming the leaves and the fix.
"""

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

import functd as fd
from functd.testing import assert_close, tensordicts


@given(tensordicts(max_depth=3), st.integers(0, 2**16))
def test_combine_inverts_partition(td, seed):
    paths = td.keys(include_nested=True, leaves_only=True)
    pick = {p for i, p in enumerate(paths) if (seed >> (i % 16)) & 1}

    def keep(path, leaf):
        return (path[0] if len(path) == 1 else path) in pick

    a, b = fd.partition(td, keep)
    assert set(a.keys(True, True)).isdisjoint(b.keys(True, True))
    assert a.batch_size == td.batch_size == b.batch_size
    back = fd.combine(a, b)
    assert_close(back, td)
    assert fd.tree.structure(back) == fd.tree.structure(td)


def test_partition_and_combine_errors():
    td = fd.TensorDict({"a": torch.zeros(2), "b": {"c": torch.ones(2)}}, [2])
    with pytest.raises(TypeError, match=r"fd.partition\(td, keep\): keep must be a function"):
        fd.partition(td, {"a"})
    with pytest.raises(TypeError, match=r"td must be a TensorDict; got dict"):
        fd.partition({"a": 1}, fd.trainable(td))
    with pytest.raises(KeyError, match=r"fd.combine: \('b', 'c'\) is in more than one part"):
        fd.combine(td, td.select(("b", "c")))
    with pytest.raises(ValueError, match=r"part 1 has batch size \[\] but part 0 has \[2\]"):
        fd.combine(td, fd.TensorDict({"z": torch.ones(3)}, []))


class Frozen(nn.Module):
    """An embedding (frozen), a Linear, a float buffer and an int buffer."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.emb.weight.requires_grad_(False)
        self.lin = nn.Linear(4, 2)
        self.register_buffer("bias2", torch.full((2,), 0.5))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, ids):
        return self.lin(self.emb(ids)) + self.bias2


def test_trainable_names_buffers_and_frozen_parameters():
    net = Frozen()
    m = fd.Module(net, ["ids"], ["y"])
    held = {("emb", "weight"), ("bias2",), ("steps",)}
    assert fd.trainable(m).held == held
    assert fd.trainable(net).held == held
    params, _ = fd.partition(fd.from_module(m), fd.trainable(m))
    assert set(params.keys(True, True)) == {("lin", "weight"), ("lin", "bias")}
    seq = fd.Module(nn.Linear(3, 4), ["x"], ["h"]) >> fd.Module(nn.BatchNorm1d(4), ["h"], ["y"])
    assert fd.trainable(seq).held == {
        ("1", "running_mean"),
        ("1", "running_var"),
        ("1", "num_batches_tracked"),
    }
    lin = nn.Linear(3, 3)
    lin.bias.requires_grad_(False)  # lowered onto fd.nn.Linear: frozen read from the source
    assert fd.trainable(fd.Module(lin, ["x"], ["y"])).held == {("bias",)}
    td_only = fd.TensorDict({"w": torch.zeros(2), "n": torch.zeros(2, dtype=torch.long)}, [])
    a, b = fd.partition(td_only, fd.trainable(td_only))
    assert a.keys() == ("w",) and b.keys() == ("n",)
    with pytest.raises(TypeError, match=r"fd.trainable\(model\) takes a module"):
        fd.trainable(3)


def test_differentiating_held_out_leaves_is_refused_with_the_fix():
    net = Frozen()
    m = fd.Module(net, ["ids"], ["y"])
    params = fd.from_module(m)
    td = fd.TensorDict({"ids": torch.tensor([1, 2, 3])}, [3])
    floats, _ = fd.partition(params, fd.trainable(params))  # int buffer out, frozen in
    msg = r"Module\(Frozen -> 'y'\): params .*'emb', 'weight'.* are held out of training.*fd.partition\(params, fd.trainable\(model\)\)"
    with pytest.raises(ValueError, match=msg):
        fd.grad(lambda p: m(fd.combine(p, params.select("steps")), td)["y"].sum())(floats)
    with pytest.raises(ValueError, match=msg):
        torch.func.grad(lambda p: m(fd.combine(p, params.select("steps")), td)["y"].sum())(floats)
    opt = fd.optim.adam(1e-2)
    step = fd.train_step(
        lambda p, b, k: m(fd.combine(p, params.select("steps")), b)["y"].sum(), opt
    )
    with pytest.raises(ValueError, match=msg):
        step(floats, opt.init(floats), td, None)


def test_natural_path_trains_what_torch_trains_in_lockstep_with_torch_optim():
    """README's path: partition, combine in the loss, fd.train_step; 3 Adam steps in float64
    equal torch.optim.Adam over model.parameters(); frozen and buffers never move."""
    torch.manual_seed(0)
    net = Frozen().double()
    ref = Frozen().double()
    ref.load_state_dict(net.state_dict())
    m = fd.Module(net, ["ids"], ["y"])
    params, held = fd.partition(fd.from_module(m), fd.trainable(m))
    params, held = params.clone(), held.clone()
    before = held.clone()
    opt = fd.optim.adamw(1e-2, weight_decay=0.1)
    state = opt.init(params)

    def loss_fn(p, batch, key):
        return (m(fd.combine(p, held), batch)["y"] ** 2).mean()

    step = fd.train_step(loss_fn, opt)
    torch_opt = torch.optim.AdamW(
        [p for p in ref.parameters() if p.requires_grad], 1e-2, weight_decay=0.1
    )
    for _ in range(3):
        batch = fd.TensorDict({"ids": torch.randint(0, 10, (6,))}, [6])
        params, state, _ = step(params, state, batch, None)
        torch_opt.zero_grad()
        (ref(batch["ids"]) ** 2).mean().backward()
        torch_opt.step()
    for name, t in ref.named_parameters():
        path = tuple(name.split("."))
        got = params.get(path) if path in params.keys(True, True) else held.get(path)
        torch.testing.assert_close(got, t.detach(), atol=1e-10, rtol=0)
    assert_close(held, before)  # bitwise: nothing held out moved


def test_vmapped_ensemble_of_partitioned_params():
    net = Frozen()
    m = fd.Module(net, ["ids"], ["y"])
    params, held = fd.partition(fd.from_module(m), fd.trainable(m))
    ens = fd.stack([params, params.apply(lambda t: t + 1)])
    td = fd.TensorDict({"ids": torch.tensor([1, 2])}, [2])
    grads = fd.vmap(fd.grad(lambda p: m(fd.combine(p, held), td)["y"].sum()), in_dims=(0,))(ens)
    assert grads.batch_size == torch.Size([2])
    assert set(grads.keys(True, True)) == {("lin", "weight"), ("lin", "bias")}
