"""RNN/GRU/LSTM in training: keyed dropout between layers under fd.vmap and fd.grad,
ensembles trained with it, torch RNNs inside a wrapped module, the state's batch dims.

References: a Python loop of the same functd calls (eager CPU calls take torch's
fused op one layer at a time, vmap/grad the loop over time: float64 agrees to
1e-16, checked at 1e-12), torch's own modules and torch.optim where nothing is
random (dropout 0, eval mode, or ``dropout=1``, whose masks are all zeros), and
the stack built by hand from one-layer torch modules with the keyed mask.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_leaves

import functd as fd
import functd.nn as fnn

D = torch.float64
TOL = {"rtol": 1e-12, "atol": 1e-12}

# (kind, kwargs beyond (3, 4)): dropout between layers, every variant the lowering has
DROPPING = [
    ("LSTM", {"num_layers": 3, "dropout": 0.5}),
    ("LSTM", {"num_layers": 2, "dropout": 0.3, "bidirectional": True, "batch_first": True}),
    ("LSTM", {"num_layers": 2, "dropout": 0.3, "proj_size": 2}),
    ("GRU", {"num_layers": 2, "dropout": 0.4, "batch_first": True}),
    ("GRU", {"num_layers": 2, "dropout": 0.4, "bidirectional": True}),
    ("RNN", {"num_layers": 3, "dropout": 0.2, "nonlinearity": "relu"}),
]
IDS = [f"{k}-{'-'.join(f'{a}={b}' for a, b in kw.items())}" for k, kw in DROPPING]


def _torch(kind: str, **kw) -> nn.RNNBase:
    return getattr(nn, kind)(3, 4, **kw).double()


def _x(m: nn.RNNBase | fnn.Layer, n: int = 2, t: int = 5) -> torch.Tensor:
    return torch.randn((n, t, 3) if m.batch_first else (t, n, 3), dtype=D)


def _close(a, b, **tol) -> None:
    for x, y in zip(tree_leaves(a), tree_leaves(b), strict=True):
        torch.testing.assert_close(x, y, **(tol or TOL))


def _member(out, i: int):
    return [t[i] for t in tree_leaves(out)]


def _ensemble(layer: fnn.Layer, n: int = 3):
    ens = fd.vmap(layer.init)(fd.random.split(fd.random.key(7), n))
    return ens.apply(lambda t: t.double())


# ------------------------------------------------------- vmap over keys and params
@pytest.mark.parametrize("kind, kw", DROPPING, ids=IDS)
def test_vmapped_over_keys_equals_a_loop_and_members_differ(kind, kw):
    m = _torch(kind, **kw)
    layer, params, x = fnn.lower(m), fd.from_module(m), _x(m)
    assert layer.random
    keys = fd.random.split(fd.random.key(0), 3)
    out = fd.vmap(lambda k: layer(params, x, key=k))(keys)
    for i in range(3):
        _close(_member(out, i), layer(params, x, key=keys[i]))
    assert not torch.allclose(out[0][0], out[0][1])  # one mask per member key


@pytest.mark.parametrize("kind, kw", DROPPING, ids=IDS)
def test_vmapped_over_params_and_keys_equals_a_loop(kind, kw):
    layer = fnn.lower(_torch(kind, **kw))
    ens, x = _ensemble(layer), _x(layer)
    keys = fd.random.split(fd.random.key(1), 3)
    out = fd.vmap(lambda p, k: layer(p, x, key=k))(ens, keys)
    shared = fd.vmap(lambda p: layer(p, x, key=keys[0]))(ens)  # one key: shared masks
    for i in range(3):
        _close(_member(out, i), layer(ens[i], x, key=keys[i]))
        _close(_member(shared, i), layer(ens[i], x, key=keys[0]))


def test_vmapped_members_are_torchs_layers_with_the_keyed_mask_between():
    """Member i: torch's layer 0, ``bernoulli(split(key_i, 1)[0], 1 - p)`` / (1 - p)
    on its output, torch's layer 1 (and not on layer 1's output)."""
    p = 0.4
    m = _torch("GRU", num_layers=2, dropout=p)
    layer, params, x = fnn.lower(m), fd.from_module(m), _x(m)
    keys = fd.random.split(fd.random.key(3), 3)
    out, h = fd.vmap(lambda k: layer(params, x, key=k))(keys)
    g0, g1 = _torch("GRU"), nn.GRU(4, 4).double()
    for i, g in enumerate((g0, g1)):
        fd.to_module(fd.TensorDict({f"{n}_l0": params[f"{n}_l{i}"] for n in _GRU}, []), g)
    for i in range(3):
        y0, h0 = g0(x)
        keep = fd.random.bernoulli(fd.random.split(keys[i], 1)[0], 1 - p, y0.shape)
        y1, h1 = g1(y0 * (keep.to(D) / (1 - p)))
        _close([out[i], h[i]], [y1, torch.cat([h0, h1])])


_GRU = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_dropout_one_zeroes_the_inputs_between_layers_as_torch(kind):
    """``dropout=1``: every mask is zeros, so torch's own training-mode module is
    deterministic; the last layer's output is not dropped."""
    m = _torch(kind, num_layers=2, dropout=1.0, bidirectional=True).train()
    layer, params, x = fnn.lower(m), fd.from_module(m), _x(m)
    out = fd.vmap(lambda k: layer(params, x, key=k))(fd.random.split(fd.random.key(0), 2))
    ref = m(x)
    assert ref[0].abs().sum() > 0
    for i in range(2):
        _close(_member(out, i), ref)


# ---------------------------------------------------------------------- grads
@pytest.mark.parametrize(
    "kind, kw", [DROPPING[1], DROPPING[2], DROPPING[4]], ids=[IDS[1], IDS[2], IDS[4]]
)
def test_grads_in_training_vmapped_equal_a_loop(kind, kw):
    layer = fnn.lower(_torch(kind, **kw))
    ens, x = _ensemble(layer), _x(layer)
    keys = fd.random.split(fd.random.key(2), 3)

    def loss(p, k):
        return sum(t.square().sum() for t in tree_leaves(layer(p, x, key=k)))

    grads = fd.vmap(fd.grad(loss))(ens, keys)
    for i in range(3):
        fd.testing.assert_close(grads[i], fd.grad(loss)(ens[i], keys[i]), **TOL)


@pytest.mark.parametrize(
    "kind, kw, training",
    [
        ("LSTM", {"num_layers": 2, "bidirectional": True}, True),  # dropout 0
        ("GRU", {"num_layers": 2, "dropout": 0.5, "batch_first": True}, False),  # eval
        ("LSTM", {"num_layers": 2, "dropout": 0.5, "proj_size": 3}, False),
        ("RNN", {"num_layers": 2, "dropout": 0.0}, True),
    ],
)
def test_without_drawing_an_ensemble_gives_torchs_outputs_and_grads(kind, kw, training):
    m = _torch(kind, **kw).train(training)
    layer, x = fnn.lower(m), _x(m)
    assert not layer.random
    ens = _ensemble(layer)

    def loss(p):
        out = layer(p, x)
        return sum(t.sin().sum() for t in tree_leaves(out)), out

    (_, out), grads = fd.vmap(fd.value_and_grad(loss, has_aux=True))(ens)
    names = [n for n, _ in m.named_parameters()]
    for i in range(3):
        fd.to_module(ens[i], m)
        ref = m(x)
        _close(_member(out, i), ref)
        ref_grads = torch.autograd.grad(
            sum(t.sin().sum() for t in tree_leaves(ref)), list(m.parameters())
        )
        _close([grads[i][n] for n in names], ref_grads)


# ------------------------------------------------------------ training ensembles
def _sequence_loss(layer: fnn.Layer, head: fnn.Linear):
    """Next-step regression with a linear head: ``loss(params, batch, key)``."""

    def loss(params, batch, key):
        out = layer(params["rnn"], batch["x"], key=key)[0]
        return (head(params["head"], out) - batch["y"]).square().mean()

    return loss


@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_lstm_gru_ensembles_trained_with_keyed_dropout_equal_a_loop(kind, opt):
    """3 members, 3 steps of ``fd.train_step`` vmapped over (params, opt state, key),
    a fresh key per member and step, against the loop of single-member steps."""
    layer = getattr(fnn, kind)(3, 4, num_layers=2, dropout=0.3, batch_first=True)
    head = fnn.Linear(4, 1)
    keys = fd.random.split(fd.random.key(0), 3)
    ens = fd.TensorDict(
        {"rnn": fd.vmap(layer.init)(keys), "head": fd.vmap(head.init)(keys)}, [3]
    ).apply(lambda t: t.double())
    batch = fd.TensorDict(
        {"x": torch.randn(2, 5, 3, dtype=D), "y": torch.randn(2, 5, 1, dtype=D)}, [2]
    )
    optimizer = fd.optim.sgd(0.5) if opt == "sgd" else fd.optim.adam(0.05)
    step = fd.train_step(_sequence_loss(layer, head), optimizer)
    vstep = fd.vmap(step, in_dims=(0, 0, None, 0))
    state = fd.vmap(optimizer.init)(ens)
    members = [(ens[i], optimizer.init(ens[i])) for i in range(3)]
    for t in range(3):
        step_keys = torch.stack([fd.random.fold_in(k, t) for k in keys])
        ens, state, metrics = vstep(ens, state, batch, step_keys)
        for i in range(3):
            p, s, mi = step(*members[i], batch, fd.random.fold_in(keys[i], t))
            members[i] = (p, s)
            torch.testing.assert_close(metrics["loss"][i], mi["loss"], **TOL)
    for i in range(3):
        fd.testing.assert_close(ens[i], members[i][0], **TOL)
    assert not torch.allclose(ens[0]["rnn", "weight_ih_l1"], ens[1]["rnn", "weight_ih_l1"])


def test_ensemble_without_dropout_trains_as_torch_modules_with_torch_adam():
    m = _torch("LSTM", num_layers=2, bidirectional=True, batch_first=True)
    layer, x, target = fnn.lower(m), _x(m), torch.randn(2, 5, 8, dtype=D)
    ens = _ensemble(layer)
    mods = [_torch("LSTM", num_layers=2, bidirectional=True, batch_first=True) for _ in range(3)]
    opts = []
    for i, mod in enumerate(mods):
        fd.to_module(ens[i], mod)
        opts.append(torch.optim.Adam(mod.parameters(), lr=0.05))
    optimizer = fd.optim.adam(0.05)
    step = fd.vmap(
        fd.train_step(lambda p, b, k: (layer(p, b)[0] - target).square().mean(), optimizer),
        in_dims=(0, 0, None, None),
    )
    state = fd.vmap(optimizer.init)(ens)
    for _ in range(3):
        ens, state, _ = step(ens, state, x, None)
        for mod, o in zip(mods, opts):
            o.zero_grad()
            (mod(x)[0] - target).square().mean().backward()
            o.step()
    for i, mod in enumerate(mods):
        fd.testing.assert_close(ens[i], fd.from_module(mod), rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------ the state's layout
def test_batch_first_state_is_torchs_state_transposed_with_errors_in_its_layout():
    m = _torch("LSTM", num_layers=2, bidirectional=True, batch_first=True)
    layer = dataclasses.replace(fnn.lower(m), batch_first_state=True)
    params, x = fd.from_module(m), _x(m, n=3)
    h, c = torch.randn(3, 4, 4, dtype=D), torch.randn(3, 4, 4, dtype=D)  # (N, layers * D, H)
    out, (hn, cn) = layer(params, x, (h, c))
    ref, (rh, rc) = m(x, (h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous()))
    _close([out, hn, cn], [ref, rh.transpose(0, 1), rc.transpose(0, 1)])
    looped = fd.vmap(lambda p: layer(p, x, (h, c)))(fd.stack([params]))  # the loop path
    _close(_member(looped, 0), [ref, rh.transpose(0, 1), rc.transpose(0, 1)])
    unbatched = layer(params, x[0], (h[0].T.contiguous(), c[0].T.contiguous()))
    assert unbatched[1][0].shape == (4, 4)  # (layers * D, H): no batch dim to move
    with pytest.raises(
        ValueError,
        match=r"LSTM: Expected hidden\[0\] size \(3, 4, 4\) \(batch_first_state=True: batch "
        r"first\), got \[4, 3, 4\]",
    ):
        layer(params, x, (h.transpose(0, 1), c))


def test_batch_first_state_in_a_tensordict_stacks_members_in_front_under_vmap():
    """With the batch dim in front the state lives in the batch's TensorDict (batch
    dims [N]); an ensemble of 3 vmapped over members returns it as
    ``(members, N, layers, hidden)``, the same for dropout's keyed training."""
    m = _torch("GRU", num_layers=2, dropout=0.3, batch_first=True)
    layer = dataclasses.replace(fnn.lower(m), batch_first_state=True)
    mod = fd.Module(layer, ["x", "h"], ["y", "h"])
    ens = _ensemble(layer)
    td = fd.TensorDict({"x": _x(m, n=5), "h": torch.randn(5, 2, 4, dtype=D)}, [5])
    keys = fd.random.split(fd.random.key(4), 3)
    out = fd.vmap(lambda p, k: mod(p, td, key=k), in_dims=(0, 0))(ens, keys)
    assert out.batch_size == (3, 5) and out["h"].shape == (3, 5, 2, 4)
    ev = fd.vmap(fnn.eval_mode(mod), in_dims=(0, None))(ens, td)
    for i in range(3):
        fd.testing.assert_close(out[i], mod(ens[i], td, key=keys[i]), **TOL)
        fd.to_module(ens[i], m.eval())
        y, h = m(td["x"], td["h"].transpose(0, 1).contiguous())
        _close([ev["y"][i], ev["h"][i]], [y, h.transpose(0, 1)])


# --------------------------------------------- torch RNNs inside a wrapped module
class _Net(nn.Module):
    """A model functd cannot lower (its own forward): runs as a FunctionalCall."""

    def __init__(self, kind: str = "LSTM", **kw) -> None:
        super().__init__()
        kw = {"num_layers": 3, "dropout": 0.5, **kw}
        self.rnn = getattr(nn, kind)(3, 4, batch_first=True, **kw)
        self.head = nn.Linear(self.rnn.proj_size or 4 * (1 + self.rnn.bidirectional), 1)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


WRAPPED = [
    ("LSTM", {}),
    ("LSTM", {"num_layers": 2, "proj_size": 2}),
    ("GRU", {"num_layers": 2, "bidirectional": True}),
    ("RNN", {"nonlinearity": "relu"}),
]


@pytest.mark.parametrize("kind, kw", WRAPPED, ids=[f"{k}-{kw}" for k, kw in WRAPPED])
def test_torch_rnn_in_a_wrapped_module_vmaps_and_grads_in_training(kind, kw):
    net = _Net(kind, **kw).double()
    mod = fd.Module(net, ["x"], ["y"])
    params, td = fd.from_module(mod), fd.TensorDict({"x": _x(net.rnn)}, [2])
    keys = fd.random.split(fd.random.key(5), 3)

    def loss(p, k):
        return mod(p, td, key=k)["y"].square().sum()

    ens = fd.stack([params.apply(lambda t, i=i: t * (1 + 0.1 * i)) for i in range(3)])
    by_key = fd.vmap(lambda k: mod(params, td, key=k)["y"])(keys)
    grads = fd.vmap(fd.grad(loss))(ens, keys)
    for i in range(3):  # the loop's eager calls take torch's fused op, layer by layer
        torch.testing.assert_close(by_key[i], mod(params, td, key=keys[i])["y"], **TOL)
        fd.testing.assert_close(grads[i], fd.grad(loss)(ens[i], keys[i]), **TOL)
    assert not torch.allclose(by_key[0], by_key[1])


def test_torch_gru_without_dropout_in_a_wrapped_module_vmaps_as_torch():
    """In training mode with dropout 0 the whole stack runs functd's loop under vmap;
    each member equals torch's module with its weights."""
    net = _Net("GRU", num_layers=2, dropout=0.0, bidirectional=True).double()
    mod = fd.Module(net, ["x"], ["y"])
    params, td = fd.from_module(mod), fd.TensorDict({"x": _x(net.rnn)}, [2])
    ens = fd.stack([params.apply(lambda t, i=i: t * (1 + 0.1 * i)) for i in range(3)])
    out = fd.vmap(lambda p: mod(p, td)["y"])(ens)
    for i in range(3):
        fd.to_module(ens[i], net)
        torch.testing.assert_close(out[i], net(td["x"]), **TOL)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torch_rnn_in_a_wrapped_module_vmaps_over_params_in_eval_mode(kind):
    """Eval mode too: the RNN inside a module functd cannot lower runs functd's loop
    under vmap (torch's fused op has no batching rule); each member equals torch's."""
    net = _Net(kind).double().eval()
    mod = fd.Module(net, ["x"], ["y"])
    params, td = fd.from_module(mod), fd.TensorDict({"x": _x(net.rnn)}, [2])
    ens = fd.stack([params.apply(lambda t, i=i: t * (1 + 0.1 * i)) for i in range(3)])
    out = fd.vmap(lambda p: mod(p, td)["y"])(ens)
    assert not mod.random
    for i in range(3):
        fd.to_module(ens[i], net)
        torch.testing.assert_close(out[i], net(td["x"]), **TOL)


class _Packed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(3, 4, num_layers=2, dropout=0.3, batch_first=True)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, True, enforce_sorted=False)
        return nn.utils.rnn.pad_packed_sequence(self.gru(packed)[0], batch_first=True)[0]


def test_torch_rnn_on_a_packed_sequence_under_vmap_raises_the_way_around():
    mod = fd.Module(_Packed(), ["x", "lengths"], ["y"])
    params = fd.from_module(mod)
    td = fd.TensorDict({"x": torch.randn(2, 5, 3), "lengths": torch.tensor([5, 3])}, [])
    assert mod(params, td, key=fd.random.key(0))["y"].shape == (2, 5, 4)  # eager: torch's op
    keys = fd.random.split(fd.random.key(0), 2)
    with pytest.raises(
        NotImplementedError,
        match=r"FunctionalCall\(_Packed\): nn.GRU on a PackedSequence cannot run under vmap.*"
        r"pad_packed_sequence",
    ):
        fd.vmap(lambda k: mod(params, td, key=k))(keys)


def test_a_state_with_the_batch_dim_second_names_batch_first_state_and_that_fix_works():
    """fd.Module(nn.LSTM) writing (h, c) into a batched tensordict: the error points to
    batch_first_state, and the layer it names takes the same params and fits the td."""
    import dataclasses

    lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True).double()
    m = fd.Module(lstm, ["x"], ["y", "h", "c"])
    params = fd.from_module(m)
    td = fd.TensorDict({"x": torch.randn(5, 7, 3, dtype=D)}, [5])
    with pytest.raises(
        ValueError, match=r"output 'h' has shape \[2, 5, 4\].*batch_first_state=True"
    ):
        m(params, td)
    fixed = fd.Module(
        dataclasses.replace(fd.nn.lower(lstm), batch_first_state=True), ["x"], ["y", "h", "c"]
    )
    out = fixed(params, td)
    y, (h, c) = lstm(td["x"])
    torch.testing.assert_close(out["y"], y, **TOL)
    torch.testing.assert_close(out["h"], h.transpose(0, 1), **TOL)
    torch.testing.assert_close(out["c"], c.transpose(0, 1), **TOL)
