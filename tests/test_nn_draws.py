"""Which torch modules run through FunctionalCall are ``random`` (take a key).

A module in training mode is random only when something in it may draw: a
dropout with p > 0, a forward that calls F.dropout or torch.rand (directly or in
a helper it calls). The reference is what the module does: a module judged not
random gives the same output on every call, one judged random draws.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import functd as fd


def _noise(x):
    return x + torch.randn_like(x)


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return _noise(self.lin(x))  # the draw is in a helper


class DropsByHand(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.lin, self.p = nn.Linear(3, 3), p

    def forward(self, x):
        return F.dropout(self.lin(x), self.p, self.training)


class Attention(nn.Module):  # as HF models call SDPA: the rate is a keyword
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(3, 6)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 1, 2)).permute(1, 2, 0, 3).unbind(0)
        p = 0.5 if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p).flatten(0, 1)


class DropPath(nn.Module):  # timm's / HF's shape: a rate, and Identity-like at 0
    def __init__(self, drop_prob):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        if self.drop_prob == 0.0 or not self.training:  # as timm's drop_path
            return x
        keep = torch.rand(x.shape[0], 1) >= self.drop_prob
        return x * keep / (1 - self.drop_prob)


CASES = {
    "linear_batchnorm": (lambda: nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)), False),
    "dropout_p0": (lambda: nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.0)), False),
    "dropout": (lambda: nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.3)), True),
    "lstm_one_layer_dropout": (lambda: nn.LSTM(3, 3, dropout=0.0), False),
    "lstm_dropout": (lambda: nn.LSTM(3, 3, num_layers=2, dropout=0.3), True),
    "noise_in_a_helper": (Noisy, True),
    "sdpa_dropout_p": (Attention, True),
    "f_dropout_in_forward": (lambda: DropsByHand(0.3), True),
    "drop_path_rate_0": (lambda: nn.Sequential(nn.Linear(3, 3), DropPath(0.0)), False),
    "drop_path": (lambda: nn.Sequential(nn.Linear(3, 3), DropPath(0.3)), True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_module_is_random_when_something_in_it_draws(name):
    build, random = CASES[name]
    net = build()
    outs = ["y", "h", "c"] if "lstm" in name else ["y"]
    m = fd.Module(fd.nn.FunctionalCall(net), ["x"], outs)
    assert m.random is random
    assert fd.nn.eval_mode(m).random is False
    params = fd.nn.state_to_td(net)
    td = fd.TensorDict({"x": torch.randn(4, 2, 3) if "lstm" in name else torch.randn(4, 3)}, [])

    def call(key):
        out = m.apply_with_state(params, td, key=key)[0] if m.stateful else m(params, td, key=key)
        return out["y"]

    if random:
        with pytest.raises(ValueError, match=r"draws random numbers .*Pass a key"):
            call(None)
        assert not torch.equal(call(fd.random.key(0)), call(fd.random.key(1)))
    else:  # no key needed, and the output does not depend on it
        torch.testing.assert_close(call(None), call(fd.random.key(1)), rtol=0, atol=0)
