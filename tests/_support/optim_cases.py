"""Shared fixtures of the optimizer tests: a small float64 model, its pure twin,
data, and the registry of optimizers with their torch.optim counterparts."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import functd as fd

DT = torch.float64


def make_net(seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).to(DT)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=DT) * 0.5)
    return net


def forward(p: fd.TensorDict, x: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(F.linear(x, p["0", "weight"], p["0", "bias"]))
    return F.linear(h, p["2", "weight"], p["2", "bias"])


def data(n: int = 32, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=DT)
    y = torch.stack([torch.sin(x[:, 0]) + x[:, 1] ** 2, x[:, 2]], -1)
    return x, y


def loss_fn(p: fd.TensorDict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((forward(p, x) - y) ** 2).mean()


def grads(p, x, y):
    return torch.func.grad(loss_fn)(p, x, y)


# name -> (functd factory, torch.optim factory or None)
CASES = {
    "sgd": (lambda: fd.optim.sgd(0.05), lambda ps: torch.optim.SGD(ps, 0.05)),
    "sgd_momentum": (
        lambda: fd.optim.sgd(0.05, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, 0.05, momentum=0.9),
    ),
    "sgd_dampening_wd": (
        lambda: fd.optim.sgd(0.05, momentum=0.9, dampening=0.3, weight_decay=0.1),
        lambda ps: torch.optim.SGD(ps, 0.05, momentum=0.9, dampening=0.3, weight_decay=0.1),
    ),
    "sgd_nesterov_wd": (
        lambda: fd.optim.sgd(0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
        lambda ps: torch.optim.SGD(ps, 0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
    ),
    "adam": (lambda: fd.optim.adam(1e-2), lambda ps: torch.optim.Adam(ps, 1e-2)),
    "adam_wd": (
        lambda: fd.optim.adam(1e-2, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.1),
        lambda ps: torch.optim.Adam(ps, 1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    ),
    "adam_amsgrad": (
        lambda: fd.optim.adam(1e-2, amsgrad=True, weight_decay=0.05),
        lambda ps: torch.optim.Adam(ps, 1e-2, amsgrad=True, weight_decay=0.05),
    ),
    "adamw": (lambda: fd.optim.adamw(1e-2), lambda ps: torch.optim.AdamW(ps, 1e-2)),
    "adamw_amsgrad": (
        lambda: fd.optim.adamw(1e-2, weight_decay=0.1, amsgrad=True),
        lambda ps: torch.optim.AdamW(ps, 1e-2, weight_decay=0.1, amsgrad=True),
    ),
    "rmsprop": (lambda: fd.optim.rmsprop(1e-2), lambda ps: torch.optim.RMSprop(ps, 1e-2)),
    "rmsprop_momentum_wd": (
        lambda: fd.optim.rmsprop(1e-2, alpha=0.9, momentum=0.5, weight_decay=0.1),
        lambda ps: torch.optim.RMSprop(ps, 1e-2, alpha=0.9, momentum=0.5, weight_decay=0.1),
    ),
    "rmsprop_centered": (
        lambda: fd.optim.rmsprop(1e-2, centered=True, momentum=0.3),
        lambda ps: torch.optim.RMSprop(ps, 1e-2, centered=True, momentum=0.3),
    ),
    "adagrad": (lambda: fd.optim.adagrad(0.1), lambda ps: torch.optim.Adagrad(ps, 0.1)),
    "adagrad_options": (
        lambda: fd.optim.adagrad(
            0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.2, eps=1e-6
        ),
        lambda ps: torch.optim.Adagrad(
            ps, 0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.2, eps=1e-6
        ),
    ),
    "lion": (lambda: fd.optim.lion(1e-3, weight_decay=0.5), None),
}


def optax_tree(d):
    """An optax test's params/updates tree as a TensorDict of batch size []: dicts nest,
    lists and tuples become entries "0", "1"..., numbers become tensors."""

    def conv(v):
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return {str(i): conv(x) for i, x in enumerate(v)}
        return torch.as_tensor(v)

    return fd.TensorDict(conv(d), [])
