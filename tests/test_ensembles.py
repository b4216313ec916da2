"""Ensembles: fd.stack / fd.unstack, fd.vmap(m.init) over keys, fd.vmap(m) over members,
against torch.func.stack_module_state + functional_call and a loop over nn.Modules."""

import copy

import pytest
import torch
import torch.nn as nn
from torch.func import functional_call, stack_module_state

import functd as fd
from functd.testing import assert_close

N, B = 5, 6
NAMES = {"0": "linear0", "2": "linear1", "4": "linear2"}  # fd position -> nn attribute


class Block(nn.Module):
    """The tutorial block, small: Linear 3->16, relu, Linear 16->16, relu, Linear 16->3, + x."""

    def __init__(self):
        super().__init__()
        self.linear0 = nn.Linear(3, 16)
        self.linear1 = nn.Linear(16, 16)
        self.linear2 = nn.Linear(16, 3)

    def forward(self, x):
        h = torch.relu(self.linear0(x))
        h = torch.relu(self.linear1(h))
        return self.linear2(h) + x


def fd_block(net):
    return fd.Sequential(
        fd.Module(net.linear0, ["x"], ["h0"]),
        fd.Module(torch.relu, ["h0"], ["a0"]),
        fd.Module(net.linear1, ["a0"], ["h1"]),
        fd.Module(torch.relu, ["h1"], ["a1"]),
        fd.Module(net.linear2, ["a1"], ["h2"]),
        fd.Module(lambda x, h: x + h, ["x", "h2"], ["y"]),
        selected_out_keys=["y"],
    )


def nets_and_ensemble(dtype=torch.float64):
    torch.manual_seed(0)
    nets = [Block().to(dtype) for _ in range(N)]
    block = fd_block(nets[0])
    ens = fd.stack([fd.from_module(fd_block(n)) for n in nets])
    return nets, block, ens


def nn_grads(net):
    return fd.TensorDict(
        {
            pos: {"weight": getattr(net, a).weight.grad, "bias": getattr(net, a).bias.grad}
            for pos, a in NAMES.items()
        }
    )


# ------------------------------------------------------------------ stack / unstack
def test_stack_unstack_roundtrip():
    _, block, _ = nets_and_ensemble()
    members = [block.init(fd.random.key(i)) for i in range(3)]
    ens = fd.stack(members)
    assert ens.batch_size == torch.Size([3])
    back = fd.unstack(ens)
    assert isinstance(back, tuple) and len(back) == 3
    for a, b in zip(back, members):
        assert_close(a, b)


def test_stack_mismatched_members_name_the_differing_keys():
    a = fd.TensorDict({"0": {"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}})
    b = fd.TensorDict({"0": {"weight": torch.zeros(2, 3)}, "1": {"bias": torch.zeros(2)}})
    with pytest.raises(
        ValueError,
        match=r"stack: TensorDict 0 and TensorDict 1 have different keys; only in 0: \(none\); only in 1: '1'",
    ):
        fd.stack([a, b])
    c = fd.TensorDict({"0": {"weight": torch.zeros(2, 3)}})
    with pytest.raises(ValueError, match=r"only in 0: \('0', 'bias'\); only in 1: \(none\)"):
        fd.stack([a, c])
    d = fd.TensorDict({"0": {"weight": torch.zeros(2, 4), "bias": torch.zeros(2)}})
    with pytest.raises(
        ValueError,
        match=r"entry \('0', 'weight'\) has feature shape \[2, 3\] in TensorDict 0 but \[2, 4\] in TensorDict 1",
    ):
        fd.stack([a, d])


def test_unstack_errors():
    with pytest.raises(ValueError, match=r"unstack: the TensorDict has batch_size \[\]"):
        fd.unstack(fd.TensorDict({"w": torch.zeros(3)}))
    with pytest.raises(TypeError, match="unstack takes a TensorDict"):
        fd.unstack([fd.TensorDict({})])


# ------------------------------------------------------------------ init
def test_vmap_init_over_keys_equals_loop_of_inits():
    _, block, _ = nets_and_ensemble()
    keys = fd.random.split(fd.random.key(0), N)
    ens = fd.vmap(block.init)(keys)
    loop = fd.stack([block.init(k) for k in keys])
    assert ens.batch_size == torch.Size([N])
    assert_close(ens, loop)
    assert not torch.equal(ens["0", "weight"][0], ens["0", "weight"][1])
    ens64 = fd.vmap(lambda k: block.init(k, dtype=torch.float64))(keys)
    assert ens64["0", "weight"].dtype == torch.float64


# ------------------------------------------------------------------ forward, grads
def test_shared_data_matches_stack_module_state_and_loop():
    nets, block, ens = nets_and_ensemble()
    x = torch.randn(B, 3, dtype=torch.float64)
    td = fd.TensorDict({"x": x}, [B])
    out = fd.vmap(block, in_dims=(0, None))(ens, td)
    assert out.batch_size == torch.Size([N, B])
    params, buffers = stack_module_state(nets)
    base = copy.deepcopy(nets[0]).to("meta")
    ref = torch.func.vmap(
        lambda p, b, x: functional_call(base, (p, b), (x,)), in_dims=(0, 0, None)
    )(params, buffers, x)
    assert_close(out["y"], ref)
    with torch.no_grad():
        assert_close(out["y"], torch.stack([n(x) for n in nets]))


def test_per_member_data_matches_loop():
    nets, block, ens = nets_and_ensemble()
    xs = torch.randn(N, B, 3, dtype=torch.float64)
    td = fd.TensorDict({"x": xs}, [N, B])
    out = fd.vmap(block, in_dims=(0, 0))(ens, td)
    with torch.no_grad():
        assert_close(out["y"], torch.stack([n(xs[i]) for i, n in enumerate(nets)]))


def test_per_member_gradients_match_backward_on_nn_modules():
    nets, block, ens = nets_and_ensemble()
    x = torch.randn(B, 3, dtype=torch.float64)
    target = torch.randn(B, 3, dtype=torch.float64)
    td = fd.TensorDict({"x": x}, [B])

    def loss(p, td):
        return ((block(p, td)["y"] - target) ** 2).mean()

    losses, grads = fd.vmap(fd.value_and_grad(loss), in_dims=(0, None))(ens, td)
    assert grads.batch_size == torch.Size([N])
    for i, net in enumerate(nets):
        ref = ((net(x) - target) ** 2).mean()
        ref.backward()
        assert_close(losses[i], ref.detach())
        assert_close(grads[i], nn_grads(net))
    # the same through stack_module_state + functional_call
    params, buffers = stack_module_state(nets)
    base = copy.deepcopy(nets[0]).to("meta")

    def ref_loss(p, b, x):
        return ((functional_call(base, (p, b), (x,)) - target) ** 2).mean()

    ref_g = torch.func.vmap(torch.func.grad(ref_loss), in_dims=(0, 0, None))(params, buffers, x)
    for pos, a in NAMES.items():
        assert_close(grads[pos, "weight"], ref_g[f"{a}.weight"])
        assert_close(grads[pos, "bias"], ref_g[f"{a}.bias"])


def test_gradient_of_the_ensemble_loss_is_the_sum_of_member_gradients():
    nets, block, ens = nets_and_ensemble()
    x = torch.randn(B, 3, dtype=torch.float64)
    td = fd.TensorDict({"x": x}, [B])

    def ens_loss(ens):
        return fd.vmap(block, in_dims=(0, None))(ens, td)["y"].pow(2).mean(-1).sum()

    g = fd.grad(ens_loss)(ens)
    for i, net in enumerate(nets):
        net(x).pow(2).mean(-1).sum().backward()
        assert_close(g[i], nn_grads(net))


# ------------------------------------------------------------------ dropout
def dropout_block():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 2))
    return fd.Sequential(
        fd.Module(seq[0], ["x"], ["h"]),
        fd.Module(seq[1], ["h"], ["a"]),
        fd.Module(seq[2], ["a"], ["d"]),
        fd.Module(seq[3], ["d"], ["y"]),
    ), seq


def test_dropout_ensemble_each_member_its_own_key():
    block, _seq = dropout_block()
    assert block.random
    ens = fd.vmap(block.init)(fd.random.split(fd.random.key(1), N))
    keys = fd.random.split(fd.random.key(2), N)
    td = fd.TensorDict({"x": torch.randn(B, 3)}, [B])

    def member(p, k, td):
        return block(p, td, key=k)

    out = fd.vmap(member, in_dims=(0, 0, None))(ens, keys, td)  # randomness="error" holds
    loop = fd.stack([block(ens[i], td, key=keys[i]) for i in range(N)])
    assert_close(out, loop)
    masks = out["d"] != 0
    assert not torch.equal(masks[0], masks[1])  # members draw their own masks
    # the same members with the same key: identical masks, so only the weights differ
    same = fd.vmap(member, in_dims=(0, None, None))(ens, keys[0], td)
    assert torch.equal(same["d"][0] != 0, (block(ens[0], td, key=keys[0])["d"] != 0))

    def loss(p, k, td):
        return block(p, td, key=k)["y"].pow(2).mean()

    g = fd.vmap(fd.grad(loss), in_dims=(0, 0, None))(ens, keys, td)
    loop_g = fd.stack([fd.grad(loss)(ens[i], keys[i], td) for i in range(N)])
    assert_close(g, loop_g)


def test_dropout_ensemble_in_eval_mode_matches_nn():
    _block, seq = dropout_block()
    seq.eval()
    eval_block = fd.Sequential(
        *[
            fd.Module(m, [i], [o])
            for m, i, o in zip(seq, ["x", "h", "a", "d"], ["h", "a", "d", "y"])
        ]
    )
    assert not eval_block.random
    params = fd.from_module(eval_block)
    ens = fd.stack([params, params.apply(lambda v: v * 0.5)])
    x = torch.randn(B, 3)
    out = fd.vmap(eval_block, in_dims=(0, None))(ens, fd.TensorDict({"x": x}, [B]))
    with torch.no_grad():
        assert_close(out["y"][0], seq(x))
