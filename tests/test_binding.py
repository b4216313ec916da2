"""A dict in_keys binds td entries to arguments by name, for every kind of callable.

Torch modules (lowered or run through FunctionalCall) bind to their ``forward``'s
names, functd layers to their ``__call__``'s, functions to their own; the mapping
may be written in any order. Checked against the torch module's own keyword call.
"""

import itertools

import pytest
import torch
import torch.nn as nn

import functd as fd


class ThreeInputs(nn.Module):
    """Not lowered: runs through FunctionalCall; arguments of different roles."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, a, b=None, c=None, scale=1.0):
        out = self.lin(a) * scale
        if b is not None:
            out = out + 2 * b
        if c is not None:
            out = out - 3 * c
        return out


def _td(**tensors):
    return fd.TensorDict(tensors, [4])


A, B, C = (torch.randn(4, 3, generator=torch.Generator().manual_seed(i)) for i in range(3))


@pytest.mark.parametrize("order", list(itertools.permutations(["a", "b", "c"])))
def test_fallback_module_binds_by_forward_name_in_any_order(order):
    net = ThreeInputs()
    names = {"a": "ka", "b": "kb", "c": "kc"}
    m = fd.Module(net, {names[n]: n for n in order}, ["y"])
    out = m(fd.from_module(m), _td(ka=A, kb=B, kc=C))["y"]
    torch.testing.assert_close(out, net(a=A, b=B, c=C))


def test_fallback_module_binds_a_subset_and_keeps_forward_defaults():
    net = ThreeInputs()
    m = fd.Module(net, {"kc": "c", "ka": "a"}, ["y"])
    torch.testing.assert_close(m(fd.from_module(m), _td(ka=A, kc=C))["y"], net(a=A, c=C))


def test_lowered_multihead_attention_binds_torch_names_including_key():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    q, k, v = (torch.randn(4, 5, 8) for _ in range(3))
    mask = torch.zeros(4, 5, dtype=torch.bool)
    mask[0, 3:] = True
    m = fd.Module(
        mha,
        {"pad": "key_padding_mask", "v": "value", "k": "key", "q": "query"},
        ["o", "w"],
    )
    assert isinstance(m.fn, fd.nn.MultiheadAttention)  # lowered, bound to positions
    out = m(fd.from_module(m), _td(q=q, k=k, v=v, pad=mask))
    ref_o, ref_w = mha(query=q, key=k, value=v, key_padding_mask=mask)
    torch.testing.assert_close(out["o"], ref_o)
    torch.testing.assert_close(out["w"], ref_w)
    # a later argument with the default of the ones before it (need_weights=True)
    m2 = fd.Module(
        mha, {"q": "query", "k": "key", "v": "value", "nw": "average_attn_weights"}, ["o", "w"]
    )
    assert m2._desc.fn.defaults[4] is True  # need_weights: torch's default


def test_lowered_linear_binds_torchs_input_name():
    lin = nn.Linear(3, 2)
    m = fd.Module(lin, {"obs": "input"}, ["y"])
    torch.testing.assert_close(m(fd.from_module(m), _td(obs=A))["y"], lin(input=A))


def test_functd_layer_binds_its_own_call_names():
    layer = fd.nn.MultiheadAttention(8, 2, batch_first=True)
    params = layer.init(fd.random.key(0))
    q, k = torch.randn(4, 5, 8), torch.randn(4, 5, 8)
    m = fd.Module(layer, {"kk": "key_", "vv": "value", "qq": "query"}, ["o", "w"])
    out = m(params, _td(qq=q, kk=k, vv=k))
    ref = layer(params, q, k, k)
    torch.testing.assert_close(out["o"], ref[0])


def test_functions_bind_by_name():
    m = fd.Module(lambda x, y: x - y, {"b": "y", "a": "x"}, ["d"])
    torch.testing.assert_close(m(None, _td(a=A, b=B))["d"], A - B)


def test_tensordicts_out_to_in_map_binds_the_same():
    net = ThreeInputs()
    m = fd.Module(net, {"c": "kc", "a": "ka"}, ["y"], out_to_in_map=True)
    torch.testing.assert_close(m(fd.from_module(m), _td(ka=A, kc=C))["y"], net(a=A, c=C))


def test_binding_errors_name_the_module_the_argument_and_the_fix():
    with pytest.raises(
        TypeError,
        match=r"Module\(Linear -> 'y'\): in_keys names the argument\(s\) \['x'\], which Linear.forward does not take; its arguments are \['input'\]",
    ):
        fd.Module(nn.Linear(3, 2), {"obs": "x"}, ["y"])
    with pytest.raises(
        TypeError,
        match=r"ThreeInputs.forward does not take; its arguments are \['a', 'b', 'c', 'scale'\]",
    ):
        fd.Module(ThreeInputs(), {"obs": "d"}, ["y"])
    with pytest.raises(
        TypeError,
        match=r"MultiheadAttention.forward needs its argument 'key', which in_keys does not give",
    ):
        fd.Module(nn.MultiheadAttention(8, 2), {"q": "query", "v": "value"}, ["o", "w"])
    with pytest.raises(ValueError, match=r"gives the argument\(s\) \['x'\] more than one td key"):
        fd.Module(lambda x: x, {"a": "x", "b": "x"}, ["y"])


def test_an_entry_named_key_works_with_a_tensordict_and_positionally():
    m = fd.Module(lambda key, x: key * x, ["key", "x"], ["y"])
    td = _td(key=A, x=B)
    torch.testing.assert_close(m(None, td)["y"], A * B)
    torch.testing.assert_close(m(None, A, B), A * B)
    with pytest.raises(
        TypeError,
        match=r"reads the entry 'key', whose keyword key= is also the call option key=.*fd.TensorDict",
    ):
        m(None, key=A, x=B)


def test_labels_name_the_torch_class():
    m = fd.Module(ThreeInputs(), ["a"], ["y"])
    assert m._label() == "Module(ThreeInputs -> 'y')"
    with pytest.raises(KeyError, match=r"Module\(ThreeInputs -> 'y'\) reads 'a'"):
        m(fd.from_module(m), _td(b=A))


def test_keyword_bound_module_under_vmap_grad_and_eval_switch():
    net = ThreeInputs()
    m = fd.Module(net, {"kc": "c", "ka": "a"}, ["y"])
    params = fd.from_module(m)
    ens = fd.stack([params, params.apply(lambda t: t * 2)])
    out = fd.vmap(m, in_dims=(0, None))(ens, _td(ka=A, kc=C))["y"]
    torch.testing.assert_close(out[1], m(ens[1], _td(ka=A, kc=C))["y"])
    g = fd.grad(lambda p: m(p, _td(ka=A, kc=C))["y"].sum())(params)
    net.zero_grad()
    net(a=A, c=C).sum().backward()
    torch.testing.assert_close(g["lin", "weight"], net.lin.weight.grad)
    e = fd.nn.eval_mode(m)
    assert e._kwargs == m._kwargs and e.in_keys == m.in_keys
    torch.testing.assert_close(e(params, _td(ka=A, kc=C))["y"], net(a=A, c=C))


def test_keyword_bound_module_inside_a_sequential_plan():
    net = ThreeInputs()
    m = fd.Module(net, {"kc": "c", "ka": "a"}, ["y"])
    seq = m >> fd.Module(torch.tanh, ["y"], ["z"])
    params = fd.from_module(seq)
    for _ in range(2):  # the second call runs the cached plan
        out = seq(params, _td(ka=A, kc=C))
        torch.testing.assert_close(out["z"], torch.tanh(net(a=A, c=C)))


def test_lstm_outputs_flatten_onto_out_keys():
    """nn.LSTM returns (output, (h_n, c_n)): three out_keys take the three tensors."""
    lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True)
    m = fd.Module(lstm, ["x"], ["out", "h", "c"])
    x = torch.randn(5, 7, 3)
    out = m(fd.from_module(m), fd.TensorDict({"x": x}, []))
    ref_out, (ref_h, ref_c) = lstm(x)
    torch.testing.assert_close(out["out"], ref_out)
    torch.testing.assert_close(out["h"], ref_h)
    torch.testing.assert_close(out["c"], ref_c)
    # h_n, c_n are (layers, N, H): a batched td takes the selected output only
    sel = m.select_out_keys("out")(fd.from_module(m), fd.TensorDict({"x": x}, [5]))
    torch.testing.assert_close(sel["out"], ref_out)


def test_from_module_of_a_lowered_layer_points_to_the_torch_module():
    net = nn.Sequential(nn.Linear(3, 3), nn.Softmin(-1))
    with pytest.raises(TypeError, match=r"Pass the torch module itself, fd.Module\(net"):
        fd.from_module(fd.Module(fd.nn.lower(net, fallback=True), ["x"], ["y"]))
