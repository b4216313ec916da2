"""Bad input to modules gets a clear error, and nothing given is changed."""

import pytest
import torch
import torch.nn as nn

import functd as fd


def _snap(*trees):
    return [(fd.tree.structure(t), [(id(v), v.clone()) for v in fd.tree.leaves(t)]) for t in trees]


def _unchanged(snap, *trees):
    for (spec, leaves), t in zip(snap, trees):
        assert fd.tree.structure(t) == spec
        for (i, v), leaf in zip(leaves, fd.tree.leaves(t)):
            assert id(leaf) == i and torch.equal(leaf, v)


@pytest.fixture
def lin():
    m = fd.Module(nn.Linear(3, 4), ["x"], ["h"])
    return m, m.init(0)


def test_missing_input_key_names_module_key_and_present_keys(lin):
    m, params = lin
    td = fd.TensorDict({"obs": torch.zeros(2, 3), "h0": torch.zeros(2, 4)}, [2])
    snap = _snap(params, td)
    with pytest.raises(
        KeyError,
        match=r"Module\(Linear -> 'h'\) reads 'x', which the tensordict lacks; it has: 'obs', 'h0'",
    ):
        m(params, td)
    _unchanged(snap, params, td)


def test_wrong_number_of_outputs():
    m = fd.Module(lambda x: (x, x, x), ["x"], ["a", "b"])
    td = fd.TensorDict({"x": torch.zeros(2)}, [2])
    snap = _snap(td)
    with pytest.raises(ValueError, match=r"returned 3 output\(s\) but out_keys has 2"):
        m(None, td)
    _unchanged(snap, td)


def test_output_not_a_tensor():
    m = fd.Module(lambda x: 3.0, ["x"], ["y"])
    td = fd.TensorDict({"x": torch.zeros(2)}, [2])
    with pytest.raises(TypeError, match="output 'y' is a float, not a tensor"):
        m(None, td)


def test_output_losing_batch_dims():
    m = fd.Module(lambda x: x.sum(), ["x"], ["y"])
    td = fd.TensorDict({"x": torch.zeros(2, 3)}, [2])
    with pytest.raises(
        ValueError,
        match=r"output 'y' has shape \[\], which does not start with the batch size \[2\]",
    ):
        m(None, td)


def test_duplicate_out_keys():
    with pytest.raises(ValueError, match="out_keys has duplicates: 'a'"):
        fd.Module(lambda x: (x, x), ["x"], ["a", "a"])


def test_params_missing_entry(lin):
    m, params = lin
    bad = params.exclude("bias")
    td = fd.TensorDict({"x": torch.zeros(2, 3)}, [2])
    snap = _snap(bad, td)
    with pytest.raises(KeyError, match="missing 'bias'"):
        m(bad, td)
    _unchanged(snap, bad, td)


def test_params_wrong_shape(lin):
    m, params = lin
    bad = params.set("bias", torch.zeros(1))
    td = fd.TensorDict({"x": torch.zeros(2, 3)}, [2])
    snap = _snap(bad, td)
    with pytest.raises(ValueError, match=r"params entry 'bias' has shape \[1\], expected \[4\]"):
        m(bad, td)
    _unchanged(snap, bad, td)


def test_params_of_another_module(lin):
    m, _ = lin
    other = fd.Module(nn.GRUCell(3, 4), ["x"], ["h"]).init(0)
    td = fd.TensorDict({"x": torch.zeros(2, 3)}, [2])
    with pytest.raises(KeyError, match="another module"):
        m(other, td)
    seq = fd.Sequential(m, fd.Module(torch.relu, ["h"], ["a"]))
    with pytest.raises(KeyError, match="params lack entry '0'"):
        seq(fd.TensorDict({"5": other}), td)


def test_calling_without_params(lin):
    m, _ = lin
    td = fd.TensorDict({"x": torch.zeros(2, 3)}, [2])
    with pytest.raises(TypeError, match="has parameters but was given nothing as params"):
        m(None, td)
    with pytest.raises(TypeError, match="takes \\(params, td\\); got one TensorDict"):
        m(td)
    seq = fd.Sequential(m)
    with pytest.raises(TypeError, match="has parameters but was given nothing"):
        seq(None, td)


def test_keyword_call_unknown_or_missing_names(lin):
    m, params = lin
    with pytest.raises(TypeError, match=r"unknown name\(s\) \['y'\] and lacks \['x'\]"):
        m(params, y=torch.zeros(2, 3))


def test_lambda_arity_differs_from_in_keys():
    with pytest.raises(
        TypeError, match=r"takes 2 positional argument\(s\) \(x, y\) but in_keys has 1"
    ):
        fd.Module(lambda x, y: x + y, ["x"], ["z"])


def test_non_module_in_sequential():
    with pytest.raises(TypeError, match="Wrap functions and torch modules with"):
        fd.Sequential(torch.relu)


def test_bad_keys():
    with pytest.raises(TypeError, match="keys are str or non-empty tuples of str"):
        fd.Module(torch.relu, [3], ["y"])
    with pytest.raises(KeyError, match="empty tuple"):
        fd.Module(torch.relu, [()], ["y"])


def test_from_module_of_pure_layer_module():
    m = fd.Module(fd.nn.Linear(3, 4), ["x"], ["h"])
    with pytest.raises(TypeError, match=r"holds no weights; create them with m\.init"):
        fd.from_module(m)


@pytest.mark.parametrize(
    "make",
    [
        lambda: fd.Module(torch.neg, ["x"], ["y"]),
        lambda: fd.Sequential(fd.Module(torch.neg, ["x"], ["y"])),
        lambda: fd.Probabilistic({"x": "loc", "s0": "scale"}, ["s"], torch.distributions.Normal),
        lambda: fd.ProbabilisticSequential(
            fd.Module(torch.abs, ["x"], ["scale"]),
            fd.Probabilistic({"x": "loc", "scale": "scale"}, ["s"], torch.distributions.Normal),
        ),
    ],
)
def test_every_module_kind_refuses_a_td_and_keyword_tensors_together(make):
    m = make()
    td = fd.TensorDict({"x": torch.ones(2)}, [2])
    x = torch.ones(2)
    with pytest.raises(TypeError, match=r"pass either a TensorDict or keyword tensors, not both"):
        m(None, td, x=x)
    with pytest.raises(TypeError, match=r"the second argument must be a TensorDict, got dict"):
        m(None, {"x": x})
    assert torch.equal(td["x"], torch.ones(2)) and torch.equal(x, torch.ones(2))
