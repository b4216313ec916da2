"""Errors a user porting a real model meets, each pointing to the right fix (issue 20)."""

import pytest
import torch
import torch.nn as nn

import functd as fd


class Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3, 3))

    def forward(self, x):
        return x @ self.w


def test_missing_params_of_a_wrapped_torch_module_point_to_from_module_not_init():
    m = fd.Module(Custom(), ["x"], ["y"])
    td = fd.TensorDict({"x": torch.ones(2, 3)}, [2])
    with pytest.raises(TypeError, match=r"params = fd.from_module\(m\) \(the weights") as info:
        m(None, td)
    assert "init" not in str(info.value)  # FunctionalCall has no pure init
    with pytest.raises(KeyError, match=r"Use fd.from_module\(m\) \(the weights") as info:
        m(fd.TensorDict({"v": torch.ones(3, 3)}, []), td)
    assert "init" not in str(info.value)
    lin = fd.Module(nn.Linear(3, 3), ["x"], ["y"])  # lowered: both ways work
    with pytest.raises(TypeError, match=r"fd.from_module\(m\).* or m.init\(fd.random.key\(0\)\)"):
        lin(None, td)
    seq = lin >> m
    with pytest.raises(
        TypeError,
        match=r"seq\(params, td\) with params = fd.from_module\(seq\) \(the weights of the torch modules it wraps\)\.",
    ):
        seq(None, td)


def test_a_shared_leaf_in_a_batched_tensordict_says_to_expand_or_keep_it_out():
    with pytest.raises(
        ValueError,
        match=r"entry 'mask' has shape \[5, 5\].*batch size \[4\].*A leaf shared by every batch "
        r"element.*expand it.*keep it out",
    ):
        fd.TensorDict({"x": torch.randn(4, 5, 8), "mask": torch.ones(5, 5)}, [4])


def test_sparse_gradients_name_the_layer_option():
    emb = nn.Embedding(10, 4, sparse=True)  # not lowered: runs through FunctionalCall
    m = fd.Module(emb, ["i"], ["e"])
    params = fd.from_module(m)
    opt = fd.optim.adam(1e-3)
    step = fd.train_step(lambda p, b, k: m(p, b)["e"].sum(), opt)
    td = fd.TensorDict({"i": torch.tensor([1, 2, 3])}, [3])
    with pytest.raises(
        TypeError,
        match=r"fd.optim.adam.update: grads entry 'weight' is a torch.sparse_coo tensor.*"
        r"sparse=False",
    ):
        step(params, opt.init(params), td, None)


def test_integer_buffers_under_grad_say_to_hold_them_out():
    bn = fd.Module(nn.BatchNorm1d(3).eval(), ["x"], ["y"])
    params = fd.from_module(bn)
    td = fd.TensorDict({"x": torch.randn(4, 3)}, [4])
    with pytest.raises(
        TypeError, match=r"'num_batches_tracked'\] has dtype torch.int64.*Hold it out.*fd.partition"
    ):
        fd.grad(lambda p: bn(p, td)["y"].sum())(params)
    trainable, held = fd.partition(params, fd.trainable(bn))
    g = fd.grad(lambda p: bn(fd.combine(p, held), td)["y"].sum())(trainable)
    assert set(g.keys()) == {"weight", "bias"}


def test_eval_mode_of_a_torch_module_says_to_wrap_it_or_use_eval():
    with pytest.raises(
        TypeError,
        match=r"Custom is a torch module. Wrap it first, fd.nn.eval_mode\(fd.Module\(model",
    ):
        fd.nn.eval_mode(Custom())
